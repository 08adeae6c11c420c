"""A kafka binding's records read and checked as documents (the ``documents`` and ``debezium`` payloads).

The documents source's reader, over records.

Payloads (``source.payload``):

- ``documents``: the value is a JSON document, read and checked exactly as the documents source
  does (:class:`~materializer.sources.documents.reader.DocumentReader`: ``try_parse_json`` to VARIANT, one aggregate of checks and
  ``schema_of_variant_agg``), ``_meta.op = "d"`` deletes the key. A null value (a tombstone) is
  refused: it names no key. With ``key_from: message`` the key fields come from the record's key
  (a JSON object, or one scalar) and a tombstone deletes that key, as in a compacted topic.
- ``debezium``: the value is a Debezium change event (JSON converter, with or without its
  ``schema``/``payload`` envelope). ``op`` c (create), r (snapshot read) and u (update) upsert
  ``after``; d deletes the key of ``before``; the event's ``source`` block is the document's
  ``_meta.source`` (read for ordering by ``sequence_by``, never landed); tombstones (null values, which Debezium writes after a
  delete for log compaction) carry no change and are left out, as Debezium's documentation intends.
  Other ops (``t`` truncate, ``m`` message) are refused, naming the record.

Order: ``_seq`` is ``struct(topic, partition, offset)``: within a partition, later offsets win,
which is Kafka's own order.
"""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from materializer.columns import OP, SEQ
from materializer.errors import SourceError
from materializer.sources.kafka import debezium_types as dbz
from materializer.sources.documents.reader import FIRST_FAILURES, LINE_SHOWN, DocumentReader
from materializer.sources.json_text import deep_column, depth_problem, parse_one
from materializer.sources.kafka.transport import null_envelope
from materializer.sqltypes import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


@dataclass
class _Where:
    """What the documents reader names in its messages (its ``store.uri``)."""

    uri: str


class KafkaReader(DocumentReader):
    """The documents reader with records in place of lines: ``_seq`` is (topic, partition, offset),
    errors name records, and Debezium events become documents before the same checks."""

    def __init__(
        self, spark: "SparkSession", where: str, keys: list[str], declared: "StructType | None",
        checkpoint: dict[str, Any] | None, payload: str, key_from: str = "value", *,
        placeholder: str = "__debezium_unavailable_value", keep_stored: bool = True, dead_letter: bool = False,
    ) -> None:
        super().__init__(spark, _Where(where), keys, declared, checkpoint)  # type: ignore[arg-type]
        self.payload = payload
        self.key_from = key_from
        self.placeholder = placeholder
        """Debezium's value for a value it does not have (``unavailable_value``)."""
        self.keep_stored = keep_stored
        """Placeholders keep the stored value (mode standard); else a record holding one is refused."""
        self.placeholders = False
        """Whether a record of the epoch holds a placeholder (set by :meth:`check`)."""
        self._unavailable: list[str] = []
        """The fields holding placeholders in the epoch."""
        self.carry: list[str] = []
        """Columns of the records kept through :meth:`parsed` (a route_by template's route fields)."""
        self.unrouted: str | None = None
        """``source.unrouted``: every record's problem (each one names no table)."""
        self.kafka_dead_letters = dead_letter
        self.dead_letter = dead_letter
        self._semantic: dict[str, tuple[str, dict[str, str]]] = {}
        """The epoch's fields with a decoded Debezium type: name and parameters (set by :meth:`check`)."""
        self.declared_landing = declared if payload == "debezium" else None
        """source.schema as declared (its BINARY fields land from base64; the checks see STRING)."""
        if declared is not None and payload == "debezium":
            from pyspark.sql import types as T

            self.declared = T.StructType([
                T.StructField(f.name, T.StringType()) if isinstance(f.dataType, T.BinaryType) else f for f in declared.fields
            ])

    def parsed(self, records: "DataFrame") -> "DataFrame":  # type: ignore[override]
        """``value`` (the document's JSON text), ``__kafka`` (a problem of the record itself), ``__v``."""
        from pyspark.sql import functions as F

        # Kafka Connect's JSON converter with schemas.enable writes a tombstone (a null value) as
        # {"schema": null, "payload": null}: the same tombstone.
        if self.kafka_dead_letters:
            # The record as read, for the dead-letter table.
            records = records.withColumn("__record", F.struct(F.col("timestamp"), F.col("key"), F.col("value")))
        records = records.withColumn("value", F.when(~null_envelope(F.col("value")), F.col("value")))
        if self.payload == "debezium":
            records = self._debezium(records)
        elif self.key_from == "message":
            records = self._keyed(records)
        else:
            records = records.withColumn(
                "__kafka",
                F.when(
                    F.col("value").isNull(),
                    F.lit("the record's value is null (a tombstone): with payload documents a record must hold a JSON "
                          "document, and a delete is a document with \"_meta\": {\"op\": \"d\"} and its key fields"),
                ),
            )
        if self.payload != "debezium" and self.key_from != "message":
            # What the checks and the rows read of a record (the others already select theirs).
            records = records.select(F.col("value"), F.col(SEQ), F.col("__kafka"), *self._carried())
        self.lines = records
        # Unlike lines of a file, no record is skipped: a blank value is refused as not JSON.
        return records.withColumn("__v", parse_one(F.col("value")))

    def judged_lines(self) -> tuple["DataFrame", "DataFrame"]:
        """The text :meth:`document_lines` gives is judged (none for a record with a problem of its
        own, which is then not fast), and the record is kept as it is read."""
        from pyspark.sql import functions as F

        assert self.lines is not None
        return self.lines.select(F.when(F.col("__kafka").isNull(), F.col("value")).alias("__judged"), "*"), self.lines

    def document_lines(self) -> "DataFrame":
        """Every record's text (a blank value is refused as not JSON, never skipped); a record
        with a problem of its own (``__kafka``: a tombstone, a key that disagrees with the value)
        gives no text to check, so it goes the VARIANT route, whose problem names it."""
        from pyspark.sql import functions as F

        assert self.lines is not None
        return self.lines.withColumn("value", F.when(F.col("__kafka").isNull(), F.col("value")))

    def _keyed(self, records: "DataFrame") -> "DataFrame":
        """``key_from: message``: the key fields from the record's key, spliced into the document
        (or checked equal, where the value holds them too); a tombstone deletes the key."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        parsed_key = parse_one(F.col("key"))
        wrapped = F.try_variant_get(parsed_key, "$.schema", "variant").isNotNull() & F.try_variant_get(parsed_key, "$.payload", "variant").isNotNull()
        key = F.when(wrapped, F.try_variant_get(parsed_key, "$.payload", "variant")).otherwise(parsed_key)
        is_object = F.schema_of_variant(key).startswith("OBJECT")
        if len(self.keys) == 1:
            name = self.keys[0]
            # One key field: a JSON scalar as it is, plain text as a string.
            scalar = F.when(key.isNotNull(), F.concat(F.lit("{" + json.dumps(name) + ":"), F.to_json(key), F.lit("}")))
            key_json = F.when(is_object, F.to_json(key)).otherwise(F.coalesce(scalar, F.to_json(F.struct(F.col("key").alias(name)))))
        else:
            key_json = F.when(is_object, F.to_json(key))
        key_doc = F.try_parse_json(key_json)
        fields = T.StructType([T.StructField(k, T.VariantType()) for k in self.keys])
        in_key = key_doc.try_cast(fields)
        value = parse_one(F.col("value"))
        in_value = value.try_cast(fields)
        held = [in_value[k].isNotNull() for k in self.keys]
        any_held = functools.reduce(lambda a, b: a | b, held)
        differs = [(in_value[k].isNotNull() & (F.to_json(in_value[k]) != F.to_json(in_key[k])), k) for k in self.keys]
        missing = [(in_key[k].isNull() | F.is_variant_null(in_key[k]), k) for k in self.keys]
        key_inner = F.expr("substring(__key_json, 2, length(__key_json) - 2)")
        value_inner = F.expr("substring(value, 2 + length(value) - length(ltrim(value)))")
        problem = F.when(F.col("key").isNull(), F.lit("the record has no key, and key_from: message takes the key fields from it"))
        problem = problem.when(key_json.isNull(), F.lit(
            f"the record's key must be a JSON object holding the key fields {self.keys}"
            + (" (or, for one key field, a JSON scalar or plain text)" if len(self.keys) == 1 else "")
        ))
        for condition, name in missing:
            problem = problem.when(condition, F.lit(f"the record's key has no key field {name!r} (or it is null)"))
        for condition, name in differs:
            problem = problem.when(F.col("value").isNotNull() & condition, F.lit(f"key field {name!r} in the value differs from the record's key"))
        tombstone = F.concat(F.lit('{"_meta":{"op":"d"},'), F.col("__key_inner"), F.lit("}"))
        spliced = F.when(
            F.trim(F.col("__value_inner")).startswith("}"), F.concat(F.lit("{"), F.col("__key_inner"), F.col("__value_inner"))
        ).otherwise(F.concat(F.lit("{"), F.col("__key_inner"), F.lit(","), F.col("__value_inner")))
        text = (
            F.when(F.col("__kafka").isNotNull(), F.col("value"))
            .when(F.col("value").isNull(), tombstone)
            # The value holds the key fields (checked equal above), or is no object: left as it is.
            .when(any_held | value.isNull() | ~F.schema_of_variant(value).startswith("OBJECT"), F.col("value"))
            .otherwise(spliced)
        )
        return (
            records.withColumn("__key_json", key_json)
            .withColumn("__key_inner", key_inner)
            .withColumn("__value_inner", value_inner)
            .withColumn("__kafka", problem)
            .select(text.alias("value"), F.col(SEQ), F.col("__kafka"), *self._carried())
        )

    def _debezium(self, records: "DataFrame") -> "DataFrame":
        """Debezium events as documents: ``after`` for c/r/u, ``before`` marked deleted for d;
        tombstones (null values) left out. Each step is a column of its own, so no expression is
        repeated inside another (Spark's analyzer would take minutes over the inlined tree)."""
        from pyspark.sql import functions as F

        records = records.where(F.col("value").isNotNull()).withColumn("__raw", parse_one(F.col("value")))
        event = F.col("__raw")
        # The JSON converter with schemas.enable wraps the event: {"schema": …, "payload": {…}}.
        wrapped = F.try_variant_get(event, "$.schema", "variant").isNotNull() & F.try_variant_get(event, "$.payload", "variant").isNotNull()
        records = records.withColumn("__wrapped", F.coalesce(wrapped, F.lit(False)))
        records = records.withColumn("__event", F.when(F.col("__wrapped"), F.try_variant_get(event, "$.payload", "variant")).otherwise(event))
        ev = F.col("__event")
        records = records.withColumn("__op", F.try_variant_get(ev, "$.op", "string"))
        op = F.col("__op")
        # Placeholders (an unchanged TOASTed column): the fields are left out of the document and
        # named in __unavailable, so the MERGE keeps their stored values. Only records whose text
        # holds the placeholder are looked into.
        records = records.withColumn("__fields", F.try_variant_get(ev, "$.after", "map<string,variant>"))
        fields = F.col("__fields")
        marks = [self.placeholder, base64.b64encode(self.placeholder.encode()).decode()]

        def unavailable_value(v: "Column") -> "Column":
            text = F.to_json(v)
            return text.isin(*[json.dumps(m) for m in marks]) | text.isin(*[json.dumps([m]) for m in marks])

        quick = functools.reduce(lambda a, b: a | b, [F.col("value").contains(m) for m in marks])
        records = records.withColumn("__unavailable", F.when(quick, F.map_keys(F.map_filter(fields, lambda _k, v: unavailable_value(v)))))
        records = records.withColumn("__unavailable", F.when(F.size("__unavailable") > 0, F.col("__unavailable")))
        records = records.withColumn(
            "__available",
            F.when(F.col("__unavailable").isNotNull(), F.map_filter(fields, lambda _k, v: ~unavailable_value(v))).otherwise(fields),
        )
        # Debezium's semantic types (a Decimal's base64 bytes, a Date's days, …), named by the
        # record's own schema envelope, or without one by source.schema: decoded here, on the
        # executors, into values Spark casts exactly to the column types (debezium_types).
        declared = dbz.declared_semantics(self.declared_landing)
        named = F.when(F.col("__wrapped"), dbz.semantics(event))
        records = records.withColumn("__semantic", named if declared is None else F.coalesce(named, declared))
        records = records.withColumn("__semantic", F.when(F.size("__semantic") > 0, F.col("__semantic")))
        sem = F.col("__semantic")

        def decoded(values: str) -> "Column":
            return F.when(sem.isNotNull(), F.transform_values(
                F.col(values), lambda k, v: F.when(sem[k].isNull(), v).otherwise(dbz.decode(v, sem[k]))
            ))

        def undecoded(values: str, typed: str) -> "Column":
            bad = F.map_filter(F.col(typed), lambda k, d: d.isNull() & sem[k].isNotNull() & ~F.is_variant_null(F.col(values)[k]))
            return F.transform(F.map_keys(bad), lambda k: F.concat(k, F.lit(" ("), sem[k]["name"], F.lit(")")))

        records = records.withColumn("__before_fields", F.try_variant_get(ev, "$.before", "map<string,variant>"))
        records = records.withColumn("__typed_after", decoded("__available")).withColumn("__typed_before", decoded("__before_fields"))
        records = records.withColumn("__undecoded", F.when(
            sem.isNotNull(),
            F.when(op == F.lit("d"), undecoded("__before_fields", "__typed_before")).otherwise(undecoded("__available", "__typed_after")),
        ))
        records = records.withColumn("__after", (
            F.when(sem.isNotNull(), F.to_json(F.col("__typed_after")))
            .when(F.col("__unavailable").isNotNull(), F.to_json(F.col("__available")))
            .otherwise(F.to_json(F.try_variant_get(ev, "$.after", "variant")))
        ))
        records = records.withColumn(
            "__before", F.when(sem.isNotNull(), F.to_json(F.col("__typed_before"))).otherwise(F.to_json(F.try_variant_get(ev, "$.before", "variant")))
        )
        after, before = F.col("__after"), F.col("__before")
        after_ok = F.try_variant_get(ev, "$.after", "variant").isNotNull() & ~F.is_variant_null(F.try_variant_get(ev, "$.after", "variant"))
        # coalesce: a missing before/after has no schema (NULL), which must count as "not an object".
        before_obj = F.coalesce(F.schema_of_variant(F.try_variant_get(ev, "$.before", "variant")).startswith("OBJECT"), F.lit(False))
        after_obj = F.coalesce(F.schema_of_variant(F.try_variant_get(ev, "$.after", "variant")).startswith("OBJECT"), F.lit(False))
        # The event's source block (Postgres lsn, MySQL file/pos, ts_ms, …) goes under _meta.source,
        # which a binding may order by (sequence_by: [_meta.source.lsn]); _meta never lands.
        source = F.to_json(F.try_variant_get(ev, "$.source", "variant"))
        records = records.withColumn("__meta", F.when(source.isNotNull(), F.concat(F.lit('"source":'), source)))
        meta = F.col("__meta")
        upserted = (
            F.when(meta.isNull(), after)
            .when(after == F.lit("{}"), F.concat(F.lit('{"_meta":{'), meta, F.lit("}}")))
            .otherwise(F.concat(F.lit('{"_meta":{'), meta, F.lit("},"), F.substring(after, 2, 1 << 30)))
        )
        delete_meta = F.when(meta.isNull(), F.lit('{"_meta":{"op":"d"}')).otherwise(F.concat(F.lit('{"_meta":{"op":"d",'), meta, F.lit("}")))
        deleted = F.when(before == F.lit("{}"), F.concat(delete_meta, F.lit("}"))).otherwise(
            F.concat(delete_meta, F.lit(","), F.substring(before, 2, 1 << 30))
        )
        problem = (
            # parse_one leaves a text too deep unparsed (NULL) as it does bad JSON: say which it was.
            F.when(event.isNull() & deep_column(F.col("value")), depth_problem(F.col("value"), "Debezium change event"))
            .when(event.isNull(), F.lit("not a valid JSON Debezium change event"))
            .when(op.isNull(), F.lit("not a Debezium change event: it has no string 'op' (c, r, u or d)"))
            .when(op.isin("c", "r", "u") & ~(after_ok & after_obj), F.concat(F.lit("Debezium event op '"), op, F.lit("' has no 'after' object")))
            .when((op == F.lit("d")) & ~before_obj, F.lit("Debezium delete (op 'd') has no 'before' object to take the key from"))
            .when(~op.isin("c", "r", "u", "d"), F.concat(F.lit("Debezium op '"), op, F.lit("' (truncate 't', message 'm') is not supported: only c, r, u and d change rows")))
        )
        unkept = F.concat(
            F.lit("Debezium's placeholder for a value it does not have ("), F.lit(self.placeholder), F.lit(") in field(s) "),
            F.array_join(F.array_sort(F.col("__unavailable")), ", "),
            F.lit(": only mode standard keeps the stored value in its place; set the connector to send the value "
                  "(Postgres: REPLICA IDENTITY FULL), or use mode standard"),
        )
        keys_unavailable = functools.reduce(
            lambda a, b: a | b, [F.array_contains(F.col("__unavailable"), F.lit(k)) for k in self.keys]
        )
        problem = problem.when(
            (op != F.lit("d")) & keys_unavailable,
            F.concat(F.lit("key field(s) hold Debezium's placeholder "), F.lit(self.placeholder), F.lit(": a key must be sent")),
        )
        if not self.keep_stored:
            problem = problem.when((op != F.lit("d")) & F.col("__unavailable").isNotNull(), unkept)
        problem = problem.when(
            F.size("__undecoded") > 0,
            F.concat(
                F.lit("field(s) "), F.array_join("__undecoded", ", "),
                F.lit(" do not decode as their Debezium type says (base64 bytes of at most 38 digits for a decimal, a "
                      "whole number for a date or time, ISO-8601 text for a ZonedTimestamp); the value is refused, "
                      "never landed as NULL"),
            ),
        )
        records = records.withColumn("__kafka", problem)
        text = F.when(F.col("__kafka").isNotNull(), F.col("value")).when(op == F.lit("d"), deleted).otherwise(upserted)
        return records.select(
            text.alias("value"), F.col(SEQ), F.col("__kafka"),
            F.when(op != F.lit("d"), F.col("__unavailable")).alias("__unavailable"),
            F.to_json(F.col("__semantic")).alias("__semantic"),
            *self._carried(),
        )

    def problem(self, lean: bool = False) -> "Column":
        from pyspark.sql import functions as F

        if self.unrouted is not None:
            return F.lit(self.unrouted)
        return F.coalesce(F.col("__kafka"), super().problem(lean))

    # --- dead letters ---

    def _carried(self) -> list["Column"]:
        from pyspark.sql import functions as F

        return ([F.col("__record")] if self.kafka_dead_letters else []) + [F.col(c) for c in self.carry]

    def rejected_records(self, checked: "DataFrame") -> "DataFrame":
        """The epoch's invalid records as the dead-letter table keeps them: where they are
        (``source``, ``topic``, ``partition``, ``offset``), the record (``timestamp``, ``key``,
        ``value`` as read) and the rule broken (``reason``, the words of ``on_invalid: fail``)."""
        from pyspark.sql import functions as F

        return checked.where(F.col("__problem").isNotNull()).select(
            F.lit(self.store.uri).alias("source"),
            F.col(f"{SEQ}.topic").alias("topic"),
            F.col(f"{SEQ}.partition").alias("partition"),
            F.col(f"{SEQ}.offset").alias("offset"),
            F.col("__record.timestamp").alias("timestamp"),
            F.col("__record.key").alias("key"),
            F.col("__problem").alias("reason"),
            F.col("__record.value").alias("value"),
        )

    def tallies(self) -> list["Column"]:
        from pyspark.sql import functions as F

        # The documents reader would collect the bad documents' files: records have none (the bad
        # ones are found again by their __problem).
        dead_letter, self.dead_letter = self.dead_letter, False
        try:
            tallies = super().tallies()
        finally:
            self.dead_letter = dead_letter
        if dead_letter:
            tallies.append(F.array().cast("array<string>").alias("files"))
        if self.payload == "debezium":
            # The names of fields some change did not carry (a few names, never rows).
            named = F.collect_set(F.when(F.col("__problem").isNull(), F.col("__unavailable")))
            tallies.append(F.array_distinct(F.flatten(named)).alias("unavailable"))
            # The distinct semantic types of the epoch's fields (a few small maps, never rows).
            tallies.append(F.collect_set(F.when(F.col("__problem").isNull(), F.col("__semantic"))).alias("semantic"))
        return tallies

    def _verdict(self, checked: "DataFrame", row: Any) -> tuple[int, "StructType"]:
        self.placeholders = self.payload == "debezium" and bool(row["unavailable"])
        self._unavailable = sorted(row["unavailable"] or []) if self.placeholders else []
        if self.payload == "debezium":
            self._semantic = dbz.semantic_fields(sorted(row["semantic"] or []), self.store.uri)
        return super()._verdict(checked, row)

    def rows(self, parsed: "DataFrame", schema: "StructType") -> "DataFrame":
        """The documents' rows (with Debezium's placeholders, the fields each change does not carry:
        ``__unavailable``); for a range without a document (only aborted records, transaction
        markers or tombstones passed over) no row but the key columns: an empty epoch, which
        applies nothing and moves the position on."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        if not schema.fields:
            return parsed.limit(0).select(*[F.lit(None).alias(k) for k in self.keys], F.lit("u").alias(OP), F.col(SEQ))
        schema = self._landing(schema)
        binary = [f.name for f in schema.fields if isinstance(f.dataType, T.BinaryType)]
        if binary:
            # Debezium's bytes are base64 text: cast as text, then decoded (checked per record).
            schema = T.StructType([T.StructField(f.name, T.StringType()) if f.name in binary else f for f in schema.fields])
        rows = self._rows(parsed, schema)
        for name in binary:
            # Quoted: a column is named by the source database, and F.col reads `a.b` as a field
            # of `a` and chokes on a backtick; withColumn's name is taken as it is.
            rows = rows.withColumn(name, F.unbase64(F.col(quote(name))))
        return rows

    def _landing(self, schema: "StructType") -> "StructType":
        """``schema`` with Debezium's semantic types: the declared type where source.schema gives
        one, else the type the semantic type lands as (debezium_types.landing_type)."""
        from pyspark.sql import types as T

        declared = self.declared_landing
        fields = []
        for f in schema.fields:
            if declared is not None and f.name in declared.names:
                fields.append(T.StructField(f.name, declared[f.name].dataType))
            elif f.name in self._semantic:
                fields.append(T.StructField(f.name, dbz.landing_type(*self._semantic[f.name])))
            else:
                fields.append(f)
        return T.StructType(fields)

    def _rows(self, parsed: "DataFrame", schema: "StructType") -> "DataFrame":
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from materializer.changes import UNAVAILABLE

        if not (self.placeholders and self.keep_stored):
            return super().rows(parsed, schema)

        # A field no change of the epoch carried a value for (placeholders and NULLs only) is no
        # column of the epoch's schema: it becomes one (NULL, typed by the table), so the MERGE
        # can keep its stored value.
        missing = [name for name in self._unavailable if name not in schema.names]
        schema = T.StructType(schema.fields + [T.StructField(name, T.NullType()) for name in missing])
        # The documents reader's rows keep _seq of each document: __unavailable rides in it.
        carried = parsed.withColumn(SEQ, F.struct(F.col(SEQ).alias("s"), F.col("__unavailable").alias("u")))
        rows = super().rows(carried, schema)
        return rows.withColumn(UNAVAILABLE, F.col(SEQ)["u"]).withColumn(SEQ, F.col(SEQ)["s"])

    def _located(
        self, checked: "DataFrame", first: Any, bad: int | None, shape: str | None, problems: list[str] | None = None
    ) -> SourceError:
        """The error naming the first bad records (topic, partition, offset): error path only."""
        from pyspark.sql import functions as F

        if shape is not None:
            wanted = F.col("__problem").isNull() & (F.schema_of_variant(F.col("__v")) == F.lit(shape))
        else:
            wanted = F.col("__problem").isNotNull()
        found = (
            checked.where(wanted)
            .orderBy(SEQ)
            .select(F.col(SEQ), "__problem", F.substring("value", 1, LINE_SHOWN).alias("text"))
            .limit(FIRST_FAILURES)
            .collect()
        )
        if not found:
            return SourceError(f"{self.store.uri}: {'; '.join(problems or ['a record is refused'])}. {self.hint()}", file=self.store.uri)
        reports = []
        for item in found:
            seq = item[SEQ]
            problem = item["__problem"] or self._why(item["text"] or "", problems)
            reports.append(f"{self.store.uri} topic {seq['topic']} partition {seq['partition']} offset {seq['offset']}: {problem}")
        more = f" ({bad} bad record(s) in this transaction)" if bad and bad > len(found) else ""
        return SourceError(".\n".join(reports) + f".{more} {self.hint()}", file=self.store.uri, line=int(found[0][SEQ]["offset"]))

    def hint(self) -> str:
        return (
            "Fix the producer and write corrected records after them (a topic's records cannot be changed): nothing "
            "from this transaction was applied, and the run resumes from "
            f"{json.dumps((self.resume_from or {}).get('offsets')) if self.resume_from else 'the starting position'}."
        )

    def explain(self, exc: BaseException) -> SourceError | None:
        text = str(exc)
        if any(sign in text for sign in ("KAFKA_DATA_LOSS", "failOnDataLoss", "OffsetOutOfRange", "Cannot fetch offset")):
            first = next((line for line in text.splitlines() if "offset" in line.lower()), text[:500])
            return SourceError(
                f"{self.store.uri}: records of this transaction's offset range disappeared from the broker while Spark "
                f"read them (retention?): {first.strip()[:500]} Nothing from this transaction was applied; the next run "
                "stops naming what is lost (or, with source.on_data_loss: skip, goes on past it)."
            )
        return super().explain(exc)
