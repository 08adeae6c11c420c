"""The TIMESTAMP, DATE and DECIMAL values the arrow validator passes
(:mod:`materializer.sources.documents.check`): the one form of each that Spark's cast, its
``from_json``, Arrow's parsers and Python's read alike, and the conversions, for a whole batch in
Arrow (:func:`arrow_converted`) or for one document in Python (:data:`CONVERTERS`). The validator
types top-level ones itself; deeper ones are gathered (:func:`collector`) and checked the same
way, and ``from_json`` types them. A value in any other form is not fast: the VARIANT route
decides it."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Sequence

__all__ = [
    "CONVERSION_ERRORS", "CONVERTERS", "DATE_TEXT", "PLAIN_NUMBER", "TIMESTAMP_TEXT", "arrow_converted", "collector", "converted",
    "decimal_type", "required", "unset_as_none",
]


TIMESTAMP_TEXT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-](0[0-9]|1[0-7]):[0-5][0-9]|[+-]18:00)$"
"""The TIMESTAMP texts a fast document may hold: RFC 3339 with its zone (``Z`` or an offset
within Spark's ±18:00), up to microseconds. Spark's cast, Arrow's parser and Python's
``fromisoformat`` read these the same; every other text (no zone: the session's time zone decides; a space for the
``T``; nanoseconds) takes the VARIANT route, as does an impossible date or time."""
DATE_TEXT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
"""The DATE texts a fast document may hold (a real date of years 1-9999)."""


def decimal_type(kind: str) -> tuple[int, int]:
    """(precision, scale) of a Spark ``decimal(p,s)`` type name."""
    found = re.fullmatch(r"decimal\(([0-9]+),\s*([0-9]+)\)", kind)
    if found is None:
        raise ValueError(kind)
    return int(found.group(1)), int(found.group(2))


def converted(kind: Any) -> "Callable[[Any], Any] | None":
    """How the validator types a top-level value of Spark type ``kind`` that msgspec does not
    (None: it does not): :data:`CONVERTERS`."""
    if not isinstance(kind, str):
        return None
    if kind in CONVERTERS:
        return CONVERTERS[kind]
    if kind.startswith("decimal("):
        precision, scale = decimal_type(kind)
        return lambda raw: _decimal(raw, precision, scale)
    return None


_TIMESTAMP_RANGE = (-62135596800000000, 253402300799999999)
"""Spark's documented TIMESTAMP range, 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z, in
microseconds: an instant outside it (a zone can push one out) takes the VARIANT route."""


_DATE_RANGE = (-719162, 2932896)
"""The same for DATEs, 0001-01-01 to 9999-12-31, in days since 1970-01-01."""
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
PLAIN_NUMBER = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?$"
"""The DECIMAL values a fast document may hold: a JSON number without an exponent (Spark's parser
reads one with an exponent as a DOUBLE, whose rounding the VARIANT route's cast then decides)."""
_PLAIN_NUMBER = re.compile(PLAIN_NUMBER.encode())


_TIMESTAMP_FORM = re.compile(TIMESTAMP_TEXT)
_DATE_FORM = re.compile(DATE_TEXT)


def _timestamp(text: str) -> int:
    """A fast TIMESTAMP's microseconds since the epoch (one document: the per-document path)."""
    if _TIMESTAMP_FORM.fullmatch(text) is None:
        raise ValueError("not an RFC 3339 timestamp with its zone")
    micros = (datetime.fromisoformat(text) - _EPOCH) // _MICROSECOND
    if not _TIMESTAMP_RANGE[0] <= micros <= _TIMESTAMP_RANGE[1]:
        raise ValueError("beyond Spark's TIMESTAMP range")
    return micros


def _date(text: str) -> int:
    if _DATE_FORM.fullmatch(text) is None:
        raise ValueError("not an ISO date")
    return date.fromisoformat(text).toordinal() - 719163  # date(1970, 1, 1).toordinal(); years 1-9999


def _decimal(raw: Any, precision: int, scale: int) -> Any:
    """A DECIMAL(precision, scale) value from its raw JSON: a plain number (:data:`PLAIN_NUMBER`,
    not a string) whose digits fit without rounding, exactly; else ValueError (not fast: the
    VARIANT route decides, rounding included)."""
    text = bytes(raw)
    if text == b"null":
        return None
    found = _PLAIN_NUMBER.fullmatch(text)
    if found is None:
        raise ValueError("not a plain number")
    whole, fraction = found.group(1), (found.group(2) or b".")[1:]
    if len(fraction) > scale or (whole != b"0" and len(whole) > precision - scale):
        raise ValueError("does not fit")
    return Decimal(text.decode())


def arrow_converted(cols: list[list[Any]], conversions: list[tuple[int, str, bool]], pa: Any, pc: Any) -> "tuple[dict[int, Any], int] | None":
    """A whole batch's top-level timestamps, dates and decimals (``conversions``: index in
    ``cols``, Spark type, whether a key) typed in Arrow as the validator sends them
    (:func:`arrow_type`), and the ":" in the timestamps' and dates' texts; None when one value is
    not fast (then each document is judged alone, by :func:`_timestamp` and the others). Arrow's
    parsers refuse an impossible date or time as Python's do; the ranges are checked after."""
    from msgspec import UNSET

    arrays: dict[int, Any] = {}
    colons = 0
    for index, kind, key in conversions:
        values = cols[index]
        try:
            if kind in ("timestamp", "date"):
                text = pa.array(unset_as_none(values), pa.string())
                colons += pc.sum(pc.count_substring(text, ":")).as_py() or 0
                stamp = kind == "timestamp"
                if not pc.all(pc.match_substring_regex(text, TIMESTAMP_TEXT if stamp else DATE_TEXT), min_count=0).as_py():
                    return None
                sent = text.cast(pa.timestamp("us", tz="UTC") if stamp else pa.date32()).cast(pa.int64() if stamp else pa.int32())
                low, high = _TIMESTAMP_RANGE if stamp else _DATE_RANGE
                bounds = pc.min_max(sent).as_py()
                if bounds["min"] is not None and (bounds["min"] < low or bounds["max"] > high):
                    return None
            else:
                # The raw JSON texts as bytes at C speed, then "null" (and a field left out) as NULL.
                raw = pa.array(list(map(bytes, values)) if UNSET not in values else [b"null" if v is UNSET else bytes(v) for v in values], pa.binary())
                text = raw.cast(pa.string())
                text = pc.if_else(pc.equal(text, "null"), pa.scalar(None, pa.string()), text)
                if not pc.all(pc.match_substring_regex(text, PLAIN_NUMBER), min_count=0).as_py():
                    return None
                precision, scale = decimal_type(kind)
                sent = text.cast(pa.decimal128(precision, scale))  # refuses rounding and overflow
        except (pa.ArrowInvalid, UnicodeDecodeError):
            return None
        if key and sent.null_count:
            return None
        arrays[index] = sent
    return arrays, colons


def required(value: Any) -> Any:
    if value is None:
        raise ValueError("a key field is null")
    return value


CONVERTERS: dict[str, Callable[[Any], Any]] = {"timestamp": _timestamp, "date": _date}
"""Top-level TIMESTAMPs and DATEs, typed from their text (decimals: :func:`converted`)."""
CONVERSION_ERRORS = (ValueError, OverflowError, ArithmeticError)
"""What a conversion raises for a value that is not fast."""


def unset_as_none(values: "Sequence[Any]", count: "int | None" = None) -> "Sequence[Any]":
    """``values`` with msgspec's UNSET (a field left out) as None; ``count``: how many UNSET it
    holds, when the caller counted them already."""
    from msgspec import UNSET

    if count == 0 or (count is None and UNSET not in values):
        return values
    return [None if v is UNSET else v for v in values]


def collector(spec: Any, astuple: Any, unset: Any) -> "Callable[[Any, dict[str, list[Any]]], None] | None":
    """What gathers the values of the validator's walker spec's nested timestamps, dates and
    decimals (``("value", kind)``; :mod:`materializer.sources.documents.check`) from a decoded
    value into lists by kind (None: it holds none), to be checked as the top level's are."""
    if not isinstance(spec, tuple) or spec[0] == "meta":
        return None
    if spec[0] == "value":
        kind = spec[1]

        def take(value: Any, found: dict[str, list[Any]]) -> None:
            if value is not None and value is not unset:
                found.setdefault(kind, []).append(value)

        return take
    if spec[0] == "list":
        inner = collector(spec[1], astuple, unset)
        if inner is None:
            return None

        def each(value: Any, found: dict[str, list[Any]]) -> None:
            if value is not None and value is not unset:
                for item in value:
                    inner(item, found)

        return each
    parts = [(index, part) for index, inner_spec in spec[1] if (part := collector(inner_spec, astuple, unset)) is not None]
    if not parts:
        return None

    def fields(value: Any, found: dict[str, list[Any]]) -> None:
        if value is not None and value is not unset:
            values = astuple(value)
            for index, part in parts:
                part(values[index], found)

    return fields
