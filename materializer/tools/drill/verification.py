"""A round's verification: every table against the oracle (read by Spark or by delta-rs), each
epoch at most once in each table's Delta history, the epoch a table records against the recovery
log's, no orphaned staged file, a log that reads back whole."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from materializer.config import PipelineConfig
from materializer.errors import RecoveryLogError, SourceError
from materializer.tools import oracle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class TableCheck:
    binding: str
    table: str
    verified: bool
    reason: str = ""
    expected_rows: int = 0
    actual_rows: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    lost: list[dict[str, Any]] = field(default_factory=list)
    duplicated: list[dict[str, Any]] = field(default_factory=list)
    wrong: list[dict[str, Any]] = field(default_factory=list)
    recorded_epoch: int | None = None
    """The txnVersion Delta records for the pipeline."""
    expected_epoch: int | None = None
    """The last epoch with input for this binding (oracle), when known."""
    history_epochs: int = 0
    epochs_applied_twice: list[int] = field(default_factory=list)
    epochs_missing: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class Verification:
    round: int
    last_epoch: int = 0
    """The recovery log's last committed epoch."""
    log_entries: int = 0
    log_problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    tables: list[TableCheck] = field(default_factory=list)
    stopped_by: str = ""
    """The run that failed before the sources drained, if one did: the rows were not compared."""

    @property
    def problems(self) -> list[str]:
        out = list(self.log_problems)
        if self.orphans:
            out.append(f"{len(self.orphans)} orphaned file(s) in the staging store: {', '.join(self.orphans[:5])}")
        for t in self.tables:
            out += [f"{t.binding}: {p}" for p in t.problems]
        return out

    @property
    def verdict(self) -> str:
        if self.problems:
            return "FAIL"
        if not self.tables or any(not t.verified for t in self.tables):
            return "not verified"  # (no table at all: nothing was verified)
        return "pass"


def verify(
    config: PipelineConfig, spark: "SparkSession", round_no: int = 1, reader: str = "spark", *, stopped_by: str = ""
) -> Verification:
    """Tables against the oracle, Delta history against the log, staging empty, log whole.

    ``reader``: how the tables' rows are read, ``spark`` (Delta's own reader) or ``deltalake``
    (delta-rs, no JVM: a reader independent of the one that wrote them; path tables only).

    ``stopped_by``: the run that failed before the sources drained (bad input, say). The oracle
    folds every document, the tables hold what was applied before the error: rows missing or
    older than the oracle's are not a loss, so the tables are "not verified" against it (the
    reason names the run), and only what an error cannot explain is checked: a key twice, an
    epoch applied twice, a table ahead of the log, orphans, the log itself."""
    from materializer.delta import history, table_state
    from materializer.tables import TableRef
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    result = Verification(round=round_no, stopped_by=stopped_by)
    log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
    last_commit = None
    try:
        entries = log.entries()
    except RecoveryLogError as exc:
        result.log_problems.append(f"recovery log does not read back: {exc}")
        entries = []
    result.log_entries = len(entries)
    previous = None
    for entry in entries:
        if entry.kind != "commit":
            continue
        if previous is not None:
            recovered = entry.writer.startswith("recover-") and entry.epoch == previous.epoch
            if entry.epoch != previous.epoch + 1 and not recovered:
                result.log_problems.append(
                    f"log sequence {entry.seq} commits epoch {entry.epoch} right after epoch {previous.epoch}"
                )
        previous = last_commit = entry
    seqs = [e.seq for e in entries]
    if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        result.log_problems.append(f"log sequence numbers have a gap: {seqs}")
    result.last_epoch = last_commit.epoch if last_commit else 0
    if config.templates:
        from materializer import templates

        # The bindings the templates made (a sub-folder, a topic, a routed value each), as the last
        # committed epoch covers them: each of their tables is verified like a declared one's.
        config = templates.expand(config, {}, templates.recorded_set(last_commit), epoch=result.last_epoch).config

    # Orphans are what no run will ever delete: files of the staging area that the next Open
    # keeps although no committed entry needs them (applied epochs' staged files, files outside
    # the areas Open cleans). What a run killed or fenced after the last Open left in staged/,
    # spool/ or _tmp/ (or as a temp file in the log) is the next Open's to delete, not a leak.
    from materializer.staging import StagingArea, dataset_of

    area = StagingArea.of(config)
    pending = last_commit.driver_checkpoint if last_commit is not None else None
    _cleaned, kept = area.open_cleans(pending)
    needed = set()
    if pending is not None:
        for name, staged in pending.staged.items():
            binding = next((b for b in config.bindings if b.name == name), None)
            recorded = table_state(spark, TableRef(binding.table), config.pipeline_id).txn_version if binding else None
            if staged is not None and (recorded or 0) < pending.epoch:
                needed.add(staged.uri)  # committed, not yet applied: the next run applies it
    result.orphans = [p for p in kept if dataset_of(p) not in needed]
    result.orphans += area.outside_areas()

    # Bindings with dead letters: what the pipeline set aside is left out of the oracle's fold, and
    # each set-aside document must be in the dead-letter table once.
    set_aside: dict[str, frozenset[tuple[Any, ...]]] = {}
    problems: dict[str, list[str]] = {b.name: [] for b in config.bindings}
    for binding in config.bindings:
        if binding.on_invalid == "dead_letter" and binding.dead_letters:
            lines = _set_aside(spark, binding, reader)
            set_aside[binding.name] = frozenset(lines)
            twice = sorted(":".join(str(part) for part in where) for where, times in lines.items() if times > 1)
            if twice:
                problems[binding.name].append(f"dead letters set aside more than once: {', '.join(twice[:10])}")
    expectations: dict[str, oracle.Expected] = {}
    for binding in config.bindings:
        try:
            expectations[binding.name] = oracle.expected(binding, config.transaction.max_documents, set_aside.get(binding.name))
        except SourceError as exc:
            if binding.name in set_aside and not stopped_by:
                problems[binding.name].append(f"a document neither landed nor set aside: {exc}")
            elif not stopped_by:
                raise
            # The input the run stopped at may be what the oracle cannot read either (not JSON).
            expectations[binding.name] = oracle.Expected(
                binding=binding.name, verified=False, reason=f"the oracle cannot read the input either: {exc}"
            )
    known = [e.epochs for e in expectations.values() if e.verified and e.epochs is not None]
    if not stopped_by and len(known) == len(config.bindings) and max(known, default=0) != result.last_epoch:
        result.log_problems.append(
            f"the recovery log ends at epoch {result.last_epoch}; the sources make {max(known, default=0)} epochs"
        )
    for binding in config.bindings:
        exp = expectations[binding.name]
        ref = TableRef(binding.table)
        state = table_state(spark, ref, config.pipeline_id)
        rows: list[dict[str, Any]] = []
        if state.exists and reader == "deltalake" and ref.is_path:
            rows = _rows_by_delta_rs(ref.location)
        elif state.exists:
            df = spark.read.format("delta").load(ref.location) if ref.is_path else spark.table(ref.location)
            # A drill table is small; the oracle is plain Python, so the rows come to the driver.
            rows = [r.asDict(recursive=True) for r in df.collect()]
        cmp = oracle.compare(exp, rows, binding.key)
        counted = ("duplicated",) if stopped_by else ("lost", "duplicated", "wrong")
        check = TableCheck(
            binding=binding.name,
            table=str(ref),
            verified=exp.verified and not stopped_by,
            reason=f"{stopped_by}; the oracle covers all of the input" if stopped_by and exp.verified else exp.reason,
            expected_rows=cmp.expected_rows,
            actual_rows=cmp.actual_rows,
            counts={k: n for k, n in cmp.counts.items() if k in counted},
            lost=cmp.lost if "lost" in counted else [],
            duplicated=cmp.duplicated,
            wrong=cmp.wrong if "wrong" in counted else [],
            recorded_epoch=state.txn_version,
            expected_epoch=exp.epochs if exp.verified and not stopped_by else None,
        )
        check.problems += problems[binding.name]
        for kind in counted:
            if cmp.counts[kind]:
                keys = ", ".join(json.dumps(d["key"]) for d in getattr(cmp, kind)[:10])
                check.problems.append(f"{cmp.counts[kind]} row(s) {kind} (keys {keys})")
        tagged = [
            h["tag"]["epoch"]
            for h in history(spark, ref)
            if h["tag"] and h["tag"].get("pipeline") == config.pipeline_id and h["tag"].get("binding") == binding.name
        ]
        check.history_epochs = len(tagged)
        check.epochs_applied_twice = sorted(e for e, n in Counter(tagged).items() if n > 1)
        if check.epochs_applied_twice:
            check.problems.append(f"Delta history holds epochs {check.epochs_applied_twice} more than once")
        recorded = state.txn_version or 0
        if tagged and max(tagged) != recorded:
            check.problems.append(f"history's last epoch {max(tagged)} differs from the txn version {recorded}")
        if recorded > result.last_epoch:
            check.problems.append(f"table records epoch {recorded}, beyond the log's last epoch {result.last_epoch}")
        if stopped_by:
            pass  # epochs after the error were never made: nothing to say about missing ones
        elif exp.verified and exp.epochs is not None:
            check.epochs_missing = sorted(set(range(1, exp.epochs + 1)) - set(tagged))
            if check.epochs_missing:
                check.problems.append(f"Delta history lacks epochs {check.epochs_missing[:20]}")
            if recorded != exp.epochs:
                check.problems.append(f"table records epoch {recorded}; its source's input ends at epoch {exp.epochs}")
        elif last_commit and last_commit.driver_checkpoint and binding.name in last_commit.driver_checkpoint.staged:
            # (its last epoch with rows: an epoch without any makes no commit on its table)
            want = last_commit.driver_checkpoint.table_records(binding.name)
            if recorded != want:
                check.problems.append(f"table records epoch {recorded}; the log says {want} (its last epoch is {result.last_epoch})")
        result.tables.append(check)
    return result


def _set_aside(spark: "SparkSession", binding: Any, reader: str) -> Counter[tuple[Any, ...]]:
    """What a binding set aside, counted, from its dead-letter table (none yet: empty): the
    (file, line) of a files source's documents, the (topic, partition, offset) of a topic's records."""
    from materializer.delta import table_state
    from materializer.tables import TableRef

    ref = TableRef(binding.dead_letters)
    if not table_state(spark, ref, "").exists:
        return Counter()
    # Where each document came from, not the documents: a dead-letter table keeps every rejected
    # line or record whole, and a shared one every binding's.
    where = ("topic", "partition", "offset") if binding.source.format == "kafka" else ("source", "line")
    if reader == "deltalake" and ref.is_path:
        rows = _rows_by_delta_rs(ref.location, ("binding", *where))
    else:
        from pyspark.sql import functions as F

        df = spark.read.format("delta").load(ref.location) if ref.is_path else spark.table(ref.location)
        rows = [r.asDict() for r in df.where(F.col("binding") == binding.name).select("binding", *where).collect()]
    mine = [r for r in rows if r["binding"] == binding.name]
    if binding.source.format == "kafka":
        return Counter((str(r["topic"]), int(r["partition"]), int(r["offset"])) for r in mine)
    # The source column is the file's URI; the files are the source folder's own (top level).
    return Counter((str(r["source"]).rsplit("/", 1)[-1], int(r["line"])) for r in mine)


def _rows_by_delta_rs(location: str, columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """A path table's rows (``columns`` of them, or all) read by delta-rs (deltalake), not by the
    Spark that wrote them, through its QueryBuilder, which applies deletion vectors
    (``to_pyarrow_table`` refuses such a table)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder  # a core dependency (status reads the Delta log with it)

    path = location[len("file:") :] if location.startswith("file:") else location
    # Quoted: DataFusion folds unquoted names to lower case, and "partition" and "offset" are keywords.
    selected = ", ".join('"' + c.replace('"', '""') + '"' for c in columns) if columns else "*"
    reader = QueryBuilder().register("t", DeltaTable(path)).execute(f"SELECT {selected} FROM t")
    return pa.table(reader.read_all()).to_pylist()
