"""The ``cdcv2`` source: Materialize's CDC v2 protocol (seed 002), read from JSON Lines files.

A folder holds files of statements, one JSON object per line:

* updates  ``{"updates": [[data, time, diff], ...]}``: the multiplicity of the row ``data`` (a JSON
  object holding the binding's key fields) changes at integer ``time`` by ``diff``;
* progress ``{"progress": {"lower": [t], "upper": [u], "counts": [[t, n], ...]}}``: the times in
  ``[lower, upper)`` hold exactly ``n`` distinct updates at each listed ``t`` and none at the others;
  ``"upper": []`` ends the stream.

Statements may be duplicated, reordered and re-batched across files that appear in any order. The
reader follows the seed's iterator: updates at times below the frontier are discarded, duplicates
are absorbed, a progress statement is applied once its lower bound is covered, and a time is
complete when progress covers it and the distinct updates received match its count. An epoch
takes complete times in order; its runtime checkpoint is the frontier ``{"frontier": t}`` (every
time below ``t`` is materialized; ``null`` once the stream has ended), so a restart re-reads the
files and applies nothing twice.

Where the work happens (DESIGN.md invariant 8): every update lives in Spark DataFrames (parsed as
VARIANT, deduplicated, counted per time, consolidated per key). Python holds only the progress
bookkeeping: the progress statements (few), one count per time, and the frontier. The pure-Python
part (:func:`parse_progress`, :func:`track`, :func:`plan_epoch`) needs no JVM and is unit-tested
on its own.

A keyed Delta table holds at most one row per key, so per key the epoch's updates are consolidated
(diffs summed per distinct row) into one upsert, one delete, or nothing (net zero). Input that
cannot be read that way is corrupt and stops the run with a :class:`SourceError` naming the file,
the statement and the time, before anything of the epoch is staged; every earlier complete time
has been applied by then, so fixing the input and running again continues from there.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence
from urllib.parse import unquote

from materializer.config import BindingConfig
from materializer.errors import SourceError
from materializer.columns import OP, RESERVED, SEQ
from materializer.sources import Source, SourceBatch
from materializer.sources.json_text import parse_one
from materializer.storage import Store, open_store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

SKIPPED = (".", "_")
"""Files whose names start so are not statements (writers' temporary files, Spark's markers)."""
log = logging.getLogger("materializer")

START = 0
"""The frontier before any statement: times are non-negative integers (Materialize's are u64)."""

_FIX = (
    "Fix or remove that statement in the source files and run again: nothing from the incomplete "
    "epoch was applied, and the run resumes from the frontier in the recovery log."
)


# --------------------------------------------------------------------------------------------
# Progress bookkeeping: plain Python, no Spark (unit-tested without a JVM).
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """Where a statement came from. ``line`` is found lazily: only error messages need it."""

    file: str
    text: str = field(repr=False)
    line: int | None = None

    def describe(self, line: int | None = None) -> str:
        number = line if line is not None else self.line
        return f"{self.file}:{number}" if number else self.file


@dataclass(frozen=True)
class Progress:
    """One progress statement: times in ``[lower, upper)`` hold exactly ``counts`` updates."""

    lower: int
    upper: int | None
    """None: the statement's upper frontier is empty, it covers every time from ``lower`` on."""
    counts: tuple[tuple[int, int], ...]
    origin: Origin = field(compare=False, hash=False)

    def covers(self, time: int) -> bool:
        return self.lower <= time and (self.upper is None or time < self.upper)

    def count(self, time: int) -> int:
        for t, n in self.counts:
            if t == time:
                return n
        return 0


@dataclass(frozen=True)
class Problem:
    """Corrupt input found at ``time``: the run cannot pass that time."""

    time: int
    message: str
    """What is wrong, with ``{0}``, ``{1}``… standing for the statements of ``origins``."""
    origins: tuple[Origin, ...] = ()


@dataclass
class Tracking:
    """What the progress statements and the per-time update counts say, from a frontier on."""

    frontier: int | None
    """Where the reading started (the checkpoint)."""
    progress: int | None
    """Progress frontier: every time below it is covered by applied progress statements."""
    complete: int | None
    """Every time below it is complete: covered, and its distinct updates match its count."""
    expected: dict[int, int]
    """Counts announced for times in ``[frontier, progress)``; absent times expect none."""
    problems: list[Problem]
    """Corrupt input at some time at or above ``frontier``, earliest first."""
    pending: int
    """Progress statements not yet applicable (their lower bound is not covered yet)."""

    @property
    def limit(self) -> int | None:
        """How far the run may go: the complete frontier, capped at the first problem."""
        if self.problems:
            first = self.problems[0].time
            return first if self.complete is None else min(first, self.complete)
        return self.complete


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_progress(body: Any, origin: Origin) -> Progress:
    """Validate the object under ``"progress"``; malformed statements are errors at any time."""

    def bad(what: str) -> SourceError:
        error = SourceError(
            f"{origin.describe()}: malformed progress statement: {what}. Expected "
            '{"progress": {"lower": [t], "upper": [u] or [], "counts": [[t, n], ...]}} with '
            f"non-negative integer times and counts. {_FIX}",
            file=origin.file,
            line=origin.line,
        )
        error.rule = f"malformed progress statement: {what}"  # a dead letter's reason
        return error

    if not isinstance(body, dict):
        raise bad("the value of \"progress\" must be an object")
    unknown = set(body) - {"lower", "upper", "counts"}
    if unknown:
        raise bad(f"unknown field(s) {sorted(unknown)}")
    lower, upper, counts = body.get("lower"), body.get("upper"), body.get("counts", [])
    # Times are totally ordered integers here, so a frontier is one time or none (the empty one).
    if not isinstance(lower, list) or len(lower) != 1 or not _int(lower[0]) or lower[0] < 0:
        raise bad(f'"lower" must be [t] with t a non-negative integer, found {json.dumps(lower)}')
    if not isinstance(upper, list) or len(upper) > 1 or (upper and (not _int(upper[0]) or upper[0] < 0)):
        raise bad(f'"upper" must be [t] with t a non-negative integer, or [] (end of stream), found {json.dumps(upper)}')
    low = lower[0]
    high = upper[0] if upper else None
    if high is not None and high < low:
        raise bad(f"lower {low} is above upper {high}")
    if not isinstance(counts, list):
        raise bad('"counts" must be a list of [time, count] pairs')
    seen: set[int] = set()
    pairs = []
    for pair in counts:
        if not isinstance(pair, list) or len(pair) != 2 or not all(_int(x) for x in pair):
            raise bad(f"count {json.dumps(pair)} is not a [time, count] pair of integers")
        t, n = pair
        if n < 0:
            raise bad(f"count {json.dumps(pair)} is negative")
        if t < low or (high is not None and t >= high):
            raise bad(f"count {json.dumps(pair)} is for a time outside [{low}, {'∞' if high is None else high})")
        if t in seen:
            raise bad(f"time {t} is counted twice")
        seen.add(t)
        if n > 0:
            pairs.append((t, n))
    return Progress(lower=low, upper=high, counts=tuple(sorted(pairs)), origin=origin)


def _upper_key(upper: int | None) -> float:
    return float("inf") if upper is None else upper


def track(frontier: int | None, statements: Iterable[Progress], received: Mapping[int, int]) -> Tracking:
    """The seed's iterator, from ``frontier`` on: which times are complete, and what is corrupt.

    ``received`` is the number of distinct ``(data, time, diff)`` updates per time (only times at
    or above ``frontier`` matter). Progress statements are applied once their lower bound is
    covered; their counts for times not yet covered become the expected counts. Unlike the seed,
    which silently drops the counts of a statement for times already covered, every applied
    statement is checked against the counts in force, so two statements that disagree are found.
    """
    if frontier is None:
        return Tracking(None, None, None, {}, [], 0)
    # Duplicates are identical statements: keep one. Sorted by lower bound, one pass applies
    # every applicable statement, since the progress frontier only grows.
    queue = sorted(set(statements), key=lambda p: (p.lower, _upper_key(p.upper), p.counts))
    progress: int | None = frontier
    expected: dict[int, int] = {}
    announced_by: dict[int, Progress] = {}
    applied: list[Progress] = []
    pending = 0
    for position, statement in enumerate(queue):
        if progress is not None and statement.lower > progress:
            pending = len(queue) - position
            break
        for t, n in statement.counts:
            if progress is not None and t >= progress:
                expected[t] = n
                announced_by[t] = statement
        applied.append(statement)
        if progress is not None:
            progress = None if statement.upper is None else max(progress, statement.upper)

    problems: list[Problem] = []
    # Every applied statement must agree with the counts in force on the times it covers.
    times = sorted(expected)
    for statement in applied:
        start = max(statement.lower, frontier)
        for t, n in statement.counts:
            if t >= frontier and expected.get(t, 0) != n:
                other = announced_by.get(t) or _covering(applied, t, exclude=statement)
                problems.append(
                    Problem(
                        t,
                        f"progress statements disagree on time {t}: {{0}} counts {n} updates, "
                        f"{{1}} counts {expected.get(t, 0)}",
                        (statement.origin,) + ((other.origin,) if other else ()),
                    )
                )
        low = bisect.bisect_left(times, start)
        high = len(times) if statement.upper is None else bisect.bisect_left(times, statement.upper)
        for t in times[low:high]:
            if statement.count(t) == 0 and expected[t] != 0:
                problems.append(
                    Problem(
                        t,
                        f"progress statements disagree on time {t}: {{0}} covers it with no updates, "
                        f"{{1}} counts {expected[t]}",
                        (statement.origin, announced_by[t].origin),
                    )
                )

    # A covered time with more distinct updates than its count can never complete.
    for t in sorted(received):
        n = received[t]
        if t < frontier or n <= 0 or (progress is not None and t >= progress):
            continue
        want = expected.get(t, 0)
        if n > want:
            statement = announced_by.get(t) or _covering(applied, t)
            problems.append(
                Problem(
                    t,
                    f"time {t} has {n} distinct updates but {{0}} counts {want}: the count can never be "
                    "met (an update at that time is wrong, or the progress statement is)",
                    (statement.origin,) if statement else (),
                )
            )

    complete = progress
    for t in sorted(set(expected) | {t for t, n in received.items() if n > 0}):
        if t < frontier or (progress is not None and t >= progress):
            continue
        if expected.get(t, 0) != received.get(t, 0):
            complete = t
            break
    problems.sort(key=lambda p: p.time)
    return Tracking(frontier, progress, complete, expected, problems, pending)


def _covering(applied: Sequence[Progress], time: int, exclude: Progress | None = None) -> Progress | None:
    for statement in applied:
        if statement is not exclude and statement.covers(time):
            return statement
    return None


@dataclass(frozen=True)
class EpochPlan:
    times: tuple[int, ...]
    """Times with updates the epoch materializes, ascending."""
    frontier: int | None
    """The checkpoint after the epoch: the next time not yet materialized."""
    count: int
    """Distinct updates in the epoch."""


def plan_epoch(frontier: int | None, limit: int | None, received: Mapping[int, int], max_documents: int) -> EpochPlan | None:
    """The next epoch: complete times in ``[frontier, limit)`` in order, whole, up to ``max_documents``.

    A time is never split (its updates are one consistent change); an epoch takes at least one
    time even if that time alone holds more than ``max_documents`` updates. None: no update to
    materialize (times without updates are passed over by the next epoch's checkpoint).
    """
    if frontier is None:
        return None
    times = sorted(t for t, n in received.items() if n > 0 and t >= frontier and (limit is None or t < limit))
    taken: list[int] = []
    total = 0
    for t in times:
        if taken and total + received[t] > max_documents:
            return EpochPlan(tuple(taken), t, total)
        taken.append(t)
        total += received[t]
    if not taken:
        return None
    return EpochPlan(tuple(taken), limit, total)


# --------------------------------------------------------------------------------------------
# The source: Spark does the work on updates.
# --------------------------------------------------------------------------------------------


@dataclass
class _Scan:
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


class CdcV2Source(Source):
    """Reads a folder of CDC v2 statements; see the module docstring."""

    _per_file = True
    """Dead letters are found by file (a record's name is not a file: kafka's payload says False)."""

    def __init__(self, binding: BindingConfig, spool: Store) -> None:
        super().__init__(binding, spool)
        # The last reading of the files, kept across the epochs of one run (see _scan_for).
        self._scan: _Scan | None = None

    @property
    def label(self) -> str:
        """The input named in messages: the folder (a topic's address for kafka's cdcv2 payload)."""
        return str(self.binding.source.path)

    # --- files ---

    def _store(self) -> Store:
        return open_store(self.binding.source.path)

    def _listing(self) -> tuple[tuple[str, int], ...]:
        store = self._store()
        return tuple(
            (f.path, f.size)
            for f in store.list()
            if not os.path.basename(f.path).startswith(SKIPPED) and not f.path.endswith((".tmp", ".crc"))
        )

    def _name(self, spark_uri: str, names: Sequence[str]) -> str:
        """The store-relative name of a file Spark read (it reports ``file:/…`` or ``s3a://…``)."""
        uri = unquote(spark_uri)
        best = ""
        for name in names:
            if (uri.endswith("/" + name) or uri == name) and len(name) > len(best):
                best = name
        return f"{self._store().uri}/{best}" if best else uri

    def _relative(self, spark_uri: str, names: Sequence[str]) -> str:
        """The file's name inside the folder (what a checkpoint keeps)."""
        prefix = self._store().uri.rstrip("/") + "/"
        name = self._name(spark_uri, names)
        return name[len(prefix):] if name.startswith(prefix) else name

    def _locate(self, origin: Origin) -> Origin:
        """The origin with its line number, found by reading the one file (error paths only)."""
        store = self._store()
        prefix = store.uri.rstrip("/") + "/"
        name = origin.file[len(prefix) :] if origin.file.startswith(prefix) else origin.file
        wanted = origin.text.strip()
        try:
            with store.open_read(name) as handle:
                for number, raw in enumerate(handle, start=1):
                    if raw.decode("utf-8", errors="replace").strip() == wanted:
                        return Origin(origin.file, origin.text, number)
        except (OSError, FileNotFoundError):
            pass
        return origin

    def _error(self, problem: Problem, checkpoint: Any) -> SourceError:
        located = [self._locate(o) for o in problem.origins]
        names = [f"{o.describe()} ({_excerpt(o.text)})" for o in located]
        names += ["(unknown statement)"] * 2
        message = problem.message.format(*names)
        where = located[0] if located else None
        return SourceError(
            f"{self.label}: corrupt CDC v2 input at time {problem.time}: {message}. "
            f"Binding {self.binding.name!r} stands at frontier {(checkpoint or {}).get('frontier', START)}: "
            f"the complete times before it are in the table, nothing at or after it is. {_FIX}",
            file=where.file if where else None,
            line=where.line if where else None,
        )

    # --- reading ---

    def _lines(self, spark: "SparkSession", listing: tuple[tuple[str, int], ...]) -> "DataFrame":
        """The statements' text (``value``) and where each is (``file``), blank lines left out. The
        seam kafka's cdcv2 payload feeds records through (``file`` then names topic, partition and offset)."""
        from pyspark.sql import functions as F

        store = self._store()
        return (
            spark.read.text([store.spark_path(n) for n, _ in listing])
            .select(F.col("value"), F.col("_metadata.file_path").alias("file"))
            .where(F.trim("value") != "")
        )

    def _update_problem(self, u: "Column") -> "Column":
        """What is wrong with one update ``u`` (a VARIANT) of an updates statement (NULL: nothing)."""
        from pyspark.sql import functions as F

        arr = F.try_variant_get(u, "$", "array<variant>")
        data, time_v, diff_v = arr[0], arr[1], arr[2]
        data_map = F.try_variant_get(data, "$", "map<string,variant>")
        time = F.try_variant_get(time_v, "$", "bigint")
        diff = F.try_variant_get(diff_v, "$", "bigint")
        keys = [F.try_element_at(data_map, F.lit(k)) for k in self.binding.key]
        problem = F.when(
            arr.isNull() | (F.array_size(arr) != 3), F.lit("is not a [data, time, diff] triple")
        ).when(data_map.isNull(), F.lit("has data that is not a JSON object"))
        problem = problem.when(
            F.schema_of_variant(time_v) != "BIGINT", F.lit("has a time that is not an integer")
        ).when(time < 0, F.lit("has a negative time"))
        problem = problem.when(
            (F.schema_of_variant(diff_v) != "BIGINT") | (diff == 0), F.lit("has a diff that is not a non-zero integer")
        )
        for name, value in zip(self.binding.key, keys):
            problem = problem.when(
                value.isNull() | F.is_variant_null(value), F.lit(f"has data without the key field {name!r}")
            ).when(
                F.schema_of_variant(value).startswith("OBJECT") | F.schema_of_variant(value).startswith("ARRAY"),
                F.lit(f"has data whose key field {name!r} is not a scalar"),
            )
        for name in RESERVED:
            problem = problem.when(
                F.array_contains(F.map_keys(data_map), F.lit(name)),
                F.lit(f"has data with the field {name!r}, which the materializer reserves"),
            )
        return problem

    def _statements(self, lines: "DataFrame") -> "DataFrame":
        """``lines`` (a ``value`` column and any others) with what each statement is: ``problem``
        (what makes the whole statement malformed, its first bad update included; NULL: none),
        ``is_progress`` and ``updates`` (the updates as VARIANTs). A statement is judged alone."""
        from pyspark.sql import functions as F

        v = parse_one(F.col("value"))
        fields = F.map_keys(F.try_variant_get(v, "$", "map<string,variant>"))
        updates_arr = F.try_variant_get(v, "$.updates", "array<variant>")
        # concat is NULL where the update's problem is: the first non-NULL is the first bad update.
        first_bad_update = F.try_element_at(
            F.filter(
                F.transform(
                    updates_arr, lambda u, i: F.concat(F.lit("update #"), (i + 1).cast("string"), F.lit(" "), self._update_problem(u))
                ),
                lambda p: p.isNotNull(),
            ),
            F.lit(1),
        )
        return lines.select(
            *lines.columns,
            F.when(
                v.isNull() & F.try_parse_json("value").isNotNull(),
                F.lit("more than one JSON value, or text after the statement's value: one statement per line"),
            )
            .when(v.isNull(), F.lit("not valid JSON"))
            .when(fields.isNull(), F.lit("a statement must be a JSON object"))
            .when(
                ~(F.array_size(fields) == 1) | ~fields[0].isin("updates", "progress"),
                F.lit('a statement is an object with exactly one field, "updates" or "progress"'),
            )
            .when((fields[0] == "updates") & updates_arr.isNull(), F.lit('"updates" must be a list of [data, time, diff] triples'))
            .otherwise(first_bad_update)
            .alias("problem"),
            (v.isNotNull() & (F.array_size(fields) == 1) & (fields[0] == "progress")).alias("is_progress"),
            updates_arr.alias("updates"),
        )

    def _read(self, spark: "SparkSession", listing: tuple[tuple[str, int], ...], frontier: int) -> _Scan:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        names = [name for name, _ in listing]
        dead_letter = self.binding.on_invalid == "dead_letter"
        parsed = self._statements(self._lines(spark, listing).select("file", "value"))

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
                f"key fields {self.binding.key}, or {{\"progress\": {{...}}}}. {_FIX}",
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
        return _Scan(listing, frontier, current, distinct, progress, received, conflicts, bad_files, bad_progress, bad)

    def _scan_for(self, spark: "SparkSession", frontier: int) -> _Scan | None:
        listing = self._listing()
        if not listing:
            return None
        scan = self._scan
        if scan is not None and scan.listing == listing and scan.frontier <= frontier:
            return scan
        if scan is not None:
            scan.distinct.unpersist()
        self._scan = None
        self._scan = self._read(spark, listing, frontier)
        return self._scan

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
            documents=_dataframe(spark, spool_uri),
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

    def _dead_letters(
        self, spark: "SparkSession", scan: _Scan, checkpoint: dict[str, Any] | None, until: dict[str, Any] | None
    ) -> "tuple[DataFrame | None, int, dict[str, Any]]":
        """``on_invalid: dead_letter``: the malformed statements this epoch sets aside (``source``,
        ``line``, ``reason``, ``document``), their number, and what the checkpoint keeps of them.

        The files are read again by every epoch, so a statement is set aside by the first epoch
        that reads its file: the checkpoint's ``dead_lettered`` names the files whose malformed
        statements are in the dead-letter table (few: only files holding one), and a file is
        immutable once it appears (see the docs). Only those files are read again, numbered."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        done = sorted((checkpoint or {}).get("dead_lettered") or [])
        kept = {"dead_lettered": done} if done else {}
        new = {uri: name for uri, name in scan.bad_files.items() if name not in done}
        if until is not None:
            # recover: exactly the files the committed epoch set aside.
            new = {uri: name for uri, name in new.items() if name in (until.get("dead_lettered") or [])}
        if not new:
            return None, 0, kept
        store = self._store()
        path = F.col("_metadata.file_path")
        raw = spark.read.text([store.spark_path(n) for n in sorted(set(new.values()))]).select(
            "value", path.alias("file"), F.col("_metadata.file_block_start").alias("block"), F.monotonically_increasing_id().alias("row")
        )
        # Numbered as the error path numbers them (blank lines counted), one file per window.
        lines = raw.select(
            "value", "file", F.row_number().over(Window.partitionBy("file").orderBy("block", "row")).alias("line")
        ).where(F.trim("value") != "")
        rejected = self._rejected(self._statements(lines), scan).select(
            _lookup({uri: f"{store.uri.rstrip('/')}/{name}" for uri, name in new.items()}, F.col("file")).alias("source"),
            F.col("line").cast("long").alias("line"),
            F.col("reason"),
            F.col("value").alias("document"),
        )
        count = rejected.count()
        return (rejected if count else None), count, {"dead_lettered": sorted(set(done) | set(new.values()))}

    @staticmethod
    def _rejected(checked: "DataFrame", scan: _Scan) -> "DataFrame":
        """The malformed statements of ``checked`` (a :meth:`_statements` DataFrame) with their ``reason``."""
        from pyspark.sql import functions as F

        reason = F.coalesce(F.col("problem"), _lookup(scan.bad_progress, F.col("value")))
        return checked.where(reason.isNotNull()).withColumn("reason", reason)

    def _key_text(self, key_json: str) -> str:
        try:
            values = json.loads(key_json)
            return ", ".join(f"{k}={json.dumps(v)}" for k, v in zip(self.binding.key, values))
        except (ValueError, TypeError):
            return key_json

    def _ambiguous(
        self, scan: _Scan, bad: Any, frontier: int, plan: EpochPlan, checkpoint: Any
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


def _lookup(mapping: Mapping[str, str], key: "Column") -> "Column":
    """``mapping[key]`` as a Spark expression (NULL where absent; a few entries, never rows)."""
    from pyspark.sql import functions as F

    if not mapping:
        return F.lit(None).cast("string")
    return F.create_map(*[F.lit(x) for k, v in sorted(mapping.items()) for x in (k, v)])[key]


def _span(first: int, last: int) -> str:
    return f"time {first}" if first == last else f"times {first}-{last}"


def _lit(text: str) -> str:
    """``text`` safe inside a :class:`Problem` message (which is ``str.format``-ed later)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def _excerpt(text: str, limit: int = 120) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dataframe(spark: "SparkSession", spool_uri: str) -> "DataFrame":
    from pyspark.sql import functions as F

    # Fields that are null in every row of the epoch are dropped rather than typed as strings;
    # the driver's alignment writes them as NULL with the table's own type.
    raw = spark.read.option("dropFieldIfAllNull", "true").json(spool_uri)
    fields = [f.name for f in raw.schema["d"].dataType.fields]  # type: ignore[attr-defined]
    columns: list["Column"] = [F.col(f"d.`{name}`").alias(name) for name in fields]
    return raw.where(F.col(OP).isin("u", "d")).select(*columns, F.col(OP), F.col(SEQ).cast("long").alias(SEQ))
