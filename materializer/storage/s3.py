"""An S3 prefix (``s3://bucket/prefix`` or ``s3a://bucket/prefix``) as a store, through boto3.

Credentials, region and endpoint follow the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, …), exactly as
boto3 reads them; :func:`materializer.spark.s3a_conf` gives Spark's s3a the same settings, so the
Python side and the executors see the same bucket.

Exclusive publication is S3's conditional write: ``put_object(IfNoneMatch="*")`` creates the key
only if it does not exist, atomically on the server, and answers 412 Precondition Failed otherwise.
A PUT is visible whole or not at all, so a reader never sees half an entry.

Errors: botocore's own retry ("standard" mode unless ``AWS_RETRY_MODE`` says otherwise) retries
throttling, 5xx and dropped connections with backoff. What is still failing after that is raised as
:class:`~materializer.errors.StorageError`, classified ``transient`` (a later retry may succeed:
throttling, 5xx, network) or not (missing bucket, denied access, bad request). Idempotent calls get
a few more attempts of our own with backoff, so a short outage does not end a long run.
"""

from __future__ import annotations

import io
import os
import random
import threading
import time
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from materializer import redact
from materializer.errors import StorageError
from materializer.storage import FileInfo, Store, check_relative

if TYPE_CHECKING:
    from botocore.client import BaseClient as S3Client

T = TypeVar("T")

SCHEMES = ("s3", "s3a")
# Our own attempts on top of botocore's, for idempotent calls only.
ATTEMPTS = 4
BACKOFF_SECONDS = 0.25
MAX_BACKOFF_SECONDS = 5.0
DELETE_BATCH = 1000  # DeleteObjects takes at most 1000 keys per request

# Error codes (and HTTP statuses) that say "try again later", not "this cannot work".
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "ConditionalRequestConflict",  # 409: a concurrent conditional write to the key is in flight
        "OperationAborted",
    }
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})


def parse_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> (``bucket``, ``some/prefix``)."""
    parsed = urlparse(uri)
    if parsed.scheme not in SCHEMES or not parsed.netloc:
        raise StorageError(f"{uri!r} is not an S3 URI: expected s3://bucket/prefix (or s3a://bucket/prefix)")
    return parsed.netloc, parsed.path.strip("/")


def _timestamp(value: Any) -> float | None:
    """A listing's ``LastModified`` (boto3 gives an aware datetime) as Unix seconds; None if absent."""
    return value.timestamp() if hasattr(value, "timestamp") else None


def _error_code(exc: BaseException) -> tuple[str, int | None]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status


def _retry_attempts(exc: BaseException) -> int:
    """How many times botocore retried the request before this error (0: it was sent once)."""
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)


def is_transient(exc: BaseException) -> bool:
    """Whether a later retry of the same call may succeed."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError as BotoConnectionError,
        HTTPClientError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    if isinstance(exc, (BotoConnectionError, HTTPClientError, ReadTimeoutError, ResponseStreamingError, IncompleteReadError)):
        return True
    if isinstance(exc, ClientError):
        code, status = _error_code(exc)
        return code in TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429))
    return isinstance(exc, (ConnectionError, TimeoutError))


def _backoff(attempt: int) -> float:
    # Full jitter (AWS's recommendation): writers that failed together do not retry together.
    return random.uniform(0, min(MAX_BACKOFF_SECONDS, BACKOFF_SECONDS * 2**attempt))


# One client per process and AWS environment: making a client costs ~0.1 s and clients are
# thread-safe, while stores are opened per source batch.
_CLIENTS: dict[tuple[Any, ...], "S3Client"] = {}
_CLIENTS_LOCK = threading.Lock()
_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_RETRY_MODE",
    "AWS_MAX_ATTEMPTS",
)


def shared_client() -> "S3Client":
    """The process's client for the current AWS environment."""
    key = (os.getpid(),) + tuple(os.environ.get(k) for k in _ENV_KEYS)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = make_client()
        return client


def make_client() -> "S3Client":
    """A new boto3 S3 client configured from the standard AWS environment."""
    import boto3
    from botocore.config import Config

    retries: dict[str, Any] = {"mode": os.environ.get("AWS_RETRY_MODE", "standard")}
    if "AWS_MAX_ATTEMPTS" not in os.environ:
        retries["max_attempts"] = 5
    s3_settings: dict[str, Any] = {}
    if os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"):
        # Custom endpoints (MinIO, moto, a gateway) rarely resolve bucket subdomains: use paths,
        # as s3a_conf() does for Spark.
        s3_settings["addressing_style"] = "path"
    config = Config(retries=retries, s3=s3_settings or None, connect_timeout=10, read_timeout=60)
    session = boto3.session.Session()
    region = session.region_name or "us-east-1"
    # boto3 reads AWS_ENDPOINT_URL(_S3) itself; nothing to pass for the endpoint.
    return session.client("s3", region_name=region, config=config)


class _BodyReader(io.RawIOBase):
    """A raw stream over a botocore StreamingBody, so io.BufferedReader can yield lines."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._body.close()
        finally:
            super().close()


class S3Store(Store):
    """A flat namespace of objects under ``s3://bucket/prefix``."""

    def __init__(self, uri: str, *, client: "S3Client | None" = None) -> None:
        self.bucket, self.prefix = parse_uri(uri)
        scheme = urlparse(uri).scheme
        self.uri = f"{scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._client = client

    @property
    def client(self) -> "S3Client":
        # Made on first use: opening a store (e.g. for `--help` or config checks) needs no AWS.
        if self._client is None:
            self._client = shared_client()
        return self._client

    # --- names ---

    def _key(self, path: str) -> str:
        path = path.strip("/")
        if not self.prefix:
            return path
        return f"{self.prefix}/{path}" if path else self.prefix

    def _relative(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def spark_path(self, path: str) -> str:
        # Spark reads and writes S3 through Hadoop's s3a connector, whatever scheme the config used.
        return f"s3a://{self.bucket}/{self._key(path)}"

    def _where(self, path: str) -> str:
        return f"s3://{self.bucket}/{self._key(path)}"

    # --- error handling ---

    def _error(self, action: str, path: str, exc: BaseException) -> StorageError:
        code, status = _error_code(exc)
        transient = is_transient(exc)
        detail = f"{code or type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {exc}"
        if code == "NoSuchBucket":
            advice = f"create the bucket {self.bucket!r} or fix the URI in the configuration"
        elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "403"):
            advice = "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the instance role) and the bucket policy"
        elif transient:
            advice = "S3 kept failing after retries; nothing was half-written, so running again resumes where this run stopped"
        else:
            advice = "the request was rejected; fix the cause and run again"
        # botocore's message quotes the endpoint URL, user:password@ and all (docs: 'Secrets').
        return StorageError(redact.text(f"S3 {action} {self._where(path)} failed: {detail}. {advice}"), transient=transient)

    def _call(self, action: str, path: str, fn: Callable[[], T], *, idempotent: bool = True) -> T:
        """Run one S3 call; retry transient failures of idempotent calls, classify what remains."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        attempts = ATTEMPTS if idempotent else 1
        for attempt in range(attempts):
            try:
                return fn()
            except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
                if isinstance(exc, S3UploadFailedError) and exc.__context__ is not None:
                    # boto3's transfer manager wraps the real error; classify that one.
                    exc = exc.__context__  # type: ignore[assignment]
                if attempt + 1 < attempts and is_transient(exc):
                    time.sleep(_backoff(attempt))
                    continue
                raise self._error(action, path, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    # --- the Store interface ---

    def put_if_absent(self, path: str, data: bytes, *, before_publish: Callable[[], None] | None = None) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(path)
        # On S3 the bytes become durable and visible in the same PUT: there is no "written but not
        # published" state. The crash window before_publish marks is therefore "the entry is
        # complete in memory, the PUT not sent": a crash there publishes nothing, as locally.
        if before_publish is not None:
            before_publish()
        sent = 0
        for attempt in range(ATTEMPTS):
            try:
                sent += 1
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except (ClientError, BotoCoreError) as exc:
                code, status = _error_code(exc)
                if code in PRECONDITION_CODES or status == 412:
                    # The key exists. If an earlier attempt of this very call may have landed (its
                    # answer lost, then retried by botocore or by us), the object may be ours:
                    # entries carry a random writer id, so equal bytes mean we wrote it.
                    if sent > 1 or _retry_attempts(exc) > 0:
                        try:
                            if self.get(path) == data:
                                return True
                        except FileNotFoundError:  # pragma: no cover - deleted meanwhile
                            pass
                    return False
                # 409 ConditionalRequestConflict: another conditional PUT of the key is in flight;
                # retry, and the answer (201 or 412) says who won. Network errors: the same PUT
                # is safe to repeat, since it can create the key at most once.
                if attempt + 1 < ATTEMPTS and is_transient(exc):
                    time.sleep(_backoff(attempt))
                    continue
                raise self._error("conditional PUT of", path, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, path: str) -> bytes:
        def fetch() -> bytes:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
            except Exception as exc:  # noqa: BLE001 - re-raised below unless it is a 404
                if _error_code(exc)[0] in NOT_FOUND_CODES:
                    raise FileNotFoundError(self._where(path)) from None
                raise
            return response["Body"].read()

        return self._call("GET", path, fetch)

    def open_read(self, path: str, offset: int = 0) -> BinaryIO:
        def fetch() -> BinaryIO:
            args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(path)}
            if offset:
                # A ranged GET: resuming a large source file does not re-download its start.
                args["Range"] = f"bytes={offset}-"
            try:
                response = self.client.get_object(**args)
            except Exception as exc:  # noqa: BLE001 - re-raised below unless it is a 404 or 416
                code, status = _error_code(exc)
                if code in NOT_FOUND_CODES:
                    raise FileNotFoundError(self._where(path)) from None
                if code == "InvalidRange" or status == 416:
                    # The offset is at (or past) the end: nothing more to read, as for a local file.
                    try:
                        self.client.head_object(Bucket=self.bucket, Key=self._key(path))
                    except Exception as missing:  # noqa: BLE001
                        if _error_code(missing)[0] in NOT_FOUND_CODES:
                            raise FileNotFoundError(self._where(path)) from None
                        raise
                    return io.BytesIO(b"")
                raise
            return io.BufferedReader(_BodyReader(response["Body"]), buffer_size=1 << 20)  # type: ignore[return-value]

        return self._call("GET", path, fetch)

    def _objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object below ``prefix`` taken as a folder (or the object named ``prefix``)."""
        key = self._key(prefix)
        # "staged/epoch-1" must not list "staged/epoch-10/…": match the key itself or key + "/".
        folder = f"{key}/" if key else ""
        paginator = self.client.get_paginator("list_objects_v2")

        def pages() -> list[dict[str, Any]]:
            return list(paginator.paginate(Bucket=self.bucket, Prefix=key))

        for page in self._call("LIST", prefix, pages):
            for obj in page.get("Contents", []):
                if obj["Key"] == key or obj["Key"].startswith(folder):
                    yield obj

    def list(self, prefix: str = "") -> list[FileInfo]:
        out = [
            FileInfo(self._relative(obj["Key"]), int(obj["Size"]), _timestamp(obj.get("LastModified")))
            for obj in self._objects(prefix)
            # s3a leaves zero-byte "folder/" markers: they are not files.
            if not obj["Key"].endswith("/")
        ]
        return sorted(out, key=lambda f: f.path)

    def delete(self, path: str) -> None:
        check_relative(path, "delete")  # keys are flat, but a `..` may be resolved by a reader on the way
        # DELETE of a missing key succeeds on S3: "already gone" needs no special case.
        self._call("DELETE", path, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(path)))

    def delete_prefix(self, prefix: str) -> int:
        check_relative(prefix, "delete", empty=True)
        objects = list(self._objects(prefix))
        keys = [obj["Key"] for obj in objects]  # folder markers too, so nothing is left behind
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]

            def delete_batch(batch: list[str] = batch) -> None:
                response = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
                errors = response.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StorageError(
                        f"S3 DELETE of {len(errors)} objects below {self._where(prefix)} failed, e.g. "
                        f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}; run again to retry",
                        transient=first.get("Code") in TRANSIENT_CODES,
                    )

            self._call("DELETE", prefix, delete_batch)
        return sum(1 for obj in objects if not obj["Key"].endswith("/"))

    def put_file(self, path: str, local_file: str) -> None:
        from boto3.s3.transfer import TransferConfig

        # upload_file switches to a multipart upload for large files; either way the object
        # appears whole when the upload completes.
        self._call(
            "PUT",
            path,
            lambda: self.client.upload_file(local_file, self.bucket, self._key(path), Config=TransferConfig()),
        )
        os.unlink(local_file)
