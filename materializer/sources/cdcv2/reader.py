"""CDC v2 statements read by Spark, from files or records alike: scanned, taken in complete times, consolidated per key.

Where the work happens (DESIGN.md invariant 8): every update lives in Spark DataFrames (parsed as
VARIANT, deduplicated, counted per time, consolidated per key). Python holds only the progress
bookkeeping (:mod:`~materializer.sources.cdcv2.progress`): the progress statements (few), one
count per time, and the frontier.

A keyed Delta table holds at most one row per key, so per key the epoch's updates are consolidated
(diffs summed per distinct row) into one upsert, one delete, or nothing (net zero). Input that
cannot be read that way is corrupt and stops the run with a :class:`SourceError` naming the file,
the statement and the time, before anything of the epoch is staged; every earlier complete time
has been applied by then, so fixing the input and running again continues from there.

:class:`CdcV2Reader` is shared by the cdcv2 source (a folder's files) and the kafka ``cdcv2``
payload (a topic's records), each giving its seams.
"""

from __future__ import annotations

import json
import logging
import sys
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from materializer.columns import DELTA_INVALID, OP, SEQ
from materializer.config import BindingConfig
from materializer.errors import SourceError
from materializer.sources import Source, SourceBatch
from materializer.sources.cdcv2.progress import FIX, START, EpochPlan, Origin, Problem, Progress, parse_progress, plan_epoch, track
from materializer.sources.cdcv2.statements import lookup, statements
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("materializer")


@dataclass
class Scan:
    """What one reading of the files found; reused while the listing is unchanged."""

    listing: tuple[tuple[str, int], ...]
    frontier: int
    """Updates below this time were dropped: the scan serves checkpoints at or above it."""
    updates: "DataFrame"
    """Every update triple at or above ``frontier`` with its file and statement text (not cached)."""
    distinct: "DataFrame"
    """Distinct (key, data, time, diff) at or above ``frontier``; persisted."""
    progress: list[Progress]
    received: dict[int, int]
    conflicts: list[Problem]
    bad_files: dict[str, str] = field(default_factory=dict)
    """``on_invalid: dead_letter``: Spark's URI -> name of each file holding malformed statements."""
    bad_progress: dict[str, str] = field(default_factory=dict)
    """``on_invalid: dead_letter``: the text of each malformed progress statement -> the rule it breaks."""
    bad: bool = False
    """``on_invalid: dead_letter``: the reading holds malformed statements."""



class CdcV2Reader(Source):
    """CDC v2 statements read by Spark, wherever they come from (the seams below: a folder's files,
    a topic's records): the scan, complete times taken in order, the frontier as the checkpoint."""

    _per_file = True
    """Dead letters are found by file (a record's name is not a file: kafka's payload says False)."""

    def __init__(self, binding: BindingConfig, spool: Store) -> None:
        super().__init__(binding, spool)
        # The last reading of the statements, kept across the epochs of one run (see _scan_for).
        self._scan: Scan | None = None

    # --- the seams: where the statements come from ---

    @property
    @abstractmethod
    def label(self) -> str:
        """The input named in messages: the folder, or a topic's address."""

    @abstractmethod
    def _lines(self, spark: "SparkSession", listing: tuple[tuple[str, int], ...]) -> "DataFrame":
        """The statements' text (``value``) and where each is (``file``), blank ones left out."""

    @abstractmethod
    def _name(self, spark_uri: str, names: Sequence[str]) -> str:
        """The name messages give the ``file`` of :meth:`_lines` (``names``: the listing's)."""

    def _relative(self, spark_uri: str, names: Sequence[str]) -> str:
        """What a checkpoint keeps of a file holding malformed statements (with ``_per_file`` only)."""
        return self._name(spark_uri, names)

    @abstractmethod
    def _locate(self, origin: Origin) -> Origin:
        """The origin with its line number where there is one (error paths only)."""

    @abstractmethod
    def _scan_for(self, spark: "SparkSession", frontier: int) -> Scan | None:
        """The reading that serves ``frontier``: the last one while its input is unchanged, else a new
        :meth:`_read` (None: no input yet)."""

    @abstractmethod
    def _dead_letters(
        self, spark: "SparkSession", scan: Scan, checkpoint: dict[str, Any] | None, until: dict[str, Any] | None
    ) -> "tuple[DataFrame | None, int, dict[str, Any]]":
        """``on_invalid: dead_letter``: the malformed statements this epoch sets aside, their number,
        and what the checkpoint keeps of them."""

    def _error(self, problem: Problem, checkpoint: Any) -> SourceError:
        located = [self._locate(o) for o in problem.origins]
        names = [f"{o.describe()} ({_excerpt(o.text)})" for o in located]
        names += ["(unknown statement)"] * 2
        message = problem.message.format(*names)
        where = located[0] if located else None
        return SourceError(
            f"{self.label}: corrupt CDC v2 input at time {problem.time}: {message}. "
            f"Binding {self.binding.name!r} stands at frontier {(checkpoint or {}).get('frontier', START)}: "
            f"the complete times before it are in the table, nothing at or after it is. {FIX}",
            file=where.file if where else None,
            line=where.line if where else None,
        )

    # --- reading ---

    # --- reading ---

    def _read(self, spark: "SparkSession", listing: tuple[tuple[str, int], ...], frontier: int) -> Scan:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        names = [name for name, _ in listing]
        dead_letter = self.binding.on_invalid == "dead_letter"
        parsed = statements(self._lines(spark, listing).select("file", "value"), self.binding.key)

        # posexplode_outer keeps progress and malformed lines (u is NULL): one plan, so the
        # validation and the progress statements come out of one pass over the files.
        triples = parsed.select("file", "value", "problem", "is_progress", F.posexplode_outer("updates").alias("position", "u"))
        arr = F.try_variant_get("u", "$", "array<variant>")
        data_map = F.try_variant_get(arr[0], "$", "map<string,variant>")
        keys = [F.try_element_at(data_map, F.lit(k)) for k in self.binding.key]
        exploded = triples.select(
            "file",
            "value",
            "is_progress",
            "problem",
            F.to_json(F.array(*keys)).alias("key"),
            F.to_json(arr[0]).alias("data"),
            F.try_variant_get(arr[1], "$", "bigint").alias("time"),
            F.try_variant_get(arr[2], "$", "bigint").alias("diff"),
        )

        # Job 1 (one pass, one row out): the first malformed statement, if any (an error whatever
        # its time), and the distinct progress statements, which are few.
        # With on_invalid: dead_letter, the names of the files holding malformed statements (a
        # few names, never rows; the kafka payload's "files" are records: it finds them again).
        meta = exploded.agg(
            F.min(F.when(F.col("problem").isNotNull(), F.struct("file", "value", "problem"))).alias("bad"),
            F.collect_set(F.when(F.col("is_progress"), F.struct("value", "file"))).alias("progress"),
            *([F.collect_set(F.when(F.col("problem").isNotNull(), F.col("file"))).alias("bad_files")] if dead_letter and self._per_file else []),
        ).collect()[0]
        bad_files = {f: self._relative(f, names) for f in (meta["bad_files"] or [])} if dead_letter and self._per_file else {}
        if meta["bad"] is not None and not dead_letter:
            row = meta["bad"]
            origin = self._locate(Origin(self._name(row["file"], names), row["value"]))
            raise SourceError(
                f"{origin.describe()}: malformed CDC v2 statement: {row['problem']} ({_excerpt(row['value'])}). "
                'Statements are {"updates": [[data, time, diff], ...]} with data a JSON object holding the '
                f"key fields {self.binding.key}, or {{\"progress\": {{...}}}}. {FIX}",
                file=origin.file,
                line=origin.line,
            )
        progress = []
        first_file: dict[str, str] = {}
        for row in meta["progress"]:
            first_file[row["value"]] = min(first_file.get(row["value"], row["file"]), row["file"])
        bad_progress: dict[str, str] = {}
        for text, file in sorted(first_file.items()):
            origin = Origin(self._name(file, names), text)
            body = json.loads(text)["progress"]
            try:
                progress.append(parse_progress(body, origin))
            except SourceError as error:
                if dead_letter:
                    # Set aside (every copy of it): the times it alone would cover wait.
                    bad_progress[text] = getattr(error, "rule", str(error))
                    if self._per_file:
                        bad_files.update({f: self._relative(f, names) for t, f in meta["progress"] if t == text})
                    continue
                parse_progress(body, self._locate(origin))  # raises again, now naming the line
                raise

        # A malformed statement (on_invalid: dead_letter) counts for nothing: none of its updates is read.
        current = exploded.where((F.col("time") >= frontier) & F.col("problem").isNull()).select(
            "file", "value", "key", "data", "time", "diff"
        )
        # Duplicates (the same triple in several statements or files) are absorbed here; kept
        # (memory and disk) for the epochs of this run while the files are unchanged.
        distinct = current.select("key", "data", "time", "diff").distinct().persist(StorageLevel.MEMORY_AND_DISK)

        # Job 2: per time, the distinct updates (the counts to meet) and the rows with more than
        # one diff (corrupt). One small row per time reaches Python.
        per_time = (
            distinct.groupBy("data", "time").agg(F.count(F.lit(1)).alias("n"))
            .groupBy("time").agg(F.sum("n").alias("n"), F.sum(F.when(F.col("n") > 1, 1).otherwise(0)).alias("conflicts"))
            .collect()
        )
        received = {int(r["time"]): int(r["n"]) for r in per_time}
        conflicts = []
        for t in sorted(int(r["time"]) for r in per_time if r["conflicts"]):
            row = (
                distinct.where(F.col("time") == t).groupBy("data").agg(F.count(F.lit(1)).alias("n"))
                .where("n > 1").orderBy("data").limit(1).collect()[0]
            )
            found = (
                current.where((F.col("data") == row["data"]) & (F.col("time") == t))
                .groupBy("diff").agg(F.min(F.struct("file", "value")).alias("at")).orderBy("diff").collect()
            )
            origins = tuple(Origin(self._name(r["at"]["file"], names), r["at"]["value"]) for r in found)
            diffs = [r["diff"] for r in found]
            conflicts.append(
                Problem(
                    t,
                    f"row {_lit(row['data'])} has {len(diffs)} different diffs at time {t} "
                    f"({', '.join(map(str, diffs))}): {{0}} and {{1}} disagree, and a row changes at most "
                    "once per time",
                    origins,
                )
            )
            break  # the earliest is the one that stops the run
        bad = dead_letter and (meta["bad"] is not None or bool(bad_progress))
        return Scan(listing, frontier, current, distinct, progress, received, conflicts, bad_files, bad_progress, bad)

    # --- epochs ---

    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str,
        *, until: dict[str, Any] | None = None,
    ) -> SourceBatch | None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        frontier = (checkpoint or {}).get("frontier", START)
        if frontier is None:
            return None  # the stream has ended: an empty upper frontier was reached
        frontier = int(frontier)
        scan = self._scan_for(spark, frontier)
        if scan is None:
            return None  # no files yet
        received = {t: n for t, n in scan.received.items() if t >= frontier}
        tracking = track(frontier, scan.progress, received)
        # Two diffs for one (data, time) also break that time's count: name the root cause first.
        problems = sorted([p for p in scan.conflicts if p.time >= frontier] + tracking.problems, key=lambda p: p.time)
        limit = tracking.complete
        if problems:
            limit = problems[0].time if limit is None else min(limit, problems[0].time)
        if until is not None:
            # recover: exactly the committed epoch's times, whatever arrived since (its times were
            # complete then, so they are now: the epoch ends where the log says it did; None: it
            # ended the stream, so it took every time left).
            max_documents = sys.maxsize
            if until.get("frontier", START) is not None:
                cap = int(until.get("frontier", START))
                limit = cap if limit is None else min(limit, cap)
        plan = plan_epoch(frontier, limit, received, max_documents)
        if plan is None and problems:
            raise self._error(problems[0], checkpoint)
        # on_invalid: dead_letter: the malformed statements not set aside by an earlier epoch.
        rejected, rejected_count, set_aside = self._dead_letters(spark, scan, checkpoint, until)
        if plan is None:
            if rejected_count:
                # No complete time, but statements to set aside: an epoch of dead letters only,
                # so they land now (and a time waiting for a corrected statement is visible).
                return SourceBatch(
                    documents=spark.range(0).select(
                        *[F.lit(None).alias(k) for k in self.binding.key], F.lit("u").alias(OP), F.lit(0).cast("long").alias(SEQ)
                    ),
                    checkpoint={"frontier": frontier, **set_aside},
                    count=0,
                    description=f"no complete time at frontier {frontier} of {self.label}; "
                    f"{rejected_count} malformed statement(s) set aside as dead letters",
                    rejected=rejected,
                    rejected_count=rejected_count,
                )
            if scan.bad and tracking.complete is not None and (tracking.progress is None or tracking.complete < tracking.progress):
                log.warning(
                    "%s: waiting at frontier %s; malformed statements were set aside as dead letters: a time whose "
                    "count needs their updates completes once corrected statements arrive", self.label, frontier,
                )
            if tracking.progress == frontier and scan.progress and min(p.lower for p in scan.progress) > frontier:
                # Not an error (the statement may still arrive), but a writer whose times start
                # above 0 would wait forever: say so.
                log.warning(
                    "%s: waiting at frontier %s: no progress statement starts at or before it (the earliest "
                    "starts at %s); CDC v2 progress starts at time %s",
                    self.label, frontier, min(p.lower for p in scan.progress), START,
                )
            return None

        last = plan.times[-1]
        epoch = scan.distinct.where((F.col("time") >= frontier) & (F.col("time") <= last))
        # Per key and distinct row: the net diff over the epoch's times (their sum is the change
        # of the row's multiplicity from the last frontier to the new one).
        net = epoch.groupBy("key", "data").agg(F.sum("diff").alias("n"), F.max("time").alias("t")).where("n != 0")
        # Per key: how many distinct rows net added / retracted, and the one row to write: the
        # added row (upsert) or else the retracted one (delete; the whole row, so an epoch of
        # deletes still carries the table's column types). max(struct) puts the highest net first.
        per_key = (
            net.groupBy("key")
            .agg(
                F.sum(F.when(F.col("n") > 0, 1).otherwise(0)).alias("added"),
                F.sum(F.when(F.col("n") < 0, 1).otherwise(0)).alias("removed"),
                F.max(F.abs("n")).alias("most"),
                F.max("t").alias("t"),
                F.max(F.struct("n", "data")).alias("pick"),
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        try:
            ambiguous = (F.col("added") > 1) | (F.col("removed") > 1) | (F.col("most") > 1)
            check = per_key.agg(
                F.count(F.lit(1)).alias("keys"),
                F.min(F.when(ambiguous, F.struct("t", "key", "added", "removed", "most"))).alias("bad"),
            ).collect()[0]
            if check["bad"] is not None:
                raise self._ambiguous(scan, check["bad"], frontier, plan, checkpoint)
            rows = per_key.select(
                F.when(F.col("pick.n") > 0, F.lit("u")).otherwise(F.lit("d")).alias("op"), F.col("pick.data").alias("data")
            )
            if check["keys"] == 0:
                # Every touched row nets to zero: nothing to write, but the frontier still advances.
                # Spool the rows anyway (marked 'n', dropped on reading) so Spark infers their types.
                rows = epoch.select(F.lit("n").alias("op"), "data").distinct()
            spool_uri = self.spool.spark_path(spool_path)
            line = F.concat(F.lit('{"%s":0,"%s":"' % (SEQ, OP)), F.col("op"), F.lit('","d":'), F.col("data"), F.lit("}"))
            rows.select(line.alias("value")).write.mode("overwrite").text(spool_uri)
        finally:
            per_key.unpersist()

        first, end = plan.times[0], plan.frontier
        return SourceBatch(
            documents=_dataframe(spark, spool_uri, self.label),
            checkpoint={"frontier": end, **set_aside},
            count=plan.count,
            description=(
                f"{_span(first, last)} of {self.label}, "
                f"frontier {frontier} -> {'end' if end is None else end}"
                + (f"; {rejected_count} malformed statement(s) set aside as dead letters" if rejected_count else "")
            ),
            rejected=rejected,
            rejected_count=rejected_count,
        )

    # --- dead letters ---

    # --- dead letters and errors ---

    @staticmethod
    def _rejected(checked: "DataFrame", scan: Scan) -> "DataFrame":
        """The malformed statements of ``checked`` (a :func:`~materializer.sources.cdcv2.statements.statements` DataFrame) with their ``reason``."""
        from pyspark.sql import functions as F

        reason = F.coalesce(F.col("problem"), lookup(scan.bad_progress, F.col("value")))
        return checked.where(reason.isNotNull()).withColumn("reason", reason)

    def _key_text(self, key_json: str) -> str:
        try:
            values = json.loads(key_json)
            return ", ".join(f"{k}={json.dumps(v)}" for k, v in zip(self.binding.key, values))
        except (ValueError, TypeError):
            return key_json

    def _ambiguous(
        self, scan: Scan, bad: Any, frontier: int, plan: EpochPlan, checkpoint: Any
    ) -> SourceError:
        from pyspark.sql import functions as F

        names = [n for n, _ in scan.listing]
        found = (
            scan.updates.where((F.col("key") == bad["key"]) & (F.col("time") == bad["t"]))
            .select("file", "value").orderBy("file").limit(1).collect()
        )
        origins = tuple(Origin(self._name(r["file"], names), r["value"]) for r in found)
        if bad["most"] > 1 or bad["added"] > 1:
            what = (
                f"key {_lit(self._key_text(bad['key']))} would be present more than once at frontier {plan.frontier if plan.frontier is not None else 'end'} "
                f"({_span(frontier, plan.times[-1])} net {bad['added']} added row(s), the largest net diff is "
                f"{bad['most']}; last changed by {{0}}). A table holds one row per key: a change of a row "
                "must retract the old row (-1) and add the new one (+1) at the same time. If later times "
                "retract the extra row, raise transaction.max_documents so one epoch spans them"
            )
        else:
            what = (
                f"key {_lit(self._key_text(bad['key']))} has {bad['removed']} different rows retracted by {_span(frontier, plan.times[-1])} "
                "(last changed by {0}), but a table holds one row per key"
            )
        return self._error(Problem(int(bad["t"]), what, origins), checkpoint)



def _span(first: int, last: int) -> str:
    return f"time {first}" if first == last else f"times {first}-{last}"


def _lit(text: str) -> str:
    """``text`` safe inside a :class:`Problem` message (which is ``str.format``-ed later)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def _excerpt(text: str, limit: int = 120) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refused_names(dtype: Any) -> list[str]:
    """The dotted paths of the fields in ``dtype`` whose names Delta refuses (a walk with a stack
    of its own: no recursion, whatever the depth)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    refused, stack = [], [("", dtype)]
    while stack:
        path, t = stack.pop()
        if isinstance(t, StructType):
            for f in t.fields:
                where = f"{path}.{f.name}" if path else f.name
                if not f.name or set(f.name) & DELTA_INVALID:
                    refused.append(where)
                stack.append((where, f.dataType))
        elif isinstance(t, ArrayType):
            stack.append((path + "[]", t.elementType))
        elif isinstance(t, MapType):
            stack.append((path + "{}", t.valueType))
    return sorted(refused)


def _dataframe(spark: "SparkSession", spool_uri: str, label: str) -> "DataFrame":
    from pyspark.sql import functions as F

    # Fields that are null in every row of the epoch are dropped rather than typed as strings;
    # the driver's alignment writes them as NULL with the table's own type.
    raw = spark.read.option("dropFieldIfAllNull", "true").json(spool_uri)
    data = raw.schema["d"].dataType
    refused = _refused_names(data)
    if refused:
        raise SourceError(
            f"{label}: the rows' field(s) {', '.join(map(repr, refused))} have names Delta refuses (empty, or holding "
            "one of space , ; { } ( ) = ` tab newline). Nothing of this epoch was committed; rename the column at the "
            "source (for Materialize, in the view the sink reads) and run again"
        )
    # getField takes the name as it is: F.col("d.`…`") would parse it (a backtick, a dot).
    columns: list["Column"] = [F.col("d").getField(f.name).alias(f.name) for f in data.fields]  # type: ignore[attr-defined]
    return raw.where(F.col(OP).isin("u", "d")).select(*columns, F.col(OP), F.col(SEQ).cast("long").alias(SEQ))
