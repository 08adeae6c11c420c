"""Delta table access: where a table is, what it records for a pipeline, how to commit to it.

A binding's ``table`` is a path (``/data/orders``, ``s3a://bucket/orders``, relative paths resolved
against the working directory) or a catalog name (``catalog.schema.table``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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


def sql_name(table: TableRef) -> str:
    """The table as Delta's SQL names it: ``delta.`<path>``` or the catalog name as given."""
    if table.is_path:
        return "delta.`" + table.location.replace("`", "``") + "`"
    return table.location


def _missing(exc: Exception) -> bool:
    text = str(exc)
    return any(
        marker in text
        for marker in ("DELTA_MISSING_DELTA_TABLE", "is not a Delta table", "PATH_NOT_FOUND", "TABLE_OR_VIEW_NOT_FOUND", "DELTA_TABLE_NOT_FOUND")
    )


def detail(spark: "SparkSession", table: TableRef) -> dict[str, Any] | None:
    """``DESCRIBE DETAIL`` of the table (format, location, properties …); None if there is none."""
    from pyspark.errors import AnalysisException

    if not table.is_path and not spark.catalog.tableExists(table.location):
        return None
    try:
        row = spark.sql(f"DESCRIBE DETAIL {sql_name(table)}").collect()[0]
    except AnalysisException as exc:
        if _missing(exc):
            return None
        raise
    found = row.asDict()
    return found if found.get("format") == "delta" else None


def exists(spark: "SparkSession", table: TableRef) -> bool:
    return detail(spark, table) is not None


def read_table(spark: "SparkSession", table: TableRef) -> "DataFrame":
    """The table's current rows, as a DataFrame (nothing is read until it is evaluated)."""
    if table.is_path:
        return spark.read.format("delta").load(table.location)
    return spark.read.table(table.location)


@dataclass(frozen=True)
class TableState:
    exists: bool
    version: int | None
    """Latest Delta version (None: no table)."""
    txn_version: int | None
    """The epoch Delta's transaction identifiers record for the pipeline (None: none)."""


def table_state(spark: "SparkSession", table: TableRef, app_id: str) -> TableState:
    """The table's latest version and the txnVersion recorded for ``app_id`` at that version.

    Reads only the Delta log (no data files), with DataFrame and SQL calls (Spark Connect clean).
    """
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


def table_version(spark: "SparkSession", table: TableRef) -> int | None:
    """The table's latest version (its last commit in ``DESCRIBE HISTORY``); None if no table."""
    from pyspark.errors import AnalysisException

    if not table.is_path and not spark.catalog.tableExists(table.location):
        return None
    try:
        rows = spark.sql(f"DESCRIBE HISTORY {sql_name(table)} LIMIT 1").select("version").collect()
    except AnalysisException as exc:
        if _missing(exc):
            return None
        raise
    return int(rows[0]["version"]) if rows else None


# --- the txn version, read from the Delta log itself ---
#
# Delta skips a write whose txnVersion is <= the version its snapshot records for the app id: the
# latest SetTransaction action (``{"txn": {"appId", "version", "lastUpdated"}}``) for that id in the
# log's replay. The replay starts at the newest checkpoint (whose ``txn`` column holds every live
# app id) and applies the JSON commits after it; commits older than the checkpoint may be gone
# (log clean-up), so `DESCRIBE HISTORY` and our own commit tags are no substitute. Versions only
# grow for an app id (Delta refuses to go back), so the latest action is also the largest version.

_TXN_SCHEMA = "txn STRUCT<appId: STRING, version: BIGINT>"


def txn_version(
    spark: "SparkSession", table: TableRef, app_id: str, *, version: int | None = None, location: str | None = None
) -> int | None:
    """The txnVersion the table's snapshot (at ``version``, default latest) records for ``app_id``.

    The checkpoint's and the later commits' SetTransaction actions, read with Spark DataFrames
    (no JVM internals), so it runs the same on classic Spark and Spark Connect. None: the table
    records nothing for ``app_id`` (or there is no table).
    """
    if location is None:
        found = detail(spark, table)
        if found is None:
            return None
        location = str(found["location"])
    if version is None:
        version = table_version(spark, table)
        if version is None:
            return None
    log = location.rstrip("/") + "/_delta_log"
    try:
        checkpoint = _last_checkpoint(spark, log, version)
        try:
            return _txn_from(spark, log, app_id, checkpoint, version)
        except Exception as exc:  # noqa: BLE001 - Connect and classic raise different classes
            if not _absent(exc):
                raise
        # A commit after the hinted checkpoint is gone: the hint is stale (``_last_checkpoint``
        # is only a hint) and clean-up removed what precedes a newer checkpoint. Find that one.
        return _txn_from(spark, log, app_id, _newest_checkpoint(spark, log, version), version)
    except Exception:
        if table.is_path:
            raise
        # Unity Catalog refuses path access to a managed table's files, its log included. The
        # best left is our own tags in the history: right while the history reaches back to the
        # pipeline's last commit (log retention, 30 days by default), and only as a pre-check:
        # Delta itself still skips a replayed MERGE, which is then reported as skipped.
        return _txn_from_history(spark, table, app_id)


def _absent(exc: Exception) -> bool:
    return "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc)


def _txn_from_history(spark: "SparkSession", table: TableRef, app_id: str) -> int | None:
    epochs = [int(h["tag"]["epoch"]) for h in history(spark, table) if h["tag"] and h["tag"].get("pipeline") == app_id]
    return max(epochs) if epochs else None


def _last_checkpoint(spark: "SparkSession", log: str, version: int) -> tuple[int, str | None] | None:
    """(version, V2 checkpoint file name or None) from ``_last_checkpoint``, if any and <= version."""
    try:
        rows = spark.read.text(f"{log}/_last_checkpoint").collect()
    except Exception as exc:  # noqa: BLE001 - no checkpoint yet
        if _absent(exc):
            return None
        raise
    if not rows:
        return None
    hint = json.loads("".join(r["value"] for r in rows))
    found = int(hint["version"])
    if found > version:
        return None
    v2 = hint.get("v2Checkpoint") or {}
    return found, v2.get("path")


def _newest_checkpoint(spark: "SparkSession", log: str, version: int) -> tuple[int, str | None] | None:
    """The newest checkpoint at or below ``version``, by listing the log's checkpoint files."""
    from pyspark.sql import functions as F

    try:
        names = (
            spark.read.format("binaryFile")
            .option("pathGlobFilter", "*.checkpoint*")
            .load(log)
            .select(F.element_at(F.split("path", "/"), -1).alias("name"))
            .collect()
        )
    except Exception as exc:  # noqa: BLE001
        if _absent(exc):
            return None
        raise
    versions = sorted({int(r["name"].split(".")[0]) for r in names if r["name"].split(".")[0].isdigit()})
    usable = [v for v in versions if v <= version]
    return (usable[-1], None) if usable else None


def _txn_from(
    spark: "SparkSession", log: str, app_id: str, checkpoint: tuple[int, str | None] | None, version: int
) -> int | None:
    from pyspark.sql import functions as F

    frames = []
    first = 0
    if checkpoint is not None:
        at, v2_name = checkpoint
        first = at + 1
        # Classic (one file), multi-part (…checkpoint.<part>.<parts>.parquet) and V2 parquet
        # checkpoints all match this glob; a V2 checkpoint may also be JSON.
        if v2_name and v2_name.endswith(".json"):
            frames.append(spark.read.schema(_TXN_SCHEMA).json(f"{log}/{v2_name}"))
        else:
            frames.append(spark.read.schema(_TXN_SCHEMA).parquet(f"{log}/{at:020d}.checkpoint*.parquet"))
    commits = [f"{log}/{v:020d}.json" for v in range(first, version + 1)]
    if commits:
        frames.append(spark.read.schema(_TXN_SCHEMA).json(commits))
    if not frames:
        return None
    actions = frames[0]
    for frame in frames[1:]:
        actions = actions.unionByName(frame)
    row = actions.where(F.col("txn.appId") == app_id).agg(F.max("txn.version").alias("v")).collect()[0]
    return None if row["v"] is None else int(row["v"])


def history(spark: "SparkSession", table: TableRef) -> list[dict[str, Any]]:
    """Commit history, oldest first: version, operation, and our tag (pipeline, binding, epoch)."""
    if not exists(spark, table):
        return []
    rows = spark.sql(f"DESCRIBE HISTORY {sql_name(table)}").select("version", "operation", "userMetadata").collect()
    out = []
    for row in sorted(rows, key=lambda r: r["version"]):
        out.append({"version": row["version"], "operation": row["operation"], "tag": parse_user_metadata(row["userMetadata"])})
    return out
