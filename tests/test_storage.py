"""One behaviour suite for every store (local folder, S3 over a real HTTP server). No JVM.

The same tests run against :class:`LocalStore` and :class:`S3Store` (moto's server on loopback,
port 0), and so does the recovery log on top of them: exclusive publication, fencing, compaction.
S3-only tests at the end cover what has no local twin: lost PUT answers, error classification.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from materializer.errors import FencedError, StorageError
from materializer.protocol import DriverCheckpoint, StagedFile
from materializer.recovery_log import RecoveryLog, entry_path
from materializer.storage import Store, is_s3, open_store
from materializer.storage.local import LocalStore
from materializer.storage.s3 import S3Store, parse_uri
from tests.s3server import S3Server

StoreFactory = Callable[[str], Store]


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Stores under one root: ``make_store("log")`` is a folder (or S3 prefix) named ``log``."""
    if request.param == "local":
        return lambda name: open_store(str(tmp_path / name))
    bucket = request.getfixturevalue("s3_bucket")
    return lambda name: open_store(f"s3://{bucket}/root/{name}")


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store("store")


# --- put_if_absent: the exclusive, atomic publication the recovery log relies on ---


def test_put_if_absent_publishes_once_and_keeps_the_first(store: Store) -> None:
    assert store.put_if_absent("entries/1.json", b"first") is True
    assert store.put_if_absent("entries/1.json", b"second") is False
    assert store.get("entries/1.json") == b"first"


def test_put_if_absent_has_exactly_one_winner_among_concurrent_writers(store: Store) -> None:
    results: dict[int, bool] = {}
    start = threading.Barrier(6)

    def writer(i: int) -> None:
        start.wait()
        results[i] = store.put_if_absent("entries/race.json", f"writer-{i}".encode())

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1, results
    assert store.get("entries/race.json") == f"writer-{winners[0]}".encode()


def test_before_publish_runs_once_before_the_file_is_visible(store: Store) -> None:
    seen: list[bool] = []

    def check() -> None:
        try:
            store.get("entries/1.json")
            seen.append(False)
        except FileNotFoundError:
            seen.append(True)

    assert store.put_if_absent("entries/1.json", b"x", before_publish=check)
    assert seen == [True]


def test_a_crash_before_publish_publishes_nothing(store: Store) -> None:
    class PowerCut(Exception):
        pass

    def crash() -> None:
        raise PowerCut

    with pytest.raises(PowerCut):
        store.put_if_absent("entries/1.json", b"x", before_publish=crash)
    assert store.list() == []  # no temp file either
    assert store.put_if_absent("entries/1.json", b"y")


# --- reading ---


def test_get_of_a_missing_file_is_file_not_found(store: Store) -> None:
    with pytest.raises(FileNotFoundError):
        store.get("nope.json")


def test_list_is_recursive_sorted_and_treats_the_prefix_as_a_folder(store: Store) -> None:
    for path in ("staged/epoch-10/a", "staged/epoch-1/b/part-1", "staged/epoch-1/a", "entries/1.json"):
        assert store.put_if_absent(path, b"12345")
    assert [f.path for f in store.list()] == [
        "entries/1.json",
        "staged/epoch-1/a",
        "staged/epoch-1/b/part-1",
        "staged/epoch-10/a",
    ]
    # "staged/epoch-1" is a folder: its name is a string prefix of "staged/epoch-10", which must not match
    assert [f.path for f in store.list("staged/epoch-1")] == ["staged/epoch-1/a", "staged/epoch-1/b/part-1"]
    assert [(f.path, f.size) for f in store.list("entries/1.json")] == [("entries/1.json", 5)]
    assert store.list("missing") == []
    assert store.list("entries/1") == []
    assert store.size("staged") == (3, 15)


def test_a_listing_says_when_each_file_was_written(store: Store, tmp_path: Path) -> None:
    """The documents source's lag in seconds is the age of the oldest file not read: local mtime, S3 LastModified."""
    import time

    before = time.time()
    assert store.put_if_absent("in/a.jsonl", b"{}\n")
    (info,) = store.list("in")
    # S3 keeps whole seconds; a file system's clock may trail a little: a second of slack either way.
    assert info.modified is not None and before - 2 <= info.modified <= time.time() + 2
    # The time is not part of a file's identity: checkpoints compare names and sizes only.
    assert info == type(info)("in/a.jsonl", 3)


def test_a_local_listing_reports_each_files_mtime(tmp_path: Path) -> None:
    import os

    store = LocalStore(str(tmp_path))
    assert store.put_if_absent("old.jsonl", b"x") and store.put_if_absent("new.jsonl", b"y")
    os.utime(tmp_path / "old.jsonl", (1_000_000_000, 1_000_000_000))
    assert {f.path: f.modified for f in store.list()} == {"new.jsonl": os.stat(tmp_path / "new.jsonl").st_mtime, "old.jsonl": 1_000_000_000}
    assert store.list("old.jsonl")[0].modified == 1_000_000_000


def test_open_read_streams_lines_from_an_offset(store: Store) -> None:
    data = b'{"id": 1}\n{"id": 2}\n\n{"id": 3}\n'
    assert store.put_if_absent("docs/a.jsonl", data)
    with store.open_read("docs/a.jsonl") as handle:
        assert list(handle) == [b'{"id": 1}\n', b'{"id": 2}\n', b"\n", b'{"id": 3}\n']
    offset = len(b'{"id": 1}\n')
    with store.open_read("docs/a.jsonl", offset) as handle:
        assert list(handle) == [b'{"id": 2}\n', b"\n", b'{"id": 3}\n']
    with store.open_read("docs/a.jsonl", 3) as handle:
        assert handle.read() == data[3:]
    # at the end (a checkpoint after the last line): nothing more, not an error
    with store.open_read("docs/a.jsonl", len(data)) as handle:
        assert handle.read() == b""
    with pytest.raises(FileNotFoundError):
        store.open_read("docs/missing.jsonl", 0)
    with pytest.raises(FileNotFoundError):
        store.open_read("docs/missing.jsonl", 10)


def test_open_read_handles_a_file_larger_than_its_buffers(store: Store) -> None:
    lines = [f'{{"id": {i}, "pad": "{"x" * 300}"}}\n'.encode() for i in range(5000)]  # ~1.5 MB
    data = b"".join(lines)
    assert store.put_if_absent("docs/big.jsonl", data)
    offset = sum(len(line) for line in lines[:1234])
    with store.open_read("docs/big.jsonl", offset) as handle:
        read = list(handle)
    assert read == lines[1234:]


# --- deleting and replacing ---


def test_delete_is_idempotent(store: Store) -> None:
    assert store.put_if_absent("a", b"1")
    store.delete("a")
    store.delete("a")
    assert store.list() == []


def test_delete_prefix_removes_only_what_is_below_the_prefix(store: Store) -> None:
    for path in ("staged/epoch-1/x/part-0", "staged/epoch-1/x/_SUCCESS", "staged/epoch-10/y", "entries/1.json"):
        assert store.put_if_absent(path, b"data")
    assert store.delete_prefix("staged/epoch-1") == 2
    assert [f.path for f in store.list()] == ["entries/1.json", "staged/epoch-10/y"]
    assert store.delete_prefix("staged/epoch-1") == 0


def test_put_file_publishes_replaces_and_consumes_the_local_file(store: Store, tmp_path: Path) -> None:
    local = Path(store.local_temp_dir()) / "spool-1.jsonl"
    local.write_bytes(b"one\n")
    store.put_file("spool/epoch-1/b.jsonl", str(local))
    assert not local.exists()
    assert store.get("spool/epoch-1/b.jsonl") == b"one\n"
    local.write_bytes(b"two\n")
    store.put_file("spool/epoch-1/b.jsonl", str(local))
    assert store.get("spool/epoch-1/b.jsonl") == b"two\n"


def test_spark_path_is_a_local_path_or_an_s3a_uri(store: Store) -> None:
    path = store.spark_path("staged/epoch-1/orders")
    if isinstance(store, S3Store):
        assert path == f"s3a://{store.bucket}/root/store/staged/epoch-1/orders"
    else:
        assert path == str(Path(store.uri) / "staged/epoch-1/orders")


# --- the recovery log over every store ---


def checkpoint(epoch: int) -> DriverCheckpoint:
    return DriverCheckpoint(epoch=epoch, staged={"b": StagedFile(uri=f"staged/e{epoch}", rows=1, bytes=10, files=1)})


def test_recovery_log_commits_and_reads_back(make_store: StoreFactory) -> None:
    writer = RecoveryLog(make_store("log"), "p1")
    assert writer.open().last_epoch == 0
    writer.commit(1, {"b": {"file": "a", "line": 3}}, checkpoint(1))
    writer.commit(2, {"b": {"file": "a", "line": 6}}, checkpoint(2))
    state = RecoveryLog(make_store("log"), "p1").open()
    assert state.last_epoch == 2
    assert state.last_commit is not None and state.last_commit.driver_checkpoint == checkpoint(2)
    assert state.sequences == (1, 2, 3)


def test_recovery_log_open_fences_the_older_writer(make_store: StoreFactory) -> None:
    old = RecoveryLog(make_store("log"), "p1")
    old.open()
    old.commit(1, {}, checkpoint(1))
    new = RecoveryLog(make_store("log"), "p1")
    assert new.open().last_epoch == 1
    with pytest.raises(FencedError, match="fenced"):
        old.commit(2, {"stale": True}, checkpoint(2))
    new.commit(2, {"ok": True}, checkpoint(2))
    state = RecoveryLog(make_store("log"), "p1").read()
    assert state.last_epoch == 2 and state.last_commit.runtime_checkpoint == {"ok": True}  # type: ignore[union-attr]


def test_recovery_log_compacts_old_entries(make_store: StoreFactory) -> None:
    writer = RecoveryLog(make_store("log"), "p1", retention=2)
    writer.open()
    for epoch in range(1, 7):
        writer.commit(epoch, {"e": epoch}, checkpoint(epoch))
    assert writer.sequences() == [5, 6, 7]
    assert not any(f.path == entry_path(1) for f in make_store("log").list())
    assert RecoveryLog(make_store("log"), "p1").read().last_epoch == 6


def test_recovery_log_crash_mid_commit_leaves_the_epoch_uncommitted(make_store: StoreFactory) -> None:
    writer = RecoveryLog(make_store("log"), "p1")
    writer.open()

    class PowerCut(Exception):
        pass

    def crash() -> None:
        raise PowerCut

    with pytest.raises(PowerCut):
        writer.commit(1, {}, checkpoint(1), before_publish=crash)
    assert RecoveryLog(make_store("log"), "p1").read().last_epoch == 0


# --- URIs ---


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://bucket/a/b", "bucket", "a/b"),  # the usual form
        ("s3a://bucket/a/b/", "bucket", "a/b"),  # Hadoop's scheme, trailing slash ignored
        ("s3://bucket", "bucket", ""),  # the whole bucket
    ],
)
def test_parse_uri(uri: str, bucket: str, prefix: str) -> None:
    assert parse_uri(uri) == (bucket, prefix)
    assert is_s3(uri)
    assert isinstance(open_store(uri), S3Store)


def test_a_uri_without_a_bucket_is_refused() -> None:
    with pytest.raises(StorageError, match="not an S3 URI"):
        parse_uri("s3:///prefix")


def test_local_paths_open_local_stores(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)


# --- S3 only: what S3's network and conditional writes add ---


def test_a_lost_put_answer_retried_into_412_is_still_our_publish(s3_bucket: str) -> None:
    """The PUT landed, its answer was lost, botocore retried and got 412: that 412 is our own write."""
    store = S3Store(f"s3://{s3_bucket}/log")
    calls = {"n": 0}

    def lose_first_answer(attempts: int, **_kwargs: Any) -> float | None:
        calls["n"] += 1
        return 0.0 if attempts == 1 else None  # "retry after 0 s" for the first (successful) attempt

    events = store.client.meta.events
    events.register_first("needs-retry.s3.PutObject", lose_first_answer, unique_id="lose-first-answer")
    try:
        assert store.put_if_absent("entries/1.json", b"ours") is True
        assert calls["n"] >= 2  # the PUT really was sent twice
        # Someone else's entry at the same sequence is still a refusal, retried or not.
        calls["n"] = 0
        assert store.put_if_absent("entries/1.json", b"theirs") is False
    finally:
        events.unregister("needs-retry.s3.PutObject", unique_id="lose-first-answer")
    assert store.get("entries/1.json") == b"ours"


def test_a_missing_bucket_is_a_terminal_error_that_says_so(s3_env: S3Server) -> None:
    store = open_store("s3://no-such-bucket-here/log")
    with pytest.raises(StorageError, match="create the bucket") as info:
        store.list()
    assert info.value.transient is False
    with pytest.raises(StorageError) as info:
        store.put_if_absent("entries/1.json", b"x")
    assert info.value.transient is False


def test_an_unreachable_endpoint_is_a_transient_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from materializer.storage import s3

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in S3Server(f"http://127.0.0.1:{port}").env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setattr(s3, "_backoff", lambda attempt: 0.0)
    store = open_store("s3://bucket/log")
    with pytest.raises(StorageError, match="nothing was half-written") as info:
        store.get("entries/1.json")
    assert info.value.transient is True


class _FlakyClient:
    """Answers 503 SlowDown ``failures`` times, then delegates to a real client."""

    def __init__(self, real: Any, failures: int) -> None:
        self.real = real
        self.failures = failures
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        from botocore.exceptions import ClientError

        target = getattr(self.real, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.failures > 0:
                self.failures -= 1
                raise ClientError(
                    {"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                     "ResponseMetadata": {"HTTPStatusCode": 503}},
                    name,
                )
            return target(*args, **kwargs)

        return call


@pytest.mark.parametrize(
    ("failures", "outcome"),
    [
        (2, "ok"),  # a short burst of throttling is absorbed by our retries
        (10, "transient"),  # a long one ends as a transient StorageError: run again later
    ],
)
def test_throttling_is_retried_then_classified_transient(s3_bucket: str, monkeypatch: pytest.MonkeyPatch, failures: int, outcome: str) -> None:
    from materializer.storage import s3

    monkeypatch.setattr(s3, "_backoff", lambda attempt: 0.0)
    real = S3Store(f"s3://{s3_bucket}/log")
    assert real.put_if_absent("a", b"1")
    flaky = S3Store(f"s3://{s3_bucket}/log", client=_FlakyClient(real.client, failures))  # type: ignore[arg-type]
    if outcome == "ok":
        assert flaky.get("a") == b"1"
        assert flaky.put_if_absent("b", b"2")
    else:
        with pytest.raises(StorageError) as info:
            flaky.get("a")
        assert info.value.transient is True
        assert "SlowDown" in str(info.value)


def test_s3a_folder_markers_are_not_files_but_are_deleted(s3_bucket: str) -> None:
    store = S3Store(f"s3://{s3_bucket}/staging")
    store.client.put_object(Bucket=s3_bucket, Key="staging/staged/epoch-1/x/", Body=b"")  # what s3a mkdirs leaves
    assert store.put_if_absent("staged/epoch-1/x/part-0", b"data")
    assert [f.path for f in store.list()] == ["staged/epoch-1/x/part-0"]
    assert store.delete_prefix("staged/epoch-1") == 1
    assert store.client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


def test_s3a_conf_follows_the_aws_environment() -> None:
    from materializer.spark import s3a_conf

    conf = s3a_conf(
        {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    )
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    # The keys never in the start-up conf (the JVM's command line): s3a reads them from the environment.
    assert "spark.hadoop.fs.s3a.access.key" not in conf and "spark.hadoop.fs.s3a.secret.key" not in conf
    assert "s" not in conf.values()
    assert "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider" in conf[
        "spark.hadoop.fs.s3a.aws.credentials.provider"
    ]
    # Real AWS: no endpoint override, the region from the environment, credentials from the chain.
    conf = s3a_conf({"AWS_REGION": "eu-west-1"})
    assert "spark.hadoop.fs.s3a.endpoint" not in conf
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert "spark.hadoop.fs.s3a.access.key" not in conf


def test_hadoop_aws_matches_the_hadoop_that_pyspark_ships() -> None:
    from pathlib import Path as P

    import pyspark

    from materializer.spark import HADOOP_AWS_VERSION

    assert (P(pyspark.__file__).parent / "jars" / f"hadoop-client-api-{HADOOP_AWS_VERSION}.jar").exists()
