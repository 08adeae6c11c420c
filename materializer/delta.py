"""Delta table access: where a table is, what it records for a pipeline, how to commit to it.

A binding's ``table`` is a path (``/data/orders``, ``s3a://bucket/orders``, relative paths resolved
against the working directory) or a catalog name (``catalog.schema.table``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from delta.tables import DeltaTable
    from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@dataclass(frozen=True)
class TableRef:
    spec: str
    """As written in the configuration."""

    @property
    def is_path(self) -> bool:
        return "/" in self.spec or ":" in self.spec or self.spec.startswith(".")

    @property
    def location(self) -> str:
        """Absolute path or URI for path tables; the name for catalog tables."""
        if not self.is_path or "://" in self.spec or self.spec.startswith(("dbfs:", "/")):
            return self.spec
        return os.path.abspath(self.spec)

    def __str__(self) -> str:
        return self.location


def user_metadata(pipeline_id: str, binding: str, epoch: int) -> str:
    """The ``userMetadata`` of every commit we make: who wrote what (DESIGN invariant 7)."""
    return json.dumps({"materializer": {"pipeline": pipeline_id, "binding": binding, "epoch": epoch}}, sort_keys=True)


def parse_user_metadata(value: str | None) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    inner = data.get("materializer") if isinstance(data, dict) else None
    return inner if isinstance(inner, dict) else None


def exists(spark: "SparkSession", table: TableRef) -> bool:
    from delta.tables import DeltaTable

    if table.is_path:
        return bool(DeltaTable.isDeltaTable(spark, table.location))
    return bool(spark.catalog.tableExists(table.location))


def delta_table(spark: "SparkSession", table: TableRef) -> "DeltaTable":
    from delta.tables import DeltaTable

    if table.is_path:
        return DeltaTable.forPath(spark, table.location)
    return DeltaTable.forName(spark, table.location)


@dataclass(frozen=True)
class TableState:
    exists: bool
    version: int | None
    """Latest Delta version (None: no table)."""
    txn_version: int | None
    """The epoch Delta's transaction identifiers record for the pipeline (None: none)."""


def table_state(spark: "SparkSession", table: TableRef, app_id: str) -> TableState:
    """Read the table's latest snapshot: its version and the txnVersion recorded for ``app_id``.

    Reads only the Delta log (no data files). Uses the snapshot's SetTransaction actions through
    the JVM; where that is not reachable, falls back to our own tags in the commit history.
    """
    if not exists(spark, table):
        return TableState(False, None, None)
    dt = delta_table(spark, table)
    try:
        snapshot = _latest_snapshot(dt)
        txns = snapshot.transactions()
        found = txns.get(app_id)
        txn = int(found.get()) if found.isDefined() else None
        return TableState(True, int(snapshot.version()), txn)
    except Exception:  # noqa: BLE001 - JVM internals absent (e.g. Spark Connect): use the history
        return _state_from_history(dt, app_id)


def read_txn_without_spark(table: TableRef, app_id: str, environ: "dict[str, str] | None" = None) -> TableState | None:
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
        return TableState(True, int(dt.version()), dt.transaction_version(app_id))
    except TableNotFoundError:
        return TableState(False, None, None)
    except Exception:  # noqa: BLE001 - delta-rs cannot read it (a feature, a store): Spark can
        return None


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


def _latest_snapshot(dt: "DeltaTable") -> Any:
    """The JVM snapshot of the table's latest version (DeltaLog.update with its default arguments)."""
    log = dt._jdt.deltaLog()
    defaults = [getattr(log, f"update$default${n}")() for n in (1, 2, 3)]
    return log.update(*defaults)


def table_version(spark: "SparkSession", table: TableRef) -> int | None:
    """The table's latest version, from the Delta log's listing only (no state reconstruction)."""
    if not exists(spark, table):
        return None
    dt = delta_table(spark, table)
    try:
        return int(_latest_snapshot(dt).version())
    except Exception:  # noqa: BLE001 - JVM internals absent: ask the history for its last entry
        return int(dt.history(1).select("version").collect()[0]["version"])


def _state_from_history(dt: "DeltaTable", app_id: str) -> TableState:
    version = None
    txn = None
    for row in dt.history().select("version", "userMetadata").collect():
        version = max(version or 0, int(row["version"]))
        meta = parse_user_metadata(row["userMetadata"])
        if meta and meta.get("pipeline") == app_id:
            txn = max(txn or 0, int(meta["epoch"]))
    return TableState(True, version, txn)


def history(spark: "SparkSession", table: TableRef) -> list[dict[str, Any]]:
    """Commit history, oldest first: version, operation, and our tag (pipeline, binding, epoch)."""
    if not exists(spark, table):
        return []
    rows = delta_table(spark, table).history().select("version", "operation", "userMetadata").collect()
    out = []
    for row in sorted(rows, key=lambda r: r["version"]):
        out.append({"version": row["version"], "operation": row["operation"], "tag": parse_user_metadata(row["userMetadata"])})
    return out
