"""A binding's Kafka topics: the next epoch's offsets planned, and Spark reading exactly those records.

Shared by the kafka source, its ``route_by`` router and the kafka ``cdcv2`` payload
(:class:`KafkaTransport`), with the helpers both payload readers use on records' values.

Offsets are the runtime checkpoint. The driver asks the brokers for each partition's earliest and
latest offsets (a Python admin client: metadata only, no records), decides the epoch's range per
partition, ``[from, to)``, bounded by ``max_records`` (shared among partitions in proportion to
their backlog) and, if given, ``max_bytes`` (keys and values; Spark reads the range's sizes
first, since offsets say nothing of them), and records it in the checkpoint that is committed to the recovery log with the
epoch's staged file, before any apply. Spark then reads exactly that range on the executors
(``spark.read.format("kafka")`` with ``assign``, ``startingOffsets`` and ``endingOffsets`` as JSON):
no record passes through the Python process. Nothing is committed to a consumer group: the log's
offsets are the only position, so a replay is the epoch's staged file, and an epoch that was never
committed is read again from the same start.

Committed records only: Spark reads ``read_committed`` and the ranges end at the last stable
offset, unless ``options`` set ``kafka.isolation.level: read_uncommitted``. Aborted records and
transaction markers count as read: a range of nothing else is an empty epoch (no row, the
position moves on).

Partitions are listed each epoch: one that appeared since the checkpoint is read from offset 0.
A topic that is gone, a partition that is gone, a partition whose offsets went backwards (the topic
was recreated) and records the pipeline had not read that the broker no longer has (retention,
``delete_records``) stop the run with a SourceError naming the topic, partition and offsets; with
``on_data_loss: skip`` the lost records are skipped, logged as a warning, and named in the
checkpoint (``lost``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from materializer.columns import SEQ
from materializer.errors import SourceError
from materializer.sources.kafka.offsets import ISOLATION, Offsets, isolation_level
from materializer.sources.kafka.plan import (
    CompactionLag, Partition, Plan, byte_budgets, compaction_lags, compaction_risks, cut_by_bytes, duration, nested,
    plan_epoch, positions_of,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("materializer.sources.kafka")  # the kafka package's logger, whichever of its modules logs


class KafkaTransport:
    """A kafka binding's topics on the brokers: the next epoch's :class:`Plan`, its records as
    Spark reads them, the lag left after it. Needs the binding only (its ``source``)."""

    def __init__(self, binding: Any) -> None:
        self.binding = binding
        config = binding.source
        self.topics: list[str] = config.topic_names
        self.where = f"kafka://{config.bootstrap_servers}/{','.join(self.topics)}"
        self._offsets: Offsets | None = None
        self._start: dict[Partition, int] | None = None

    def offsets(self) -> Offsets:
        if self._offsets is None:
            config = self.binding.source
            read_committed = isolation_level(config.options) == "read_committed"
            self._offsets = Offsets(config.bootstrap_servers, dict(config.client_options), self.where, read_committed)
        return self._offsets

    def start_positions(self, watermarks: dict[Partition, tuple[int, int]]) -> dict[Partition, int]:
        """A new pipeline's positions, resolved once per process (so ``latest`` does not move on
        while a run waits for records)."""
        if self._start is None:
            starting = self.binding.source.starting
            if starting == "earliest":
                self._start = {p: low for p, (low, _) in watermarks.items()}
            elif starting == "latest":
                self._start = {p: high for p, (_, high) in watermarks.items()}
            elif isinstance(starting, dict) and set(starting) == {"timestamp"}:
                found = self.offsets().at_timestamp(sorted(watermarks), int(starting["timestamp"]))
                self._start = {p: (found[p] if found.get(p, -1) >= 0 else watermarks[p][1]) for p in watermarks}
            else:
                given = {(t, int(p)): int(o) for t, offsets in starting.items() for p, o in offsets.items()}
                self._start = {p: given.get(p, low) for p, (low, _) in watermarks.items()}
        return self._start

    def plan(self, checkpoint: dict[str, Any] | None, limit: int) -> Plan:
        watermarks = self.offsets().watermarks(self.topics)
        start = self.start_positions(watermarks) if checkpoint is None else None
        config = self.binding.source
        plan = plan_epoch(watermarks, self.topics, checkpoint, start, limit, config.on_data_loss, self.where)
        self._check_compaction(checkpoint, watermarks, plan)
        for (topic, partition), (a, b) in plan.lost.items():
            log.warning(
                "%s: on_data_loss=skip: partition %s/%d offsets %d to %d (%d records) were gone from the broker "
                "before the pipeline read them; they are NOT in the table",
                self.where, topic, partition, a, b - 1, b - a,
            )
        return plan

    def _check_compaction(self, checkpoint: dict[str, Any] | None, watermarks: dict[Partition, tuple[int, int]], plan: Plan) -> None:
        """A compacted topic's log cleaner removes a delete (tombstone) ``delete.retention.ms``
        after cleaning it: a pipeline whose first unread record is older than that may never see
        deletes, and the keys would stay in the table. Stop, or go on under ``on_data_loss: skip``
        (logged, and named in the epoch's description)."""
        known = {p: o for p, o in positions_of(checkpoint).items() if p in watermarks and o < watermarks[p][1]}
        if not known:
            return
        compacted = self.offsets().compacted(sorted({t for t, _ in known}))
        if not compacted:
            return
        now = int(time.time() * 1000)
        recent: dict[Partition, int] = {}
        for topic, window in compacted.items():
            recent.update(self.offsets().at_timestamp(sorted(p for p in known if p[0] == topic), now - window))
        risks = compaction_risks(known, watermarks, compacted, recent)
        for (topic, partition), offset in risks.items():
            window = duration(compacted[topic])
            if self.binding.source.on_data_loss != "skip":
                raise SourceError(
                    f"{self.where}: partition {topic}/{partition} of compacted topic {topic!r}: the first record the "
                    f"pipeline has not read (offset {offset}) is older than the topic's delete.retention.ms, {window}. "
                    "The log cleaner may have removed deletes (tombstones) written since, which the table would never "
                    "see: their keys would stay. Rebuild the table from the topic (a new pipeline), or set "
                    "source.on_data_loss: skip to go on (logged); keep pipelines within the window (run more often, "
                    f"raise max_records or delete.retention.ms). Nothing from this transaction was applied."
                )
            log.warning(
                "%s: on_data_loss=skip: partition %s/%d of compacted topic %s: the first unread record (offset %d) is "
                "older than delete.retention.ms (%s): deletes the cleaner removed since are NOT applied",
                self.where, topic, partition, topic, offset, window,
            )
            plan.compaction[(topic, partition)] = offset

    def compaction_lag(self, positions: dict[Partition, int]) -> list[CompactionLag]:
        """The lag beside the compaction window of every compacted partition with records left
        after ``positions`` (the first unread ones); empty when no topic is compacted."""
        offsets = self.offsets()
        compacted = offsets.compacted(self.topics)
        if not compacted:
            return []
        watermarks = offsets.watermarks(sorted(compacted))
        unread = {p: o for p, o in positions.items() if p[0] in compacted and p in watermarks and o < watermarks[p][1]}
        now = int(time.time() * 1000)
        return compaction_lags(unread, watermarks, compacted, offsets.timestamps_at(unread), now)

    def lag(self, plan: Plan, positions: dict[Partition, int] | None = None) -> tuple[dict[str, int], str]:
        """A batch's ``lag`` (records left; with a compacted topic, the nearest-to-its-window
        partition's ``oldest_unread_ms`` and ``delete_retention_ms``) and words for its description."""
        lag = {"records": plan.lag}
        lags = self.compaction_lag(plan.positions if positions is None else positions)
        if not lags:
            return lag, ""
        worst = lags[0]
        lag.update(oldest_unread_ms=worst.oldest_unread_ms, delete_retention_ms=worst.delete_retention_ms)
        if worst.margin_ms < worst.delete_retention_ms // 5:
            log.warning("%s: %s: run the pipeline more often, or raise max_records or delete.retention.ms", self.where, worst.describe())
        return lag, f"; {worst.describe()}"


    def bounded(self, spark: "SparkSession", plan: Plan, max_bytes: int) -> Plan:
        """``plan`` cut so its records' keys and values hold at most ``max_bytes`` (see
        :func:`byte_budgets`, :func:`cut_by_bytes`). The brokers' offsets say nothing of sizes, so
        Spark reads the range's sizes first (on the executors; one row per partition comes back).
        The cut plan is what the checkpoint records, so a replay reads exactly it."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        budgets = byte_budgets(plan, max_bytes)
        budget = F.lit(None).cast("long")
        for (topic, partition), amount in budgets.items():
            budget = F.when((F.col("topic") == topic) & (F.col("partition") == partition), F.lit(amount)).otherwise(budget)
        sized = self.records(spark, plan, raw_columns=True).select(
            "topic", "partition", "offset",
            (F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0))).alias("size"),
        )
        running = F.sum("size").over(Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, 0))
        fits = (
            sized.withColumn("running", running)
            .where(F.col("running") <= budget)
            .groupBy("topic", "partition")
            .agg(F.count(F.lit(1)).alias("n"))
            .collect()
        )
        cut = cut_by_bytes(plan, {(r["topic"], int(r["partition"])): int(r["n"]) for r in fits})
        if cut.records < plan.records:
            log.info("%s: max_bytes %d: the epoch takes %d of %d records", self.where, max_bytes, cut.records, plan.records)
        return cut

    def records(self, spark: "SparkSession", plan: Plan, raw_columns: bool = False) -> "DataFrame":
        """The epoch's records, exactly ``plan.ranges``, as Spark's Kafka connector reads them
        (``raw_columns``: its own columns, binary key and value)."""
        from pyspark.sql import functions as F

        config = self.binding.source
        assign: dict[str, list[int]] = {}
        for topic, partition in sorted(plan.ranges):
            assign.setdefault(topic, []).append(partition)
        starting = nested({p: a for p, (a, _) in plan.ranges.items()})
        ending = nested({p: b for p, (_, b) in plan.ranges.items()})
        reader = spark.read.format("kafka")
        for key, value in config.options.items():
            reader = reader.option(key, value)
        # Committed records only unless the user says otherwise: the range ends at the last stable
        # offset (Offsets), and Spark passes over aborted records and transaction markers in it.
        reader = reader.option(ISOLATION, isolation_level(config.options))
        raw = (
            reader.option("kafka.bootstrap.servers", config.bootstrap_servers)
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            # A record of the range missing when Spark reads it is a failure, never a gap.
            .option("failOnDataLoss", "true")
            .load()
        )
        if raw_columns:
            return raw
        records = raw.select(
            F.col("value").cast("string").alias("value"),
            F.col("key").cast("string").alias("key"),
            F.struct(F.col("topic"), F.col("partition"), F.col("offset")).alias(SEQ),
            F.col("timestamp"),
        )
        return routed_records(records, config)


def routed_records(records: "DataFrame", config: Any) -> "DataFrame":
    """``records`` (the kafka source's columns) kept to what ``config`` (a source config) takes:
    its ``routed`` table's records, or the ``unrouted`` ones; all of them without either."""
    from pyspark.sql import functions as F

    if config.routed is not None:
        # One topic, many tables: this binding's records only, on the executors; within a
        # partition they keep their offsets, so the table's order is the topic's.
        condition = F.lit(True)
        for path, value in sorted(config.routed.items()):
            condition = condition & (route_field(F.col("value"), path, config.payload) == F.lit(value))
        records = records.where(condition)
    if config.unrouted is not None:
        # The records a route_by template's tables do not take: one route field missing (or
        # empty, or the value no JSON object). Debezium's tombstones change no table: not these.
        absent = functools.reduce(
            lambda a, b: a | b,
            [F.coalesce(route_field(F.col("value"), path, config.payload), F.lit("")) == F.lit("") for path in config.unrouted],
        )
        records = records.where(absent & F.col("value").isNotNull() if config.payload == "debezium" else absent)
    return records


def route_field(value: "Column", path: str, payload: str) -> "Column":
    """The text of field ``path`` (dotted) of a record's JSON ``value``: Debezium's ``payload``
    envelope unwrapped when there is one; null when the value is null, not JSON or has no such field."""
    from pyspark.sql import functions as F

    plain = F.get_json_object(value, f"$.{path}")
    if payload != "debezium":
        return plain
    return F.coalesce(F.get_json_object(value, f"$.payload.{path}"), plain)


def null_envelope(value: "Column") -> "Column":
    """Whether a record's value is ``{"schema": null, "payload": null}`` (Kafka Connect's JSON
    converter's tombstone); false for a null value and for anything else."""
    from pyspark.sql import functions as F

    if_short = F.length(value) < 64  # the envelope is short: longer values are never parsed here
    event = F.when(if_short, F.try_parse_json(value))
    fields = F.when(F.schema_of_variant(event).startswith("OBJECT"), F.json_object_keys(F.to_json(event)))
    return F.coalesce(
        if_short
        & (F.size(fields) == 2)
        & F.is_variant_null(F.try_variant_get(event, "$.schema", "variant"))
        & F.is_variant_null(F.try_variant_get(event, "$.payload", "variant")),
        F.lit(False),
    )
