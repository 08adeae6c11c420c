"""Debezium's semantic types: what each lands as, decoded by Spark expressions on the executors.

Debezium's JSON converter writes a column's value in its wire encoding (a DECIMAL as base64 bytes,
a DATE as days since 1970-01-01, a TIMESTAMP as micro- or milliseconds) and names the encoding in
the event's ``schema`` envelope (``"name": "org.apache.kafka.connect.data.Decimal"``,
``"parameters": {"scale": "2"}``). The kafka source's ``debezium`` payload reads each top-level
field of ``after`` / ``before`` by the name its own record's schema gives it (:func:`semantics`),
turns the value into one Spark can cast exactly (:func:`decode`: a decimal number, an ISO date or
time text), and lands the field with the type of :func:`landing_type`. A value that does not
decode is refused (the kafka source names the record), never NULL. Without the envelope a declared
``source.schema`` says the same for its DECIMAL, DATE and BINARY fields (:func:`declared_semantics`).

Nothing here runs per record on the driver: the driver only reads the few distinct
(field, name, parameters) triples of an epoch to choose the columns' types (DESIGN invariant 8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType, StructType

DECIMAL = ("org.apache.kafka.connect.data.Decimal",)
VARIABLE_DECIMAL = ("io.debezium.data.VariableScaleDecimal",)
DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
MILLIS = ("io.debezium.time.Time", "org.apache.kafka.connect.data.Time", "io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")
MICROS = ("io.debezium.time.MicroTime", "io.debezium.time.MicroTimestamp")
NANOS = ("io.debezium.time.NanoTime", "io.debezium.time.NanoTimestamp")
ZONED = ("io.debezium.time.ZonedTimestamp",)
BITS = ("io.debezium.data.Bits",)
DECLARED_TIMESTAMP = "a declared TIMESTAMP: ISO-8601 text, since a number's unit is only in the schema envelope"
"""Without the envelope, a declared TIMESTAMP(_NTZ) field takes text only: ms, µs or ns cannot be told."""
DECODED = DECIMAL + VARIABLE_DECIMAL + DATES + MILLIS + MICROS + NANOS + ZONED + BITS
"""The semantic types decoded here; every other one lands as its JSON value (see TYPES)."""

VARIABLE_SCALE = 18
"""The scale a ``VariableScaleDecimal`` lands with (DECIMAL(38, 18)) unless source.schema declares one."""

TYPES: list[tuple[str, str]] = [
    ("org.apache.kafka.connect.data.Decimal", "DECIMAL(p, s): p from `connect.decimal.precision` (38 without it), s from `scale`"),
    ("io.debezium.data.VariableScaleDecimal", f"DECIMAL(38, {VARIABLE_SCALE}) (or the declared DECIMAL); a value of a larger scale is refused"),
    ("io.debezium.time.Date, org.apache.kafka.connect.data.Date", "DATE"),
    ("io.debezium.time.Time, org.apache.kafka.connect.data.Time (ms)", "TIMESTAMP_NTZ on 1970-01-01 (Delta has no time-of-day type)"),
    ("io.debezium.time.MicroTime (µs), io.debezium.time.NanoTime (ns)", "TIMESTAMP_NTZ on 1970-01-01; nanoseconds cut to microseconds"),
    ("io.debezium.time.Timestamp, org.apache.kafka.connect.data.Timestamp (ms)", "TIMESTAMP_NTZ (the source has no zone)"),
    ("io.debezium.time.MicroTimestamp (µs), io.debezium.time.NanoTimestamp (ns)", "TIMESTAMP_NTZ; nanoseconds cut to microseconds"),
    ("io.debezium.time.ZonedTimestamp", "TIMESTAMP (the instant; the offset itself is not kept)"),
    ("io.debezium.data.Bits", "BINARY"),
    ("io.debezium.data.Json, io.debezium.data.Xml", "STRING (the document's text)"),
    ("io.debezium.data.Uuid, io.debezium.data.Enum, io.debezium.data.EnumSet", "STRING"),
    ("io.debezium.time.ZonedTime, io.debezium.time.IsoDate/IsoTime/IsoTimestamp", "STRING (as sent)"),
    ("io.debezium.time.Year", "BIGINT"),
    ("io.debezium.time.MicroDuration, io.debezium.time.Interval", "BIGINT (µs) / STRING (ISO-8601), as sent"),
    ("io.debezium.data.geometry.Geometry, Geography, Point", "STRUCT<wkb: STRING (base64), srid: BIGINT> (x, y for Point), as sent"),
    ("bytes without a name", "STRING (base64, as sent)"),
]
"""Every Debezium semantic type and what it lands as (docs, 'Debezium's types')."""

_SEMANTIC = "struct<name:string,parameters:map<string,string>>"


def semantics(event: "Column") -> "Column":
    """Per record, ``map<field, struct<name, parameters>>`` of the top-level fields of ``after``
    (or ``before``) with a decoded semantic type, from the record's own ``schema`` envelope (NULL
    without one)."""
    from pyspark.sql import functions as F

    fields = F.try_variant_get(event, "$.schema.fields", "array<variant>")
    row = F.filter(fields, lambda f: F.try_variant_get(f, "$.field", "string").isin("after", "before"))
    described = F.try_variant_get(row[0], "$.fields", "array<struct<field:string,name:string,parameters:map<string,string>>>")
    named = F.filter(described, lambda f: f["name"].isin(*DECODED) & f["field"].isNotNull())
    return F.map_from_entries(
        F.transform(named, lambda f: F.struct(f["field"], F.struct(f["name"].alias("name"), f["parameters"].alias("parameters"))))
    )


def declared_semantics(declared: "StructType | None") -> "Column | None":
    """Without the envelope: the declared DECIMAL, DATE and BINARY fields of ``source.schema`` read
    as Debezium writes them (base64 unscaled bytes, days, base64); None if none is declared."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if declared is None:
        return None
    entries = []
    for f in declared.fields:
        params: dict[str, str] = {}
        if isinstance(f.dataType, T.DecimalType):
            name = DECIMAL[0]
            params = {"scale": str(f.dataType.scale), "connect.decimal.precision": str(f.dataType.precision)}
        elif isinstance(f.dataType, T.DateType):
            name = DATES[0]
        elif isinstance(f.dataType, T.BinaryType):
            name = BITS[0]
        elif isinstance(f.dataType, (T.TimestampType, T.TimestampNTZType)):
            name = DECLARED_TIMESTAMP
        else:
            continue
        parameters = F.create_map(*[F.lit(x) for kv in params.items() for x in kv]) if params else F.lit(None).cast("map<string,string>")
        entries += [F.lit(f.name), F.struct(F.lit(name).alias("name"), parameters.alias("parameters"))]
    return F.create_map(*entries) if entries else None


def _decimal_text(b64: "Column", scale: "Column") -> "Column":
    """The decimal text of base64 big-endian two's-complement unscaled bytes at ``scale`` (NULL:
    not base64, or more than 38 digits)."""
    from pyspark.sql import functions as F

    raw = F.try_to_binary(b64, F.lit("base64"))
    hexed = F.hex(raw)
    negative = F.conv(F.substring(hexed, 1, 2), 16, 10).cast("int") >= 128

    def byte(i: "Column") -> "Column":
        value = F.conv(F.substring(hexed, i * 2 + 1, 2), 16, 10).cast("int")
        return F.when(negative, F.lit(255) - value).otherwise(value)

    # A negative number's bytes inverted, so the magnitude never exceeds 38 digits on the way.
    magnitude = F.aggregate(
        F.sequence(F.lit(0), F.octet_length(raw) - 1), F.lit(0).cast("decimal(38,0)"),
        lambda acc, i: F.try_add(F.try_multiply(acc, F.lit(256)), byte(i)).cast("decimal(38,0)"),
    )
    magnitude = F.when(negative, magnitude + F.lit(1)).otherwise(magnitude)
    text = magnitude.cast("string")
    digits = F.lpad(text, F.greatest(F.length(text), scale + 1), "0")  # lpad cuts a longer text
    length = F.length(digits)
    sign = F.when(negative, F.lit("-")).otherwise(F.lit(""))
    head = F.left(digits, length - scale)
    tail = F.right(digits, scale)
    out = F.when(scale > 0, F.concat(sign, head, F.lit("."), tail)).otherwise(F.concat(sign, digits))
    return F.when((F.octet_length(raw) > 0) & magnitude.isNotNull() & scale.isNotNull() & (scale >= 0), out)


def decode(value: "Column", semantic: "Column") -> "Column":
    """``value`` (a VARIANT) as Spark casts it exactly to its landing type, as a VARIANT; NULL if
    it does not decode; the value itself for a type not decoded here or a JSON null."""
    from pyspark.sql import functions as F

    name = semantic["name"]
    params = semantic["parameters"]
    kind = F.schema_of_variant(value)
    text = F.try_variant_get(value, "$", "string")
    number = F.when(kind.isin("BIGINT", "INT", "SMALLINT", "TINYINT"), F.try_variant_get(value, "$", "bigint"))
    epoch = F.expr("TIMESTAMP_NTZ'1970-01-01 00:00:00'")
    is_text = kind == F.lit("STRING")

    def decimal(b64: "Column", scale: "Column", precision: "Column") -> "Column":
        # Refused (NULL) unless the column's DECIMAL(precision, scale) holds it exactly.
        text = _decimal_text(b64, scale)
        integral = F.length(F.regexp_replace(F.substring_index(text, ".", 1), "^-?0*", ""))
        return F.when(integral <= precision - scale, F.try_parse_json(text))

    decoded = (
        F.when(F.is_variant_null(value), value)
        .when(name.isin(*DECIMAL), F.when(is_text, decimal(
            text, params["scale"].try_cast("int"), F.coalesce(params["connect.decimal.precision"].try_cast("int"), F.lit(38))
        )).otherwise(
            F.when(kind.startswith("DECIMAL") | kind.isin("BIGINT", "INT", "SMALLINT", "TINYINT"), value)
        ))
        .when(name.isin(*VARIABLE_DECIMAL), F.when(
            F.try_variant_get(value, "$.scale", "int") <= F.lit(VARIABLE_SCALE),
            decimal(
                F.try_variant_get(value, "$.value", "string"), F.try_variant_get(value, "$.scale", "int"),
                F.lit(38 - VARIABLE_SCALE) + F.try_variant_get(value, "$.scale", "int"),
            ),
        ))
        .when(name.isin(*DATES), F.date_add(F.lit("1970-01-01").cast("date"), number.try_cast("int")).cast("variant"))
        .when(name.isin(*MILLIS), F.timestamp_add("MILLISECOND", number, epoch).cast("variant"))
        .when(name.isin(*MICROS), F.timestamp_add("MICROSECOND", number, epoch).cast("variant"))
        .when(name.isin(*NANOS), F.timestamp_add("MICROSECOND", F.floor(number / F.lit(1000)).cast("bigint"), epoch).cast("variant"))
        .when(name.isin(*ZONED), F.when(is_text, text.try_cast("timestamp").cast("variant")))
        .when(name.isin(*BITS), F.when(is_text & F.try_to_binary(text, F.lit("base64")).isNotNull(), value))
        .when(name == F.lit(DECLARED_TIMESTAMP), F.when(is_text, value))
        .otherwise(value)
    )
    return decoded


def landing_type(name: str, parameters: dict[str, str] | None) -> "DataType":
    """The Spark type a field of semantic type ``name`` lands as (driver: a few per epoch)."""
    from pyspark.sql import types as T

    parameters = parameters or {}
    if name in DECIMAL:
        scale = int(parameters.get("scale", "0"))
        precision = int(parameters.get("connect.decimal.precision", "38"))
        return T.DecimalType(min(max(precision, scale, 1), 38), scale)
    if name in VARIABLE_DECIMAL:
        return T.DecimalType(38, VARIABLE_SCALE)
    if name in DATES:
        return T.DateType()
    if name in MILLIS + MICROS + NANOS:
        return T.TimestampNTZType()
    if name in ZONED:
        return T.TimestampType()
    if name in BITS:
        return T.BinaryType()
    raise ValueError(name)


def semantic_fields(described: list[str], where: str) -> dict[str, tuple[str, dict[str, str]]]:
    """The epoch's distinct per-record semantic maps (JSON, from :func:`semantics`) as one map;
    a field given two types in one epoch is an error (the column has one type)."""
    import json

    from materializer.errors import SourceError

    out: dict[str, tuple[str, dict[str, str]]] = {}
    for text in described:
        for field, semantic in (json.loads(text) or {}).items():
            found = (semantic.get("name"), dict(semantic.get("parameters") or {}))
            if field in out and out[field] != found:
                raise SourceError(
                    f"{where}: field {field!r} has two Debezium types in this transaction's records ({_type_text(out[field])} "
                    f"and {_type_text(found)}): a column has one type. Nothing from this transaction was applied; change "
                    "the table (after the pipeline is drained) and start the records of the new type in a new pipeline, "
                    "or declare the field STRING in source.schema."
                )
            out[field] = found  # type: ignore[assignment]
    return out


def _type_text(semantic: Any) -> str:
    name, params = semantic
    return name + (f" {params}" if params else "")
