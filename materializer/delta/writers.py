"""Who has committed to a table (``TableWriters``): our commit tags and the txn ids its Delta log keeps."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer.delta.names import parse_user_metadata, sql_name
from materializer.delta.reads import table_location
from materializer.delta.trust import DELTA_RS_CANNOT, delta_rs_sees
from materializer.tables import TableRef

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class TableWriters:
    """Who has committed to a table, as its Delta log tells (the commits it still keeps)."""

    tags: dict[tuple[str, str], tuple[int, int]]
    """Our ``userMetadata`` tags: (pipeline, binding) -> (first, last) Delta version tagged so."""
    app_ids: dict[str, int]
    """Delta transaction ids (``txnAppId``) -> the last version known to record them."""


def table_writers(spark: "SparkSession", table: TableRef) -> TableWriters:
    """Read the table's Delta log once: every tag of ours and every transaction id it records.

    The ``_delta_log`` commit files (plus its checkpoints, which keep the transaction ids of
    commits cleaned up since): read in Python (:func:`writers_without_spark`, milliseconds) where
    this process sees the table's files as Spark does (see :func:`delta_rs_sees`), else one Spark
    job through the DataFrame reader (Spark Connect clean, no JVM internals; 1-2 s). Meant for once
    per run (Open), not per epoch.
    """
    log = table_location(spark, table).rstrip("/") + "/_delta_log"
    if table.is_path and table.location not in DELTA_RS_CANNOT and delta_rs_sees(spark, table):
        read = writers_without_spark(log)
        if read is not None:
            return read
    try:
        return _writers_from_log(spark, log)
    except Exception:  # noqa: BLE001 - e.g. Unity Catalog refuses path access to a managed table
        if table.is_path:
            raise
    # The catalog's own view: the history's tags (transaction ids are not in it).
    tags: dict[tuple[str, str], tuple[int, int]] = {}
    for row in spark.sql(f"DESCRIBE HISTORY {sql_name(table)}").select("version", "userMetadata").collect():
        version = int(row["version"])
        _tagged(tags, row["userMetadata"], version, version)
    return TableWriters(tags=tags, app_ids={})


def _tagged(tags: dict[tuple[str, str], tuple[int, int]], user_metadata: str | None, first: int, last: int) -> None:
    """Fold a commit's (or a run of commits') ``userMetadata`` into ``tags`` when it is our tag."""
    meta = parse_user_metadata(user_metadata)
    if meta is not None and "pipeline" in meta and "binding" in meta:
        key = (str(meta["pipeline"]), str(meta["binding"]))
        low, high = tags.get(key, (first, last))
        tags[key] = (min(low, first), max(high, last))


def writers_without_spark(log: str) -> TableWriters | None:
    """What :func:`_writers_from_log` reads, read here in Python from the log's files (the store's
    own listing and reads: no Spark job; milliseconds for hundreds of commits, where Spark's reader
    takes a second or two at every Open). The same actions by the same rules: each commit file's
    ``commitInfo.userMetadata`` and ``txn`` lines, and the ``txn`` column of its checkpoints. None
    where it cannot read them (a store it cannot reach as this process is configured): Spark reads."""
    import io
    import re

    from materializer.storage import open_store

    try:
        import pyarrow.parquet as pq  # with deltalake; without it, Spark reads

        store = open_store(log[len("file:") :] if log.startswith("file:") else log)
        names = [info.path for info in store.list("") if "/" not in info.path]  # the log's own files, not _sidecars/ …
        tags: dict[tuple[str, str], tuple[int, int]] = {}
        app_ids: dict[str, int] = {}
        for name in names:
            found = re.fullmatch(r"(\d+)\.json", name)
            if found is None:
                continue
            version = int(found.group(1))
            for line in store.get(name).splitlines():
                if b'"commitInfo"' not in line and b'"txn"' not in line:
                    continue
                action = json.loads(line)
                _tagged(tags, (action.get("commitInfo") or {}).get("userMetadata"), version, version)
                app = (action.get("txn") or {}).get("appId")
                if app is not None:
                    app_ids[app] = max(app_ids.get(app, -1), version)
        checkpointed: dict[str, int] = {}
        for name in names:
            found = re.fullmatch(r"(\d+)\.checkpoint.*\.parquet", name)
            if found is None:
                continue
            data = pq.read_table(io.BytesIO(store.get(name)), columns=["txn"]).column("txn").to_pylist()
            for txn in data:
                if txn and txn.get("appId") is not None:
                    checkpointed[txn["appId"]] = max(checkpointed.get(txn["appId"], -1), int(found.group(1)))
    except Exception:  # noqa: BLE001 - a store this process cannot read as Spark does: Spark reads
        return None
    for app, version in checkpointed.items():
        # Only the checkpoint's version is known: the commit was at or before it.
        app_ids.setdefault(app, version)
    return TableWriters(tags=tags, app_ids=app_ids)


def _writers_from_log(spark: "SparkSession", log: str) -> TableWriters:
    from pyspark.sql import functions as F

    commits = (
        spark.read.schema("commitInfo STRUCT<userMetadata: STRING>, txn STRUCT<appId: STRING, version: BIGINT>")
        .json(log + "/*.json")
        .select(
            F.regexp_extract(F.col("_metadata.file_name"), r"^(\d+)\.json$", 1).alias("v"),
            F.col("commitInfo.userMetadata").alias("meta"),
            F.col("txn.appId").alias("app"),
        )
        .where(F.col("v") != "")
        .where(F.col("meta").isNotNull() | F.col("app").isNotNull())
        .groupBy("meta", "app")
        .agg(F.min(F.col("v").cast("bigint")).alias("first"), F.max(F.col("v").cast("bigint")).alias("last"))
        .collect()  # one row per distinct tag or txn id: a handful, not the table
    )
    tags: dict[tuple[str, str], tuple[int, int]] = {}
    app_ids: dict[str, int] = {}
    for row in commits:
        _tagged(tags, row["meta"], int(row["first"]), int(row["last"]))
        if row["app"] is not None:
            app_ids[row["app"]] = max(app_ids.get(row["app"], -1), int(row["last"]))
    try:
        checkpointed = (
            spark.read.parquet(log + "/*.checkpoint*.parquet")
            .where(F.col("txn").isNotNull())
            .select(
                F.col("txn.appId").alias("app"),
                F.regexp_extract(F.col("_metadata.file_name"), r"^(\d+)\.checkpoint", 1).cast("bigint").alias("v"),
            )
            .groupBy("app")
            .agg(F.max("v").alias("v"))
            .collect()
        )
    except Exception:  # noqa: BLE001 - no checkpoint yet (a glob matching nothing is an error)
        checkpointed = []
    for row in checkpointed:
        # Only the checkpoint's version is known: the commit was at or before it.
        app_ids.setdefault(row["app"], int(row["v"]))
    return TableWriters(tags=tags, app_ids=app_ids)
