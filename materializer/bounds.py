"""An epoch's key bounds: the least and greatest value of each key column among its staged rows.

Observed while the staged file is written (an ``Observation``: no second pass, no row comes to
the driver), kept in the driver checkpoint, and added to the MERGE condition as target-only
predicates (``t.id >= 17 AND t.id <= 90210``), which Delta uses to skip the table's files whose
statistics lie outside them. The predicates change no result: every source row's key lies within
the bounds, so every target row a source row matches does too.

Only key columns of types whose bounds round-trip exactly as SQL literals get bounds: integers,
decimals, strings (as UTF-8 bytes), dates and timestamps (as microseconds since the epoch, free of
the session's time zone). Floating-point keys get none (NaN and -0.0 make bounds a trap).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Sequence

from materializer.delta import literal, quote
from materializer.errors import RecoveryLogError

if TYPE_CHECKING:
    from pyspark.sql import Column

KeyBounds = dict[str, list[str]]
"""Per key column: ``[kind, low, high]`` as text (kind: ``integer``, ``decimal(p,s)``, ``string``,
``date``, ``timestamp``)."""


def _kind(dtype: Any) -> str | None:
    from pyspark.sql.types import DateType, DecimalType, IntegralType, StringType, TimestampType

    if isinstance(dtype, IntegralType):
        return "integer"
    if isinstance(dtype, DecimalType):
        return dtype.simpleString()
    if isinstance(dtype, StringType) and getattr(dtype, "collation", "UTF8_BINARY") in ("UTF8_BINARY", None):
        return "string"
    if isinstance(dtype, DateType):
        return "date"
    if isinstance(dtype, TimestampType):
        return "timestamp"
    return None


def _as_text(column: "Column", kind: str) -> "Column":
    """The value as text that :func:`_literal` turns back into exactly the same value."""
    from pyspark.sql import functions as F

    if kind == "string":
        return F.hex(column)  # UTF-8 bytes: no quoting or escaping to get wrong
    if kind == "date":
        return F.unix_date(column).cast("string")
    if kind == "timestamp":
        return F.unix_micros(column).cast("string")
    return column.cast("string")


_HEX = re.compile(r"[0-9A-Fa-f]*")
_INTEGER = re.compile(r"[+-]?[0-9]{1,40}")
_DECIMAL_KIND = re.compile(r"decimal\(([0-9]{1,2}),([0-9]{1,2})\)")
_DECIMAL = re.compile(r"[+-]?[0-9]{1,38}(\.[0-9]{1,38})?")


class ForgedBound(RecoveryLogError):
    """A bound (read back from the recovery log) that is not a value of its kind."""


def _literal(text: str, kind: str) -> str:
    """The bound as a SQL literal, from a typed value only: the recovery log's text is checked
    against its kind, never spliced (issue #66 item 4: a forged bound gave ``OR true``)."""
    text = str(text)
    if kind == "string" and _HEX.fullmatch(text) and len(text) % 2 == 0:
        return f"CAST(X'{text}' AS STRING)"
    if kind in ("date", "timestamp", "integer") and _INTEGER.fullmatch(text):
        number = int(text)
        return {"date": f"date_from_unix_date({number})", "timestamp": f"timestamp_micros({number})"}.get(kind, str(number))
    if _DECIMAL_KIND.fullmatch(kind) and _DECIMAL.fullmatch(text):
        return f"CAST({literal(text)} AS {kind})"
    raise ForgedBound(
        f"a key bound {text!r} of kind {kind!r} is not a value of that kind; the recovery log entry that holds it "
        "was edited or damaged: restore the log from its copy, or run `materializer recover` to rebuild it"
    )


_KIND = re.compile(r"integer|string|date|timestamp|decimal\(([0-9]{1,2}),([0-9]{1,2})\)")


def bound_problem(name: str, bound: Any, key: Sequence[str] | None) -> str | None:
    """Why key bound ``name: bound`` read back from the recovery log is none that :func:`bounds_from`
    writes (None: it could be): a column that is not one of ``key`` (None: the key is not known
    here), not ``[kind, low, high]``, a kind outside :func:`_kind`'s, or values not of the kind.
    Checked when the entry is read, so a damaged entry stops the read, not the MERGE it reaches."""
    if key is not None and name not in key:
        return f"{name!r} is not a key column of the binding (its key: {', '.join(key)})"
    if not isinstance(bound, list) or len(bound) != 3 or not all(isinstance(v, str) for v in bound):
        return f"the bound of {name!r} is not [kind, low, high]"
    kind, low, high = bound
    if not _KIND.fullmatch(kind):
        return f"the bound of {name!r} has kind {kind!r}, none of integer, decimal(p,s), string, date and timestamp"
    try:
        _literal(low, kind), _literal(high, kind)
    except ForgedBound:
        return f"the bound of {name!r}, {low!r} to {high!r}, is not a value of kind {kind!r}"
    return None


def bound_aggregates(schema: Any, key: list[str]) -> tuple[list["Column"], dict[str, str]]:
    """Aggregates for an Observation (two per boundable key column) and each column's kind."""
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in schema.fields}
    aggregates, kinds = [], {}
    for index, name in enumerate(key):
        kind = _kind(types.get(name))
        if kind is None:
            continue
        column = F.col(quote(name))
        kinds[name] = kind
        aggregates += [_as_text(F.min(column), kind).alias(f"lo_{index}"), _as_text(F.max(column), kind).alias(f"hi_{index}")]
    return aggregates, kinds


def bounds_from(observed: dict[str, Any], key: list[str], kinds: dict[str, str]) -> KeyBounds:
    """The observed bounds; a column whose keys were all NULL has none."""
    out: KeyBounds = {}
    for index, name in enumerate(key):
        if name not in kinds:
            continue
        low, high = observed.get(f"lo_{index}"), observed.get(f"hi_{index}")
        if low is not None and high is not None:
            out[name] = [kinds[name], str(low), str(high)]
    return out


def bounds_condition(bounds: KeyBounds | None, target: str = "t") -> str:
    """`` AND t.k >= low AND t.k <= high`` for each bounded key column ('' when there are none)."""
    parts = []
    for name, (kind, low, high) in sorted((bounds or {}).items()):
        column = f"{target}.{quote(name)}"
        parts.append(f"{column} >= {_literal(low, kind)} AND {column} <= {_literal(high, kind)}")
    return "".join(f" AND {p}" for p in parts)
