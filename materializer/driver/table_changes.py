"""What others did to a table since the pipeline's last commit to it, checked once per run at Open,
before anything is read or written (docs: 'Sharing the table with maintenance and people').

* table features the materializer cannot write idempotently through the table's files: a commit
  coordinator's or a catalog's commits (``coordinatedCommits-preview``; ``catalogManaged`` named
  by path) may not be in ``_delta_log`` yet, where Open reads the txn versions and the writers;
* a column renamed or dropped (column mapping) whose old name the binding still lands: the next
  epoch would write it into a new column of that name, or bring the dropped one back;
* ``others_may_write: false``: a commit not ours that changed rows (DELETE, UPDATE, MERGE, WRITE …;
  not OPTIMIZE, VACUUM, auto compaction, nor an ALTER's metadata-only commits).

Only the commits after our last one are read (a handful at most, between two runs), and only
where a check needs them (column mapping on, or ``others_may_write: false``): the log's commit
files in Python where this process sees the table's files as Spark does, else one
``DESCRIBE HISTORY``.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from materializer.config import BindingConfig
from materializer.delta import ROW_OPERATIONS, TableRef, TableWriters, parse_user_metadata, sql_name, table_location
from materializer.delta.trust import DELTA_RS_CANNOT, delta_rs_sees
from materializer.errors import TableStateError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COORDINATED = ("coordinatedCommits-preview",)
"""Table features whose commits a commit coordinator holds before they reach ``_delta_log``."""
CATALOG_MANAGED = ("catalogManaged", "catalogOwned-preview")
"""Table features whose commits the catalog (Unity Catalog) holds: written by catalog name only."""

# ROW_OPERATIONS (materializer.delta): operations that change rows, for a history read without the
# commits' actions (a catalog table), where ``dataChange`` cannot be seen. Read from the log, a
# commit changes rows when one of its ``add`` or ``remove`` actions has ``dataChange: true``
# (OPTIMIZE, auto compaction, a row tracking backfill and REORG rewrite files with
# ``dataChange: false``; an ALTER writes metadata only).


@dataclass(frozen=True)
class Commit:
    """One commit of the table's log, as this check needs it."""

    version: int
    operation: str
    timestamp: int | None
    """Milliseconds since the epoch (the commit's ``timestamp``, or its in-commit timestamp)."""
    user: str | None
    parameters: dict[str, Any] = field(default_factory=dict)
    changes_rows: bool = False
    tag: dict[str, Any] | None = None
    """Our ``userMetadata`` tag (pipeline, binding, epoch), None for anyone else's commit."""

    def shown(self) -> str:
        when = (
            datetime.datetime.fromtimestamp(self.timestamp / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            if self.timestamp is not None else "an unknown time"
        )
        who = f" by {self.user}" if self.user else ""
        return f"version {self.version} ({self.operation} at {when}{who})"


def last_own_version(writers: TableWriters, pipeline: str, binding: BindingConfig) -> int | None:
    """The table's last version tagged by this binding (or a name it had before); None if none."""
    ours = {binding.name, *binding.previous_names}
    return max((last for (p, b), (_first, last) in writers.tags.items() if p == pipeline and b in ours), default=None)


def check(
    spark: "SparkSession", binding: BindingConfig, table: TableRef, properties: dict[str, str], schema: Any,
    writers: TableWriters, pipeline: str,
) -> None:
    """Raise :class:`TableStateError` for what the pipeline must not write over (module docstring)."""
    _check_features(binding, table, properties)
    mapped = str(properties.get("delta.columnMapping.mode", "none")).lower() not in ("none", "")
    if binding.others_may_write and not mapped:
        return  # no rename or drop without column mapping, and others' rows are allowed: nothing to read
    since = last_own_version(writers, pipeline, binding)
    if since is None:
        return  # nothing of ours yet: the writers' check (adopt_table) said what may be written over
    commits = [c for c in commits_after(spark, table, since) if not _ours(c, pipeline, binding)]
    if not commits:
        return
    _check_columns(binding, schema, commits)
    if not binding.others_may_write:
        _check_rows(binding, since, commits)


def _ours(commit: Commit, pipeline: str, binding: BindingConfig) -> bool:
    tag = commit.tag
    return tag is not None and tag.get("pipeline") == pipeline and tag.get("binding") in {binding.name, *binding.previous_names}


def _features(properties: dict[str, str]) -> set[str]:
    return {k[len("delta.feature."):].lower() for k, v in properties.items() if k.lower().startswith("delta.feature.")}


def _check_features(binding: BindingConfig, table: TableRef, properties: dict[str, str]) -> None:
    features = _features(properties)
    coordinated = [f for f in COORDINATED if f.lower() in features]
    coordinator = next((v for k, v in properties.items() if k.lower().startswith("delta.coordinatedcommits.commitcoordinator")), None)
    if coordinated or coordinator:
        raise TableStateError(
            f"binding {binding.name!r}: table {binding.table} has coordinated commits "
            f"({'table feature ' + coordinated[0] if coordinated else 'commit coordinator ' + repr(coordinator)}): its "
            "newest commits are held by a commit coordinator until they are copied into _delta_log, where Open reads "
            "the epoch the table records and who wrote it, and where delta-rs reads the table. An epoch already "
            "applied could look unapplied, and another writer's commits go unseen. Write a table without it (ALTER "
            "TABLE … DROP FEATURE `coordinatedCommits-preview`, with no coordinator set), or give the binding another "
            "table. Nothing was written."
        )
    managed = [f for f in CATALOG_MANAGED if f.lower() in features]
    if managed and table.is_path:
        raise TableStateError(
            f"binding {binding.name!r}: table {binding.table} is catalog-managed (table feature {managed[0]}): its "
            "commits go through the catalog that owns it (Unity Catalog), and a write by path would bypass it or be "
            "refused. Name the table by its catalog name (catalog.schema.table) in the binding's `table`. Nothing "
            "was written."
        )


PATH_BLOCKED = "DELTA_PATH_BASED_ACCESS_TO_CATALOG_MANAGED_TABLE_BLOCKED"
"""delta-spark's refusal (4.1 and later) to read or write a catalog-managed table by its path."""


def raise_refused_access(binding: BindingConfig, exc: BaseException) -> None:
    """Raise the catalog-managed refusal for Delta's own blocking of path access; else return."""
    if PATH_BLOCKED in str(exc):
        raise TableStateError(
            f"binding {binding.name!r}: table {binding.table} is catalog-managed, and Delta refuses access to it by "
            f"path ({PATH_BLOCKED}): its commits go through the catalog that owns it (Unity Catalog). Name the table "
            "by its catalog name (catalog.schema.table) in the binding's `table`. Nothing was written."
        ) from exc


def _landing(binding: BindingConfig, name: str) -> bool:
    """Does a top-level field ``name`` of the source land in the table (column control)?"""
    if name in binding.key:
        return True
    if binding.columns is not None and name not in binding.columns:
        return False
    return name not in binding.except_columns


def _has_path(schema: Any, path: str) -> bool:
    from pyspark.sql.types import StructType

    here: Any = schema
    for part in path.split("."):
        if not isinstance(here, StructType):
            return False
        match = {f.name.lower(): f for f in here.fields}.get(part.lower())
        if match is None:
            return False
        here = match.dataType
    return True


def _check_columns(binding: BindingConfig, schema: Any, commits: list[Commit]) -> None:
    """A column renamed or dropped since our last commit whose old name still lands: refused.

    Renames are followed through (``a`` → ``b`` → ``c`` is ``a`` renamed to ``c``; renamed back,
    nothing): what counts is each name the table had at our last commit and what it is now."""
    now: dict[str, tuple[str | None, str]] = {}
    """A path the table had at our last commit -> its path now (None: dropped), and the commit."""
    for commit in commits:
        params = commit.parameters
        if commit.operation == "RENAME COLUMN":
            changes = [(str(params.get("oldColumnPath", "")).strip("`"), str(params.get("newColumnPath", "")).strip("`"))]
        elif commit.operation in ("DROP COLUMN", "DROP COLUMNS"):
            changes = [(p.strip("`"), None) for p in _names(params.get("columns"))]
        else:
            continue
        for old, new in changes:
            origin = next((o for o, (current, _c) in now.items() if current is not None and current.lower() == old.lower()), old)
            now[origin] = (new, commit.shown())
    gone: list[tuple[str, str]] = []
    for path, (current, where) in now.items():
        if current is not None and current.lower() == path.lower():
            continue  # renamed back
        if path and not _has_path(schema, path) and _landing(binding, path.split(".")[0]):
            gone.append((path, f"renamed to {current!r} in {where}" if current is not None else f"dropped in {where}"))
    if not gone:
        return
    described = "; ".join(f"column {p!r} was {w}" for p, w in gone)
    names = sorted({p.split(".")[0] for p, _w in gone})
    nested = sorted({p.split(".")[0] for p, _w in gone if "." in p})
    if nested:
        described += (
            f" (inside {', '.join(repr(n) for n in nested)}: excluding it stops the whole column from landing, so "
            "undoing the ALTER may be the better way)"
        )
    raise TableStateError(
        f"binding {binding.name!r}: table {binding.table}: {described}, but the binding still lands "
        f"{', '.join(repr(n) for n in names)} from its source. The next epoch would write those values into a new "
        "column of the old name (or bring the dropped column back), not into the renamed one. Either add "
        f"`except_columns: [{', '.join(names)}]` to the binding (the old name no longer lands; after a rename, a "
        "source that sends the new name lands in the renamed column), or undo the ALTER. If the last committed "
        "epoch is not applied yet, its rows were staged with the old name: undo the ALTER, run once with "
        "`--max-epochs 0`, then ALTER again. Nothing was written."
    )


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


def _check_rows(binding: BindingConfig, since: int, commits: list[Commit]) -> None:
    changed = [c for c in commits if c.changes_rows]
    if not changed:
        return
    shown = "; ".join(c.shown() for c in changed[:3]) + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")
    raise TableStateError(
        f"binding {binding.name!r}: table {binding.table} has rows changed by commits not of this pipeline since its "
        f"last commit (version {since}): {shown}. The binding sets `others_may_write: false`, so the run stops "
        "before it writes over them. Check the change; to keep it, set `others_may_write: true` on the binding "
        "until the pipeline's next epoch is applied (later runs check only the commits after that one), or undo it "
        "(e.g. RESTORE TABLE … TO VERSION AS OF "
        f"{since}, then run once with `others_may_write: true`). Nothing was written."
    )


def commits_after(spark: "SparkSession", table: TableRef, version: int) -> list[Commit]:
    """The table's commits after ``version``, oldest first."""
    if table.is_path and table.location not in DELTA_RS_CANNOT and delta_rs_sees(spark, table):
        found = _commits_from_log(table_location(spark, table).rstrip("/") + "/_delta_log", version)
        if found is not None:
            return found
    return _commits_from_history(spark, table, version)


def _commits_from_log(log: str, after: int) -> list[Commit] | None:
    """The log's commit files after ``after``, read in Python; None where this process cannot."""
    from materializer.storage import open_store

    try:
        store = open_store(log[len("file:"):] if log.startswith("file:") else log)
        names = sorted(
            (int(m.group(1)), info.path)
            for info in store.list("")
            if "/" not in info.path
            for m in [re.fullmatch(r"(\d+)\.json", info.path)]
            if m is not None and int(m.group(1)) > after
        )
        out = []
        for version, name in names:
            info: dict[str, Any] = {}
            changes = False
            for line in store.get(name).splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                if "commitInfo" in action:
                    info = action["commitInfo"] or {}
                for kind in ("add", "remove"):
                    if kind in action and (action[kind] or {}).get("dataChange", True):
                        changes = True
            out.append(Commit(
                version=version,
                operation=str(info.get("operation", "")),
                timestamp=info.get("inCommitTimestamp", info.get("timestamp")),
                user=info.get("userName"),
                parameters=dict(info.get("operationParameters") or {}),
                changes_rows=changes,
                tag=_tag(info.get("userMetadata")),
            ))
        return out
    except Exception:  # noqa: BLE001 - a store this process cannot read as Spark does: Spark reads
        return None


def _commits_from_history(spark: "SparkSession", table: TableRef, after: int) -> list[Commit]:
    from pyspark.sql import functions as F

    rows = (
        spark.sql(f"DESCRIBE HISTORY {sql_name(table)}")
        .where(F.col("version") > after)
        .select("version", "timestamp", "userName", "operation", "operationParameters", "userMetadata")
        .collect()
    )
    out = []
    for row in sorted(rows, key=lambda r: int(r["version"])):
        stamp = row["timestamp"]
        out.append(Commit(
            version=int(row["version"]),
            operation=str(row["operation"] or ""),
            timestamp=int(stamp.timestamp() * 1000) if stamp is not None else None,
            user=row["userName"],
            parameters=dict(row["operationParameters"] or {}),
            changes_rows=str(row["operation"] or "") in ROW_OPERATIONS,
            tag=_tag(row["userMetadata"]),
        ))
    return out


def _tag(value: str | None) -> dict[str, Any] | None:
    meta = parse_user_metadata(value)
    return meta if meta is not None and "pipeline" in meta and "binding" in meta else None
