"""Delta table access: where a table is, what it records for a pipeline, how to commit to it.

A binding's ``table`` is a path (``/data/orders``, ``s3a://bucket/orders``, relative paths resolved
against the working directory) or a catalog name (``catalog.schema.table``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from materializer.tables import TableRef, normalise_location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def quote(name: str) -> str:
    """``name`` as a SQL identifier: in backticks, a backtick inside doubled (```a``b```)."""
    return "`" + name.replace("`", "``") + "`"


def table_identity(spark: "SparkSession", table: TableRef) -> str:
    """Where the table's data lives, so two spellings of one table compare equal.

    Paths are normalised; a catalog name that exists is resolved to its location (DESCRIBE
    DETAIL, Spark Connect clean); one that does not exist yet is its qualified lower-case name.
    """
    if table.is_path:
        return normalise_location(table.location)
    found = detail(spark, table)
    if found is not None and found.get("location"):
        return normalise_location(str(found["location"]))
    parts = table.location.strip().lower().split(".")
    if len(parts) < 3:
        current = [spark.catalog.currentCatalog().lower(), spark.catalog.currentDatabase().lower()]
        parts = current[: 3 - len(parts)] + parts
    return ".".join(parts)


_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


def is_commit_conflict(exc: BaseException) -> bool:
    """Did a Delta commit lose to a concurrent one (so reading the table again and retrying helps)?

    By type (``delta.exceptions``: the classic client's conversion, and on Spark Connect
    ``delta.connect.exceptions``' subclasses of the same types, both registered by
    :class:`materializer.merge.DeltaWriter`), or by Delta's error class (a server error the
    client maps to no type), never by words in the message: a message quotes JVM stack frames
    from ``java.util.concurrent`` whatever the failure was.
    """
    try:
        import delta.exceptions as conflicts

        if isinstance(exc, tuple(getattr(conflicts, name) for name in conflicts.__all__)):
            return True
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        pass
    condition = error_condition(exc)
    return condition is not None and condition.startswith(_CONFLICT_CONDITIONS)


def error_condition(exc: BaseException) -> str | None:
    """Spark's/Delta's error class of ``exc`` (``getCondition``, or ``getErrorClass`` before
    Spark 4), on classic Spark and Spark Connect alike; None when it has none."""
    for getter in ("getCondition", "getErrorClass"):
        method = getattr(exc, getter, None)
        if method is None:
            continue
        try:
            condition = method()
        except Exception:  # noqa: BLE001 - an exception without an error class
            condition = None
        if condition:
            return str(condition)
    return None


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


def schema_and_properties(spark: "SparkSession", table: TableRef) -> tuple[Any, dict[str, str]] | None:
    """The table's schema (a StructType) and properties (its Delta configuration: constraints,
    column mapping, type widening …, and its protocol); None if there is no Delta table.

    What :func:`detail` gives apart from the file statistics, without a Spark job: DESCRIBE DETAIL
    also counts the files and their bytes, which after every commit runs 3 Spark jobs over the
    snapshot's file list (1.1-1.9 s of JVM CPU per epoch into a 1M-row table). The schema and
    ``SHOW TBLPROPERTIES`` come from the snapshot's metadata alone. Spark Connect clean.
    """
    from pyspark.errors import AnalysisException

    if not table.is_path and not spark.catalog.tableExists(table.location):
        return None
    try:
        # Resolving the DataFrame loads the latest snapshot (nothing is read from data files);
        # a path without a Delta table (none, an empty folder, a killed CREATE's empty
        # _delta_log, plain Parquet) fails here with one of the errors _missing knows.
        schema = read_table(spark, table).schema
        rows = spark.sql(f"SHOW TBLPROPERTIES {sql_name(table)}").collect()
    except AnalysisException as exc:
        if _missing(exc):
            return None
        raise
    properties = {str(row["key"]): str(row["value"]) for row in rows}
    # A Delta table always shows its protocol; a catalog table of another format (DESCRIBE
    # DETAIL's format != 'delta') does not, and counts as no table, as in detail().
    if "delta.minReaderVersion" not in properties:
        return None
    return schema, properties


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


def table_state(spark: "SparkSession", table: TableRef, app_id: str, *, spark_only: bool = False) -> TableState:
    """The table's latest version and the txnVersion recorded for ``app_id`` at that version.

    Reads only the Delta log (no data files). A path table is read by delta-rs first
    (:func:`read_txn_without_spark`, milliseconds: this runs before every apply), where its answer
    can be trusted: an S3 table (the same store the Spark cluster writes), or a local path on a
    classic session (the JVM is on this machine). Otherwise, or where delta-rs cannot answer, Spark
    reads the log with DataFrame and SQL calls (Spark Connect clean, 0.6-1.3 s). Both read the same
    SetTransaction actions; ``spark_only`` skips delta-rs (tests compare the two).
    """
    if table.is_path and not spark_only and table.location not in _DELTA_RS_CANNOT and _delta_rs_sees(spark, table):
        fast = read_txn_without_spark(table, app_id)
        if fast is None:
            # Not again for this table in this process (a store or feature delta-rs cannot read
            # may cost a timeout each time): Spark answers from now on.
            _DELTA_RS_CANNOT.add(table.location)
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


_DELTA_RS_CANNOT: set[str] = set()
"""Path tables delta-rs could not read in this process (see :func:`table_state`)."""


def _delta_rs_sees(spark: "SparkSession", table: TableRef) -> bool:
    """Does this process see the table's files as the session's Spark does?

    S3: one store for both. A local path: only when the JVM runs here (classic); a Spark Connect
    server may be another machine, whose disk this process does not see.
    """
    from materializer.spark import is_connect
    from materializer.storage import is_s3

    return is_s3(table.location) or not is_connect(spark)


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
    trusted (see :func:`_delta_rs_sees`); None where it cannot say and Spark must."""
    if not table.is_path or table.location in _DELTA_RS_CANNOT or not _delta_rs_sees(spark, table):
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
        _DELTA_RS_CANNOT.add(table.location)
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


def history(spark: "SparkSession", table: TableRef) -> list[dict[str, Any]]:
    """Commit history, oldest first: version, operation, and our tag (pipeline, binding, epoch)."""
    if not exists(spark, table):
        return []
    rows = spark.sql(f"DESCRIBE HISTORY {sql_name(table)}").select("version", "operation", "userMetadata").collect()
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
    from materializer.errors import TableStateError

    found = detail(spark, table)
    if found is None:
        raise TableStateError(f"table {table.location} does not exist (or is not a Delta table): nothing was written")
    return str(found["location"])


def table_writers(spark: "SparkSession", table: TableRef) -> TableWriters:
    """Read the table's Delta log once: every tag of ours and every transaction id it records.

    The ``_delta_log`` commit files (plus its checkpoints, which keep the transaction ids of
    commits cleaned up since): read in Python (:func:`writers_without_spark`, milliseconds) where
    this process sees the table's files as Spark does (see :func:`_delta_rs_sees`), else one Spark
    job through the DataFrame reader (Spark Connect clean, no JVM internals; 1-2 s). Meant for once
    per run (Open), not per epoch.
    """
    log = table_location(spark, table).rstrip("/") + "/_delta_log"
    if table.is_path and table.location not in _DELTA_RS_CANNOT and _delta_rs_sees(spark, table):
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
        meta = parse_user_metadata(row["userMetadata"])
        if meta is not None and "pipeline" in meta and "binding" in meta:
            key = (str(meta["pipeline"]), str(meta["binding"]))
            version = int(row["version"])
            first, last = tags.get(key, (version, version))
            tags[key] = (min(first, version), max(last, version))
    return TableWriters(tags=tags, app_ids={})


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
                meta = parse_user_metadata((action.get("commitInfo") or {}).get("userMetadata"))
                if meta is not None and "pipeline" in meta and "binding" in meta:
                    key = (str(meta["pipeline"]), str(meta["binding"]))
                    first, last = tags.get(key, (version, version))
                    tags[key] = (min(first, version), max(last, version))
                app = (action.get("txn") or {}).get("appId")
                if app is not None:
                    app_ids[app] = max(app_ids.get(app, -1), version)
        checkpointed: dict[str, int] = {}
        for name in names:
            found = re.fullmatch(r"(\d+)\.checkpoint.*\.parquet", name)
            if found is None:
                continue
            import pyarrow.parquet as pq

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
