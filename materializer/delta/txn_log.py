"""The txnVersion a table records for an app id, read by Spark from its Delta log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.delta.reads import detail, history, table_version
from materializer.tables import TableRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
        # Found by listing the log, not from ``_last_checkpoint``: Spark's file sources skip every
        # name that starts with "_" ("All paths were ignored"), so that hint cannot be read here.
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
    return _complete_checkpoint([r["name"] for r in names], version)


def _complete_checkpoint(names: list[str], version: int) -> tuple[int, str | None] | None:
    """The newest complete checkpoint at or below ``version`` among the log's file names: a classic
    one (``<v>.checkpoint.parquet``), a V2 one (``<v>.checkpoint.<uuid>.json|parquet``, its name
    returned), or a multi-part one with all its parts (``<v>.checkpoint.<i>.<n>.parquet``); a
    multi-part checkpoint still being written is passed over, as Delta passes it over."""
    found: dict[int, str | None] = {}
    parts: dict[tuple[int, int], set[int]] = {}
    for name in names:
        pieces = name.split(".")
        if len(pieces) < 3 or not pieces[0].isdigit() or pieces[1] != "checkpoint":
            continue
        at = int(pieces[0])
        if at > version:
            continue
        if pieces[2:] == ["parquet"]:
            found.setdefault(at, None)
        elif len(pieces) == 5 and pieces[2].isdigit() and pieces[3].isdigit() and pieces[4] == "parquet":
            parts.setdefault((at, int(pieces[3])), set()).add(int(pieces[2]))
        elif len(pieces) == 4 and pieces[3] in ("json", "parquet"):
            found[at] = name
    for (at, total), seen in parts.items():
        if seen == set(range(1, total + 1)):
            found.setdefault(at, None)
    if not found:
        return None
    newest = max(found)
    return newest, found[newest]


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
