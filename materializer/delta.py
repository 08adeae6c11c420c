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
        if not self.is_path or "://" in self.spec or self.spec.startswith(("dbfs:", "file:", "/")):
            return self.spec
        return os.path.abspath(self.spec)

    def __str__(self) -> str:
        return self.location


def quote(name: str) -> str:
    """``name`` as a SQL identifier: in backticks, a backtick inside doubled (```a``b```)."""
    return "`" + name.replace("`", "``") + "`"


def normalise_location(location: str) -> str:
    """One spelling per place: ``s3a://``/``s3n://`` as ``s3://``, no ``file:``, no trailing or
    doubled slash, ``./`` and ``..`` resolved, local paths absolute with symlinks followed."""
    loc = location.strip()
    for alias in ("s3a://", "s3n://"):
        if loc.startswith(alias):
            loc = "s3://" + loc[len(alias) :]
    if loc.startswith("file:"):
        loc = loc[len("file:") :]
        if loc.startswith("//"):
            loc = loc[2:]
    if "://" in loc:
        scheme, _, rest = loc.partition("://")
        bucket, _, key = rest.partition("/")
        parts = [p for p in key.split("/") if p not in ("", ".")]
        return f"{scheme.lower()}://{bucket}/" + "/".join(parts)
    if loc.startswith("dbfs:"):
        return "dbfs:" + os.path.normpath(loc[len("dbfs:") :] or "/")
    return os.path.realpath(os.path.abspath(loc))


def config_identity(spec: str) -> str:
    """What can be told from the configuration alone: a path's normalised location, or the name."""
    table = TableRef(spec)
    return normalise_location(table.location) if table.is_path else spec.strip().lower()


def table_identity(spark: "SparkSession", table: TableRef) -> str:
    """Where the table's data lives, so two spellings of one table compare equal.

    Paths are normalised; a catalog name that exists is resolved to its location (DESCRIBE
    DETAIL, Spark Connect clean); one that does not exist yet is its qualified lower-case name.
    """
    if table.is_path:
        return normalise_location(table.location)
    if exists(spark, table):
        row = spark.sql(f"DESCRIBE DETAIL {table.location}").select("location").collect()[0]
        if row["location"]:
            return normalise_location(str(row["location"]))
    parts = table.location.strip().lower().split(".")
    if len(parts) < 3:
        current = [spark.catalog.currentCatalog().lower(), spark.catalog.currentDatabase().lower()]
        parts = current[: 3 - len(parts)] + parts
    return ".".join(parts)


_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


def is_commit_conflict(exc: BaseException) -> bool:
    """Did a Delta commit lose to a concurrent one (so reading the table again and retrying helps)?

    By type (``delta.exceptions``, raised by the classic client), or by Delta's error class (what
    Spark Connect gives), never by words in the message: a message quotes JVM stack frames from
    ``java.util.concurrent`` whatever the failure was.
    """
    try:
        import delta.exceptions as conflicts

        if isinstance(exc, tuple(getattr(conflicts, name) for name in conflicts.__all__)):
            return True
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        pass
    for getter in ("getCondition", "getErrorClass"):
        method = getattr(exc, getter, None)
        if method is None:
            continue
        try:
            condition = method()
        except Exception:  # noqa: BLE001 - an exception without an error class
            condition = None
        if condition:
            return str(condition).startswith(_CONFLICT_CONDITIONS)
    return False


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


@dataclass(frozen=True)
class TableWriters:
    """Who has committed to a table, as its Delta log tells (the commits it still keeps)."""

    tags: dict[tuple[str, str], tuple[int, int]]
    """Our ``userMetadata`` tags: (pipeline, binding) -> (first, last) Delta version tagged so."""
    app_ids: dict[str, int]
    """Delta transaction ids (``txnAppId``) -> the last version known to record them."""


def table_location(spark: "SparkSession", table: TableRef) -> str:
    """The folder of the table's files (a catalog table's via DESCRIBE DETAIL)."""
    if table.is_path:
        return table.location
    return str(spark.sql(f"DESCRIBE DETAIL {table.location}").select("location").collect()[0]["location"])


def table_writers(spark: "SparkSession", table: TableRef) -> TableWriters:
    """Read the table's Delta log once: every tag of ours and every transaction id it records.

    One Spark job over the ``_delta_log`` commit files (plus its checkpoints, which keep the
    transaction ids of commits cleaned up since), through the DataFrame reader: Spark Connect
    clean, no JVM internals. Meant for once per run (Open), not per epoch.
    """
    from pyspark.sql import functions as F

    log = table_location(spark, table).rstrip("/") + "/_delta_log"
    try:
        return _writers_from_log(spark, log)
    except Exception:  # noqa: BLE001 - e.g. Unity Catalog refuses path access to a managed table
        if table.is_path:
            raise
    # The catalog's own view: the history's tags (transaction ids are not in it).
    tags: dict[tuple[str, str], tuple[int, int]] = {}
    for row in delta_table(spark, table).history().select("version", "userMetadata").collect():
        meta = parse_user_metadata(row["userMetadata"])
        if meta is not None and "pipeline" in meta and "binding" in meta:
            key = (str(meta["pipeline"]), str(meta["binding"]))
            version = int(row["version"])
            first, last = tags.get(key, (version, version))
            tags[key] = (min(first, version), max(last, version))
    return TableWriters(tags=tags, app_ids={})


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
        meta = parse_user_metadata(row["meta"])
        if meta is not None and "pipeline" in meta and "binding" in meta:
            key = (str(meta["pipeline"]), str(meta["binding"]))
            first, last = tags.get(key, (row["first"], row["last"]))
            tags[key] = (min(first, row["first"]), max(last, row["last"]))
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
