"""CDC v2 progress bookkeeping in plain Python: progress statements, complete times, an epoch's times.

No Spark: unit-tested without a JVM. The seed's iterator (seed 002): a progress statement is applied
once its lower bound is covered, and a time is complete when progress covers it and the distinct
updates received match its count; an epoch takes complete times in order, whole. Python holds only
this: the progress statements (few), one count per time, and the frontier; the updates stay in Spark
(:mod:`~materializer.sources.cdcv2.reader`).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from materializer.errors import SourceError

START = 0
"""The frontier before any statement: times are non-negative integers (Materialize's are u64)."""

FIX = (  # the end of every message about corrupt input
    "Fix or remove that statement in the source files and run again: nothing from the incomplete "
    "epoch was applied, and the run resumes from the frontier in the recovery log."
)


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
            f"non-negative integer times and counts. {FIX}",
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
