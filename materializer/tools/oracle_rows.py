"""The oracle's rows and folds, shared by every oracle (files, Kafka) and by nothing else.

Canonical rows and keys (:func:`canonical`, :func:`key_of`), one step of each field's reduction
and the fold of a document into a key's state, the cdcv2 history's state at its frontier, the
:class:`Expected` record an oracle returns, and the register of oracles by (source format, mode).
Plain Python, no Spark, and nothing of :mod:`materializer.sources`: the oracle must not share code
paths with what it checks. :mod:`materializer.tools.oracle` (files) and
:mod:`materializer.tools.oracle_kafka` (topics) build on it; it imports neither.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable

from materializer.config import BindingConfig

Key = tuple[Any, ...]
Row = dict[str, Any]


@dataclass
class Expected:
    """What one binding's table must hold."""

    binding: str
    verified: bool
    """False: no oracle models this binding; ``reason`` says why, rows are empty."""
    reason: str = ""
    unique_keys: bool = True
    """Standard mode: one row per key. Delta-updates mode: any number of rows per key."""
    rows: dict[Key, Counter[str]] = field(default_factory=dict)
    """Per key, the canonical JSON of each expected row with its multiplicity."""
    epochs: int | None = None
    """How many epochs carry input for this binding (the epoch its table must record last)."""
    documents: int = 0
    """Source documents read."""
    ignored: tuple[str, ...] = ()
    """Table columns the oracle cannot know (``__deleted_at``: the time of an apply), left out of
    the comparison."""


# --- canonical rows --------------------------------------------------------------------------


def normalize(value: Any) -> Any:
    """A value as the table gives it back: NULL fields dropped, integral floats as ints.

    Spark infers one type per field (7 and 7.5 become doubles), and a struct column carries every
    field any document had, absent ones as NULL: both must compare equal to the source document.
    """
    if isinstance(value, dict):
        out = {k: normalize(v) for k, v in value.items() if v is not None}
        # An object with no values left is as absent as NULL (JSON inference may drop `{}`).
        return {k: v for k, v in out.items() if v != {}}
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, Decimal):  # integers beyond a long come back as decimals
        value = int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def canonical(row: Row) -> str:
    return json.dumps(normalize(row), sort_keys=True, separators=(",", ":"), default=str)


def key_of(row: Row, key: list[str]) -> Key:
    return tuple(normalize(row.get(k)) for k in key)


# --- folding documents -----------------------------------------------------------------------


def is_delete(doc: Row) -> bool:
    meta = doc.get("_meta")
    return isinstance(meta, dict) and meta.get("op") == "d"


def fields_of(doc: Row) -> Row:
    return {k: v for k, v in doc.items() if k != "_meta"}


# --- the register of oracles -----------------------------------------------------------------

OracleFn = Callable[[BindingConfig, int], Expected]
SET_ASIDE: ContextVar[dict[str, frozenset[tuple[Any, ...]]]] = ContextVar("set_aside", default={})
"""What bindings set aside as dead letters (``on_invalid: dead_letter``; read from the dead-letter
table by the drill's verification), left out of the fold (``set_aside`` of :func:`materializer.tools.oracle.expected`): per
files source path, the (file, line) of its documents; per ``kafka:<binding>``, the (topic,
partition, offset) of its records (:mod:`materializer.tools.oracle_kafka`)."""


ORACLES: dict[tuple[str, str], OracleFn] = {}


def register(source_format: str, mode: str) -> Callable[[OracleFn], OracleFn]:
    """Register the oracle of a (source format, mode): ``oracle.py`` (files), ``oracle_kafka.py`` (topics)."""

    def wrap(fn: OracleFn) -> OracleFn:
        ORACLES[(source_format, mode)] = fn
        return fn

    return wrap


def step(strategy: str, a: Any, b: Any) -> Any:
    """One step of a field's reduction (the table of materializer/reductions.py), in plain Python."""
    if strategy == "lastWriteWins":
        return b
    if b is None:
        return a
    if a is None:
        return b
    if strategy == "firstWriteWins":
        return a
    if strategy == "sum":
        return a + b
    if strategy == "min":
        return min(a, b)
    if strategy == "max":
        return max(a, b)
    if strategy == "merge":
        if isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for k, v in b.items():
                out[k] = step("merge", a.get(k), v)
            return out
        return b
    if strategy == "append":
        return list(a) + list(b)
    raise ValueError(f"no oracle for reduction strategy {strategy!r}")


def fold(binding: BindingConfig, state: Row | None, doc: Row) -> Row:
    """Reduce one document into a key's state (None: a new key, or one just deleted)."""
    state = state or {}
    fields = fields_of(doc)
    out: Row = {}
    for name in set(fields) | set(state):
        if name in binding.key:
            out[name] = fields.get(name, state.get(name))
        else:
            out[name] = step(binding.reductions.get(name, "lastWriteWins"), state.get(name), fields.get(name))
    return out


def cdcv2_state(binding: BindingConfig, statements: Iterable[Row]) -> Expected:
    """A cdcv2 history's state at its final frontier, one row per key, over any statements (a
    folder's lines: ``oracle.cdcv2_standard``; a topic's records: ``oracle_kafka``)."""
    updates: set[tuple[str, int, int]] = set()
    progress: set[tuple[int, int | None, tuple[tuple[int, int], ...]]] = set()
    count = 0
    for stmt in statements:
        count += 1
        if "updates" in stmt:
            for data, time, diff in stmt["updates"]:
                updates.add((canonical(data), int(time), int(diff)))
        elif "progress" in stmt:
            body = stmt["progress"]
            upper = body["upper"][0] if body["upper"] else None
            progress.add((body["lower"][0], upper, tuple(sorted((int(t), int(n)) for t, n in body.get("counts", [])))))
    frontier: int | None = 0
    expected_counts: dict[int, int] = {}
    for lower, upper, counts in sorted(progress, key=lambda p: (p[0], math.inf if p[1] is None else p[1])):
        if frontier is None or lower > frontier:
            break
        for t, n in counts:
            if t >= frontier:
                expected_counts[t] = n
        frontier = None if upper is None else max(frontier, upper)
    received = Counter(t for _data, t, _diff in updates)
    complete = frontier
    for t in sorted(set(expected_counts) | set(received)):
        if frontier is not None and t >= frontier:
            break
        if expected_counts.get(t, 0) != received.get(t, 0):
            complete = t
            break
    totals: Counter[str] = Counter()
    for data, t, diff in updates:
        if complete is None or t < complete:
            totals[data] += diff
    rows: dict[Key, Counter[str]] = {}
    for data, n in totals.items():
        if n not in (0, 1):
            return Expected(binding=binding.name, verified=False, reason=f"row {data} has multiplicity {n}: not a keyed history")
        if n == 1:
            row = json.loads(data)
            rows.setdefault(key_of(row, binding.key), Counter())[data] += 1
    if any(sum(c.values()) > 1 for c in rows.values()):
        return Expected(binding=binding.name, verified=False, reason="a key holds two rows at the frontier: not a keyed history")
    return Expected(binding=binding.name, verified=True, unique_keys=True, rows=rows, epochs=None, documents=count)


