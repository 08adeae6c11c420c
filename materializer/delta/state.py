"""A table's version and txn version: by delta-rs in milliseconds where trusted, else by Spark."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from materializer.delta.reads import detail, table_version
from materializer.delta.trust import DELTA_RS_CANNOT, delta_rs_sees
from materializer.delta.txn_log import txn_version
from materializer.tables import TableRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class TableState:
    exists: bool
    version: int | None
    """Latest Delta version (None: no table)."""
    txn_version: int | None
    """The epoch Delta's transaction identifiers record for the pipeline (None: none)."""
    size_bytes: int | None = None
    """The bytes of the table's data files at ``version`` (None: not asked for, or Spark answered)."""


def table_state(spark: "SparkSession", table: TableRef, app_id: str, *, spark_only: bool = False, with_size: bool = False) -> TableState:
    """The table's latest version and the txnVersion recorded for ``app_id`` at that version.

    Reads only the Delta log (no data files). A path table is read by delta-rs first
    (:func:`read_txn_without_spark`, milliseconds: this runs before every apply), where its answer
    can be trusted: an S3 table (the same store the Spark cluster writes), or a local path on a
    classic session (the JVM is on this machine). Otherwise, or where delta-rs cannot answer, Spark
    reads the log with DataFrame and SQL calls (Spark Connect clean, 0.6-1.3 s). Both read the same
    SetTransaction actions; ``spark_only`` skips delta-rs (tests compare the two). ``with_size``:
    delta-rs also sums the data files' sizes (:attr:`TableState.size_bytes`; the apply's choice).
    """
    if table.is_path and not spark_only and table.location not in DELTA_RS_CANNOT and delta_rs_sees(spark, table):
        fast = read_txn_without_spark(table, app_id, with_size=with_size)
        if fast is None:
            # Not again for this table in this process (a store or feature delta-rs cannot read
            # may cost a timeout each time): Spark answers from now on.
            DELTA_RS_CANNOT.add(table.location)
        # "No table" is not taken from delta-rs: the first epochs of a new table are few, and
        # Spark is the one that creates it (its answer is the one that matters there).
        if fast is not None and fast.exists:
            return fast
    if table.is_path:
        # One command fewer on the apply path: the history says whether the table exists.
        location: str | None = table.location
    else:
        found = detail(spark, table)
        if found is None:
            return TableState(False, None, None)
        location = str(found["location"])
    version = table_version(spark, table)
    if version is None:
        return TableState(False, None, None)
    return TableState(True, version, txn_version(spark, table, app_id, version=version, location=location))


def read_txn_without_spark(
    table: TableRef, app_id: str, environ: "dict[str, str] | None" = None, *, with_size: bool = False
) -> TableState | None:
    """The table's version and the txnVersion it records for ``app_id``, read by delta-rs (no JVM).

    Reads the same Delta log actions (``txn`` / SetTransaction) Spark's snapshot does, in
    milliseconds. Returns None where it cannot answer and Spark must (a catalog name, a table
    feature delta-rs cannot read, deltalake not installed): callers fall back to
    :func:`table_state`. A stale answer is harmless where it is used as a replay pre-check: Delta's
    own txn check at commit still skips a replayed MERGE.
    """
    if not table.is_path:
        return None
    try:
        from deltalake import DeltaTable as RustDeltaTable
    except ImportError:
        return None
    uri = table.location
    options = None
    if uri.startswith(("s3://", "s3a://", "s3n://")):
        uri = "s3://" + uri.split("://", 1)[1]
        options = delta_rs_storage_options(os.environ if environ is None else environ)
    elif uri.startswith("file:"):
        uri = uri[len("file:") :]
    from deltalake.exceptions import TableNotFoundError

    try:
        # Opened directly, not after is_deltatable(): one log listing instead of two (and that
        # call's listing hangs against some S3-compatible servers, moto's among them).
        dt = RustDeltaTable(uri, storage_options=options)
        return TableState(True, int(dt.version()), dt.transaction_version(app_id), _data_bytes(dt) if with_size else None)
    except TableNotFoundError:
        return TableState(False, None, None)
    except Exception:  # noqa: BLE001 - delta-rs cannot read it (a feature, a store): Spark can
        return None


def _data_bytes(dt: Any) -> int | None:
    """The bytes of an open delta-rs table's data files (its add actions, already in memory)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        sizes = pa.table(dt.get_add_actions(flatten=False)).column("size_bytes")
        return int(pc.sum(sizes).as_py() or 0)
    except Exception:  # noqa: BLE001 - no pyarrow, another delta-rs: the size is only a hint
        return None


def latest_version(spark: "SparkSession", table: TableRef) -> int | None:
    """The table's latest version, read by delta-rs where its answer is trusted (a path the
    session's Spark sees as this process does: :func:`table_state`'s fast path), else by Spark's
    ``DESCRIBE HISTORY`` (:func:`table_version`, 2 Spark jobs). None: no table.

    For the report after an apply and the skip check of an append (one commit more, or none)."""
    opened = _open_with_delta_rs(spark, table)
    return int(opened.version()) if opened is not None else table_version(spark, table)


def metadata_fingerprint(spark: "SparkSession", table: TableRef) -> str | None:
    """What the table's schema and properties are a function of, read by delta-rs in milliseconds
    where its answer is trusted: the latest Metadata action (id, schema, partition columns,
    configuration: constraints, column mapping, type widening …) and Protocol action. Equal
    fingerprints, equal facts (:func:`schema_and_properties`); any commit that changes them (an
    ALTER, a schema evolution, another writer replacing the table) changes it, a commit that only
    adds or removes files does not. None where delta-rs cannot say (a catalog table, a Spark
    Connect session's local path, a store or feature it cannot read, no table)."""
    opened = _open_with_delta_rs(spark, table)
    if opened is None:
        return None
    metadata, protocol = opened.metadata(), opened.protocol()
    return json.dumps(
        {
            "id": metadata.id,
            "schema": opened.schema().to_json(),
            "partition_columns": list(metadata.partition_columns),
            "configuration": dict(metadata.configuration),
            "protocol": [
                protocol.min_reader_version, protocol.min_writer_version,
                sorted(protocol.reader_features or []), sorted(protocol.writer_features or []),
            ],
        },
        sort_keys=True,
    )


def _open_with_delta_rs(spark: "SparkSession", table: TableRef) -> Any:
    """The table's latest snapshot in delta-rs (a ``deltalake.DeltaTable``), where its answer is
    trusted (see :func:`delta_rs_sees`); None where it cannot say and Spark must."""
    if not table.is_path or table.location in DELTA_RS_CANNOT or not delta_rs_sees(spark, table):
        return None
    try:
        from deltalake import DeltaTable as RustDeltaTable
        from deltalake.exceptions import TableNotFoundError
    except ImportError:
        return None
    uri, options = _delta_rs_uri(table)
    try:
        return RustDeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None  # not yet: Spark, which creates it, says so
    except Exception:  # noqa: BLE001 - a store or feature delta-rs cannot read: Spark answers, from now on
        DELTA_RS_CANNOT.add(table.location)
        return None


def _delta_rs_uri(table: TableRef) -> tuple[str, dict[str, str] | None]:
    """A path table's location and storage options as delta-rs takes them."""
    uri = table.location
    if uri.startswith(("s3://", "s3a://", "s3n://")):
        return "s3://" + uri.split("://", 1)[1], delta_rs_storage_options(os.environ)
    if uri.startswith("file:"):
        uri = uri[len("file:") :]
    return uri, None


def delta_rs_storage_options(env: "Mapping[str, str]") -> dict[str, str]:
    """delta-rs (object_store) S3 options from the standard AWS environment, as s3a gets them."""
    options: dict[str, str] = {}
    for key, option in (
        ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
        ("AWS_SESSION_TOKEN", "aws_session_token"),
        ("AWS_PROFILE", "aws_profile"),
    ):
        if env.get(key):
            options[option] = env[key]
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if endpoint:
        options["aws_endpoint_url"] = endpoint
        options["aws_virtual_hosted_style_request"] = "false"
        if endpoint.startswith("http://"):
            options["aws_allow_http"] = "true"
        region = region or "us-east-1"
    if region:
        options["aws_region"] = region
    return options
