"""One topic, many tables: the bindings a ``route_by`` template makes share one topic's position.

(With ``topic_pattern``, each topic the pattern matches has a router and a position of its own.)

A Debezium topic routed by table (``ByLogicalTableRouter``), or an outbox topic, carries the change
events of several source tables; the template's ``route_by`` names the fields of each record that
tell them apart (``source.table``, ``source.schema``, …), and each value is one binding, one table.

The topic has **one** position, shared by its tables. Per epoch, :class:`KafkaRouter`:

1. plans the epoch's offset range once, from the shared position (as a kafka binding does:
   ``max_records``, ``max_bytes``, lost records, compaction), and keeps that plan until the epoch is
   committed, so every routed binding of the epoch reads exactly the same range;
2. reads the route fields of the range's records on the executors (one aggregate; what comes back
   is one row per table, with the offset that first names it) and refuses a record without them,
   naming its topic, partition and offset, before anything of the epoch is staged or committed
   (with ``on_invalid: dead_letter`` and one dead-letter table, such records are instead the
   records of one more binding, :func:`materializer.templates.unrouted_found`, which reads the
   same range and sets each aside as a dead letter);
3. hands each routed binding whose table the range carries that plan (:class:`RoutedKafkaSource`);
   the binding keeps its own records (``source.routed``, a filter on the executors) of the range
   as the router read and parsed it, once for all the tables (:meth:`KafkaRouter._read`). A table
   the range does not carry has no batch in the epoch.

A value first seen in an epoch's range becomes a binding *in that epoch* (the runtime ends its round
of bindings at the boundary before it and opens the next with the new binding; the plan is kept
across, so the epoch reads what was scanned): no record is held back, so the topic keeps one
position and each partition's order per table. The epoch's driver checkpoint records every routed
table so far (``templated``); each binding's runtime checkpoint is the range it read, so a replay
reads the same offsets and keeps the same records for the same tables.

The shared position after an epoch is the newest of the routed bindings' checkpoints (every epoch
with records gives at least one table a batch); the others' are older or equal, checked.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import TYPE_CHECKING, Any

from materializer import templates
from materializer.columns import SEQ
from materializer.config import BindingConfig, PipelineConfig, routed_found
from materializer.errors import ConfigError, SourceError
from materializer.sources import SourceBatch
from materializer.sources.kafka.source import KafkaSource
from materializer.sources.kafka.plan import Partition, Plan, positions_of
from materializer.sources.kafka.transport import route_field
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

ROUTE = "__route_"
"""Prefix of the route fields' columns in the range's documents (:meth:`KafkaRouter._read`)."""


class KafkaRouter:
    """The shared position and the fixed per-epoch plan of one ``route_by`` template's topic."""

    def __init__(self, config: PipelineConfig, index: int, spool: Store, topic: str | None = None) -> None:
        self.config = config
        self.index = index
        self.template = config.templates[index]
        self.topic = topic if topic is not None else self.template.source.topic or ""
        """The topic this router reads: the template's ``topic``, or one its ``topic_pattern`` matches."""
        self.route_by = dict(self.template.source.route_by or {})
        example = templates.make(config, index, routed_found(self.topic, {k: "example" for k in self.route_by}))
        assert example is not None
        # The topic as a plain kafka binding: plans and reads the whole range, unfiltered.
        base = example.binding.model_copy(update={"source": example.binding.source.model_copy(update={"routed": None})})
        self.source = KafkaSource(base, spool)
        self.where = f"templates[{index}] (topic {self.topic!r})"
        self._key: str | None = None
        self._passed: tuple[str, dict[str, Any]] | None = None
        """After which committed position (a key of :meth:`fix`) where the records that name no table end."""
        self.position: dict[str, Any] | None = None
        """Where the fixed plan starts (a kafka runtime checkpoint; None: ``starting``): the shared
        position, or past it the records that name no table."""
        self.plan: Plan | None = None
        """The next epoch's offsets, fixed until it is committed (None or empty: nothing to read)."""
        self.found: dict[str, tuple[str, int, int]] = {}
        """The tables the plan's records name (a :func:`routed_found` text each), with the first record of each."""
        self._records: "DataFrame | None" = None
        """The fixed plan's records as documents, kept on the executors (:meth:`_read`)."""

    def shared_position(self, checkpoints: dict[str, Any]) -> dict[str, Any] | None:
        """The topic's position after the last committed epoch, from its routed bindings' runtime
        checkpoints (by name): the newest, which every other must not pass."""
        given = [c for c in checkpoints.values() if c]
        if not given:
            return None
        newest = max(given, key=lambda c: sum(positions_of(c).values()))
        top = positions_of(newest)
        for name, checkpoint in sorted(checkpoints.items()):
            if checkpoint and any(top.get(p, -1) < o for p, o in positions_of(checkpoint).items()):
                raise SourceError(
                    f"{self.where}: binding {name!r} stands at {positions_of(checkpoint)}, past the topic's shared "
                    f"position {top}: the recovery log's checkpoints of one topic's tables disagree. Nothing was read; "
                    "restore the log, or rebuild these tables with a new pipeline id"
                )
        return newest

    def fix(self, spark: "SparkSession", epoch: int, position: dict[str, Any] | None) -> list[str]:
        """Fix the plan of the epoch after ``epoch`` from ``position`` and return the tables its
        records name, refusing a record that names none or a table no binding can be made for.
        A plan with tables is kept until an epoch is committed (so the round of bindings opened
        for them reads exactly what was scanned); one without is made again each time (new
        records may have come)."""
        key = json.dumps([epoch, position], sort_keys=True)
        if key == self._key and self.found:
            return sorted(self.found)
        source = self.template.source
        start = self._passed[1] if self._passed is not None and self._passed[0] == key else position
        records = None
        while True:
            plan = self.source.plan(start, source.max_records or self.config.transaction.max_documents)
            if not plan.empty and source.kafka_max_bytes is not None:
                plan = self.source.bounded(spark, plan, source.kafka_max_bytes)
            if records is not None:
                records.unpersist()
            records = None if plan.empty else self._read(spark, plan)
            found = {} if records is None else self._scan(records)
            if found or plan.empty:
                break
            # Records that name no table (Debezium's tombstones after deletes: no change of any
            # table) fill the range: no binding would read it, so no checkpoint would pass it and
            # every epoch would plan it again. Passed over here, in memory; the first range that
            # names a table starts after it (its checkpoint records that range), and a restart
            # before that commit passes over the same records again.
            log.info("%s: %s name no table (tombstones): passed over", self.where, plan.description())
            start = plan.checkpoint()
            self._passed = (key, start)
        for text, first in sorted(found.items()):
            try:
                templates.make(self.config, self.index, text)
            except ConfigError as exc:
                raise SourceError(
                    f"{_record(first)} is the first of the epoch to name this table: {exc}. Nothing of the epoch was "
                    "committed; change the template's name or table so every value makes one, then run again"
                ) from None
        if self._records is not None and self._records is not records:
            self._records.unpersist()
        self._key, self.position, self.plan, self.found, self._records = key, start, plan, found, records
        return sorted(found)

    def _read(self, spark: "SparkSession", plan: Plan) -> "DataFrame":
        """The range's records read from the brokers and made documents once for every table of
        the epoch (the tables of one template share key, schema and payload), with the route
        fields as columns (``__route_<placeholder>``); kept (memory, then disk) on the executors by
        the scan's job. Each routed binding checks and stages its own records from there, instead
        of reading the range and planning the whole parse again per table. Blocks Spark lets go
        are computed again from the same offsets: the same documents."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        payload = self.template.source.payload
        columns = {ROUTE + name: route_field(F.col("value"), path, payload) for name, path in sorted(self.route_by.items())}
        reader = self.source.reader(spark, None)
        reader.carry = sorted(columns)
        # Debezium's tombstones (null values) change no table: the parse leaves them out.
        return reader.parsed(self.source.records(spark, plan).withColumns(columns)).persist(StorageLevel.MEMORY_AND_DISK)

    def parsed_of(self, plan: Plan, source: Any) -> "DataFrame | None":
        """The documents of ``plan`` that ``source`` (a routed binding's) takes, when ``plan`` is
        the fixed plan (None: the caller reads and parses them itself)."""
        from pyspark.sql import functions as F

        if self._records is None or plan is not self.plan:
            return None
        by_path = {path: F.col(ROUTE + name) for name, path in self.route_by.items()}
        if source.routed is not None:
            condition = functools.reduce(lambda a, b: a & b, [by_path[p] == F.lit(v) for p, v in sorted(source.routed.items())])
        else:
            condition = functools.reduce(lambda a, b: a | b, [F.coalesce(by_path[p], F.lit("")) == F.lit("") for p in source.unrouted])
        return self._records.where(condition)

    def _scan(self, records: "DataFrame") -> dict[str, tuple[str, int, int]]:
        """Per combination of route values in the range's documents (:meth:`_read`), its first
        record (topic, partition, offset): an aggregate on the executors, one row per table back."""
        from pyspark.sql import functions as F

        fields = [F.col(ROUTE + name).alias(name) for name in sorted(self.route_by)]
        rows = records.groupBy(*fields).agg(F.min(SEQ).alias("first")).collect()
        found: dict[str, tuple[str, int, int]] = {}
        missing: list[tuple[tuple[str, int, int], list[str]]] = []
        for row in rows:
            first = (row["first"]["topic"], int(row["first"]["partition"]), int(row["first"]["offset"]))
            values = {name: row[name] for name in self.route_by}
            absent = [self.route_by[n] for n, v in sorted(values.items()) if v is None or v == ""]
            if absent:
                missing.append((first, absent))
            else:
                found[routed_found(self.topic, values)] = first
        if missing and self.template.unrouted_dead_letters is not None:
            # on_invalid: dead_letter with one dead-letter table: the binding made for these
            # records reads the range too and sets each of them aside there.
            found[templates.unrouted_found(self.topic)] = min(first for first, _ in missing)
        elif missing:
            first, absent = min(missing)
            raise SourceError(
                f"{_record(first)} has no {' or '.join(absent)} (or its value is not a JSON object): {self.where} routes "
                f"every record of the topic to a table by route_by {self.route_by}, and this one names none. Nothing of "
                "the epoch was committed. Have the producer write the field in every record (Debezium: every change "
                "event has source.db, source.schema and source.table; a heartbeat or schema-change topic is not a table's), "
                "or read the topic with a binding of its own; or set aside such records as dead letters: on_invalid: "
                "dead_letter and a dead_letter_table without placeholders on the template (docs: 'One topic, many tables')"
            )
        return found

    def plan_for(self, name: str, text: str, checkpoint: dict[str, Any] | None) -> Plan | None:
        """The fixed plan for routed binding ``name`` (made from ``text``), None when the epoch's
        records do not name its table. Its checkpoint must not pass the shared position."""
        if self.plan is None or self.plan.empty or text not in self.found:
            return None
        shared = positions_of(self.position)
        if checkpoint and any(shared.get(p, -1) < o for p, o in positions_of(checkpoint).items()):
            raise SourceError(
                f"{self.where}: binding {name!r} stands at {positions_of(checkpoint)}, past the position the epoch was "
                f"planned from ({shared}): its checkpoint and the topic's disagree. Nothing was read; run again"
            )
        return self.plan

    def source_for(self, binding: BindingConfig, spool: Store, text: str) -> "RoutedKafkaSource":
        return RoutedKafkaSource(binding, spool, self, text)


class RoutedKafkaSource(KafkaSource):
    """A routed binding's source: the epoch's range as its router fixed it, its own records only."""

    def __init__(self, binding: BindingConfig, spool: Store, router: KafkaRouter, text: str) -> None:
        super().__init__(binding, spool)
        self.router = router
        self.text = text
        """What the binding was made from: a :func:`routed_found` text."""

    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str,
        *, until: dict[str, Any] | None = None,
    ) -> SourceBatch | None:
        if until is not None:
            return super().next_batch(spark, checkpoint, max_documents, spool_path, until=until)
        plan = self.router.plan_for(self.binding.name, self.text, checkpoint)
        if plan is None:
            return None
        return self._batch(spark, self.router.position, plan)

    def parsed(self, spark: "SparkSession", reader: Any, plan: Plan, *, hold: bool = False) -> "DataFrame":
        kept = self.router.parsed_of(plan, self.binding.source)  # the router keeps the records read
        if kept is None:
            return super().parsed(spark, reader, plan, hold=hold)
        return kept


def _record(first: tuple[str, int, int]) -> str:
    topic, partition, offset = first
    return f"record {topic}/{partition} offset {offset}"


__all__ = ["KafkaRouter", "Partition", "RoutedKafkaSource"]
