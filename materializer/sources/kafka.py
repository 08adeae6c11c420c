"""The ``kafka`` source: a topic's partitions, read by Spark's own Kafka connector in batch mode.

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

Payloads (``source.payload``):

- ``documents``: the value is a JSON document, read and checked exactly as the documents source
  does (:class:`~materializer.sources.json_documents.DocumentReader`: ``try_parse_json`` to VARIANT, one aggregate of checks and
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
which is Kafka's own order. Kafka orders nothing across partitions: producers that key records by
the document key (Kafka's default partitioner, Debezium) keep each key in one partition; a key
found in two partitions of one epoch takes the record of the higher (topic, partition).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from materializer.dead_letters import split
from materializer.errors import ConfigError, SourceError
from materializer.columns import OP, SEQ
from materializer.sources import Source, SourceBatch
from materializer.sources.json_documents import LINE_SHOWN, FIRST_FAILURES, DocumentReader, change_controlled, parse_schema
from materializer.sources import debezium_types as dbz
from materializer.sources.json_text import parse_one
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

Partition = tuple[str, int]
"""(topic, partition)."""


# --- the epoch's range (plain Python, unit-tested without a broker) --------------------------------


@dataclass
class Plan:
    """One epoch's offsets."""

    ranges: dict[Partition, tuple[int, int]]
    """Per partition with records to read, ``[from, to)``."""
    positions: dict[Partition, int]
    """Every partition's next offset after the epoch."""
    lost: dict[Partition, tuple[int, int]] = field(default_factory=dict)
    """Records skipped under ``on_data_loss: skip``: ``[from, to)``."""
    lag: int = 0
    """Records left after the epoch."""
    compaction: dict[Partition, int] = field(default_factory=dict)
    """Compacted partitions read past their delete.retention.ms under ``on_data_loss: skip``: the
    first unread record's offset (deletes from there on may be lost)."""

    @property
    def empty(self) -> bool:
        return not self.ranges

    @property
    def records(self) -> int:
        return sum(to - start for start, to in self.ranges.values())

    def checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {"offsets": _nested(self.positions), "range": _nested({p: list(r) for p, r in self.ranges.items()})}
        if self.lost:
            out["lost"] = _nested({p: list(r) for p, r in self.lost.items()})
        return out

    def description(self) -> str:
        parts = [f"{t}/{p}:{a}-{b - 1}" for (t, p), (a, b) in sorted(self.ranges.items())]
        text = ", ".join(parts) if len(parts) <= 4 else f"{', '.join(parts[:3])} … ({len(parts)} partitions)"
        return f"{text} ({self.records} offsets)"


def _nested(flat: dict[Partition, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (topic, partition), value in sorted(flat.items()):
        out.setdefault(topic, {})[str(partition)] = value
    return out


def positions_of(checkpoint: dict[str, Any] | None) -> dict[Partition, int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, offsets in ((checkpoint or {}).get("offsets") or {}).items()
        for partition, offset in offsets.items()
    }


def share(backlog: dict[Partition, int], limit: int) -> dict[Partition, int]:
    """How many records each partition gives to an epoch of at most ``limit``: all when the backlog
    fits, else in proportion to each partition's backlog (what rounding leaves goes to the largest
    fractions, ties by partition), so partitions move together and none starves."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    taken = {p: limit * n // total for p, n in backlog.items()}
    left = limit - sum(taken.values())
    for p in sorted(backlog, key=lambda p: (-(limit * backlog[p] % total), p)):
        if left <= 0:
            break
        if taken[p] < backlog[p]:
            taken[p] += 1
            left -= 1
    return taken


def plan_epoch(
    watermarks: dict[Partition, tuple[int, int]],
    topics: list[str],
    checkpoint: dict[str, Any] | None,
    start: dict[Partition, int] | None,
    limit: int,
    on_data_loss: str,
    where: str,
) -> Plan:
    """The next epoch after ``checkpoint``.

    ``watermarks``: each partition's (earliest, latest) offsets now, for every partition of
    ``topics``. ``start``: a new pipeline's positions (``starting`` resolved; only used without a
    checkpoint). Raises SourceError for a missing topic or partition, offsets that went backwards,
    and lost records unless ``on_data_loss`` is ``skip``.
    """
    known = positions_of(checkpoint)
    present = {t for t, _ in watermarks}
    hint = "nothing from this transaction was applied"
    for topic in topics:
        if topic not in present:
            if any(t == topic for t, _ in known):
                raise SourceError(
                    f"{where}: topic {topic!r} is gone (deleted?); the pipeline had read it up to "
                    f"{_offsets_text({p: o for p, o in known.items() if p[0] == topic})}. Its unread records, if any, "
                    f"are lost: restore the topic, or start a new pipeline (new pipeline_id and tables); {hint}."
                )
            raise SourceError(f"{where}: topic {topic!r} does not exist. Check source.topic(s) and bootstrap_servers; {hint}.")
    for partition, offset in known.items():
        if partition[0] in topics and partition not in watermarks:
            raise SourceError(
                f"{where}: partition {partition[0]}/{partition[1]} is gone (the pipeline had read it up to offset "
                f"{offset}): the topic was deleted and recreated with fewer partitions. Restore it, or start a new "
                f"pipeline; {hint}."
            )
    positions: dict[Partition, int] = {}
    lost: dict[Partition, tuple[int, int]] = {}
    for partition, (low, high) in sorted(watermarks.items()):
        if partition in known:
            position = known[partition]
        elif checkpoint is not None:
            # A partition added since the checkpoint: everything in it is new to the pipeline.
            position = 0
        else:
            position = (start or {}).get(partition, low)
        if position > high:
            raise SourceError(
                f"{where}: partition {partition[0]}/{partition[1]} ends at offset {high} but the pipeline has read "
                f"up to {position}: its offsets went backwards (the topic was deleted and recreated?). Records the "
                f"new topic holds would be skipped or read twice: start a new pipeline for it; {hint}."
            )
        if position < low:
            if on_data_loss != "skip":
                raise SourceError(
                    f"{where}: partition {partition[0]}/{partition[1]}: offsets {position} to {low - 1} "
                    f"({low - position} records) are gone from the broker (retention or deleted records) before the "
                    f"pipeline read them. They are lost to this table: restore them to the topic if you can, or set "
                    f"source.on_data_loss: skip to go on from offset {low} (the loss is logged); {hint}."
                )
            lost[partition] = (position, low)
            position = low
        positions[partition] = position
    backlog = {p: watermarks[p][1] - positions[p] for p in positions if watermarks[p][1] > positions[p]}
    taken = share(backlog, limit)
    ranges = {p: (positions[p], positions[p] + n) for p, n in taken.items() if n > 0}
    after = {p: ranges[p][1] if p in ranges else positions[p] for p in positions}
    return Plan(ranges=ranges, positions=after, lost=lost, lag=sum(backlog.values()) - sum(taken.values()))


def compaction_risks(
    known: dict[Partition, int], watermarks: dict[Partition, tuple[int, int]], compacted: dict[str, int],
    recent: dict[Partition, int],
) -> dict[Partition, int]:
    """Partitions of compacted topics whose first unread record is older than the topic's
    ``delete.retention.ms``, with that record's offset (the checkpoint's position).

    ``known``: the checkpoint's positions (a new pipeline, or a partition it has not read, holds no
    key a lost delete could leave behind: what a tombstone deleted was compacted away with it);
    ``compacted``: the compacted topics' ``delete.retention.ms``; ``recent``: per partition, the
    first offset whose timestamp is within that window (-1: none is)."""
    out: dict[Partition, int] = {}
    for partition, position in sorted(known.items()):
        if partition[0] not in compacted or partition not in watermarks or position >= watermarks[partition][1]:
            continue
        first_recent = recent.get(partition, -1)
        if first_recent < 0 or first_recent > position:
            out[partition] = position
    return out


@dataclass(frozen=True)
class CompactionLag:
    """How old a compacted partition's first unread record is, beside the topic's
    ``delete.retention.ms``: past the window, deletes the pipeline has not read may be gone."""

    topic: str
    partition: int
    offset: int
    """The first unread record (the position the pipeline reads next)."""
    oldest_unread_ms: int
    """Its age when looked at."""
    delete_retention_ms: int

    @property
    def margin_ms(self) -> int:
        """Time left before the window passes (negative: already past)."""
        return self.delete_retention_ms - self.oldest_unread_ms

    def describe(self) -> str:
        state = "PAST" if self.margin_ms < 0 else f"{100 * self.oldest_unread_ms // max(self.delete_retention_ms, 1)}% of"
        return (
            f"compacted {self.topic}/{self.partition}: oldest unread record (offset {self.offset}) is "
            f"{_age(self.oldest_unread_ms)} old, {state} delete.retention.ms {_duration(self.delete_retention_ms)}"
        )


def compaction_lags(
    positions: dict[Partition, int], watermarks: dict[Partition, tuple[int, int]], compacted: dict[str, int],
    timestamps: dict[Partition, int], now_ms: int,
) -> list[CompactionLag]:
    """Per partition of a compacted topic with records still to read, how old the first of them is
    beside the window, the nearest to its window first (a caught-up partition has no lag)."""
    out = []
    for partition, position in sorted(positions.items()):
        window = compacted.get(partition[0])
        if window is None or partition not in watermarks or position >= watermarks[partition][1] or partition not in timestamps:
            continue
        out.append(CompactionLag(partition[0], partition[1], position, max(now_ms - timestamps[partition], 0), window))
    return sorted(out, key=lambda lag: (lag.margin_ms, lag.topic, lag.partition))


def _age(ms: int) -> str:
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:.1f} h"
    if ms >= 60_000:
        return f"{ms // 60_000} min"
    return f"{ms / 1000:.0f} s" if ms >= 1000 else f"{ms} ms"


def _duration(ms: int) -> str:
    if ms % 3_600_000 == 0:
        return f"{ms} ms ({ms // 3_600_000} h)"
    return f"{ms} ms ({ms / 1000:g} s)"


def byte_budgets(plan: Plan, max_bytes: int) -> dict[Partition, int]:
    """Each partition's share of ``max_bytes``, in proportion to the records the plan takes from it
    (as ``max_records`` is shared), so partitions move together."""
    total = plan.records
    return {p: max_bytes * (b - a) // total for p, (a, b) in plan.ranges.items()} if total else {}


def cut_by_bytes(plan: Plan, fits: dict[Partition, int]) -> Plan:
    """``plan`` cut to ``fits``: per partition, how many of its first records fit its byte budget.
    At least one record: when none fits anywhere (one record larger than its share), the first
    record of the first partition is taken, so the pipeline always progresses."""
    taken = {p: min(max(fits.get(p, 0), 0), b - a) for p, (a, b) in plan.ranges.items()}
    if plan.ranges and not any(taken.values()):
        taken[min(plan.ranges)] = 1
    ranges = {p: (a, a + taken[p]) for p, (a, _) in plan.ranges.items() if taken[p] > 0}
    positions = dict(plan.positions)
    for p, (a, _) in plan.ranges.items():
        positions[p] = a + taken[p]
    left = plan.records - sum(taken.values())
    return Plan(ranges=ranges, positions=positions, lost=plan.lost, lag=plan.lag + left, compaction=plan.compaction)


def _offsets_text(offsets: dict[Partition, int]) -> str:
    return ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(offsets.items())) or "nothing"


# --- the brokers' offsets (a Python admin client: metadata only) ----------------------------------

ISOLATION = "kafka.isolation.level"
"""Spark's Kafka reader option (the consumer's ``isolation.level``)."""


def isolation_level(options: dict[str, str]) -> str:
    """``read_committed`` unless ``options`` set ``kafka.isolation.level: read_uncommitted``."""
    given = next((v for k, v in options.items() if k.lower() == ISOLATION), "read_committed")
    return given.strip().lower()



class Offsets:
    """Partition lists and watermarks from the brokers, with confluent-kafka's AdminClient."""

    def __init__(self, bootstrap: str, client_options: dict[str, str], where: str, read_committed: bool = False) -> None:
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError:
            raise ConfigError(
                "the kafka source looks offsets up with confluent-kafka: pip install 'delta-materializer[kafka]' "
                "(or confluent-kafka)"
            ) from None
        self.where = where
        # With read_committed (Spark's kafka.isolation.level) the range must end at the last stable
        # offset, not the high watermark: records past it are not readable yet.
        self.read_committed = read_committed
        self.admin = AdminClient({**client_options, "bootstrap.servers": bootstrap})
        self._client = {**client_options, "bootstrap.servers": bootstrap}

    def timestamps_at(self, offsets: dict[Partition, int], timeout: float = 15) -> dict[Partition, int]:
        """The timestamp (ms) of the first record at or after each offset (what a reader starting
        there reads first; absent: none came within ``timeout``). One consumer, one record per
        partition: never the records themselves beyond their timestamps."""
        from confluent_kafka import Consumer, TopicPartition

        if not offsets:
            return {}
        consumer = Consumer({
            **self._client, "group.id": "materializer-lag-probe", "enable.auto.commit": False,
            "isolation.level": "read_committed" if self.read_committed else "read_uncommitted",
        })
        found: dict[Partition, int] = {}
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())])
            deadline = time.monotonic() + timeout
            while len(found) < len(offsets) and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None or message.error() is not None:
                    continue
                partition = (message.topic(), message.partition())
                if partition in offsets and partition not in found:
                    found[partition] = int(message.timestamp()[1])
                    consumer.pause([TopicPartition(*partition)])
        finally:
            consumer.close()
        return found

    def watermarks(self, topics: list[str], timeout: float = 30) -> dict[Partition, tuple[int, int]]:
        from confluent_kafka import KafkaException

        try:
            metadata = self.admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise SourceError(f"{self.where}: the brokers did not answer ({exc}); check bootstrap_servers and client_options") from None
        partitions = [
            (t, p) for t in topics if t in metadata.topics and metadata.topics[t].error is None for p in metadata.topics[t].partitions
        ]
        low = self._list(partitions, "earliest", timeout)
        high = self._list(partitions, "latest", timeout)
        return {p: (low[p], high[p]) for p in partitions}

    def compacted(self, topics: list[str], timeout: float = 30) -> dict[str, int]:
        """The compacted topics among ``topics`` (``cleanup.policy`` holds ``compact``), each with
        its ``delete.retention.ms``: how long the log cleaner keeps a delete (tombstone)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource, ResourceType

        out: dict[str, int] = {}
        try:
            futures = self.admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics], request_timeout=timeout)
            for resource, future in futures.items():
                configs = future.result()
                policy = configs["cleanup.policy"].value or ""
                if "compact" in policy.split(","):
                    out[resource.name] = int(configs["delete.retention.ms"].value)
        except KafkaException as exc:
            raise SourceError(
                f"{self.where}: describing the topics' configuration failed ({exc}): the source reads cleanup.policy and "
                "delete.retention.ms to tell whether compaction may have removed deletes it has not read. Allow the "
                "client DescribeConfigs on the topics (client_options); nothing from this transaction was applied."
            ) from None
        return out

    def at_timestamp(self, partitions: list[Partition], millis: int, timeout: float = 30) -> dict[Partition, int]:
        """The first offset at or after ``millis`` per partition (-1: none yet, so the latest)."""
        return self._list(partitions, millis, timeout)

    def _list(self, partitions: list[Partition], spec: Any, timeout: float) -> dict[Partition, int]:
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}
        offset_spec = (
            OffsetSpec.earliest() if spec == "earliest" else OffsetSpec.latest() if spec == "latest" else OffsetSpec.for_timestamp(spec)
        )
        request = {TopicPartition(t, p): offset_spec for t, p in partitions}
        try:
            isolation = IsolationLevel.READ_COMMITTED if self.read_committed else IsolationLevel.READ_UNCOMMITTED
            futures = self.admin.list_offsets(request, isolation_level=isolation, request_timeout=timeout)
            return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}
        except KafkaException as exc:
            raise SourceError(f"{self.where}: listing offsets failed ({exc}); check the brokers and client_options") from None


# --- the source ------------------------------------------------------------------------------------


@dataclass
class _Where:
    """What the documents reader names in its messages (its ``store.uri``)."""

    uri: str


class KafkaSource(Source):
    _declared: "StructType | None" = None

    def __init__(self, binding: Any, spool: Store) -> None:
        super().__init__(binding, spool)
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

    def _starting(self, watermarks: dict[Partition, tuple[int, int]]) -> dict[Partition, int]:
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
        start = self._starting(watermarks) if checkpoint is None else None
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
            window = _duration(compacted[topic])
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

    def declared_schema(self, spark: "SparkSession") -> "StructType | None":
        ddl = self.binding.source.schema_ddl
        if self._declared is None and ddl is not None:
            self._declared = parse_schema(spark, ddl, self.binding)
        return self._declared

    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str,
        *, until: dict[str, Any] | None = None,
    ) -> SourceBatch | None:
        """The next offset range after ``checkpoint``, at most ``source.max_records`` (default
        ``max_documents``) records; with ``until`` (recover), exactly the range the log recorded.
        ``spool_path`` is not used: Spark reads the brokers."""
        if until is not None:
            # A binding with no input in the epoch kept its checkpoint: there is nothing to re-read
            # (its checkpoint's range is an earlier epoch's).
            return None if until == checkpoint else self.replay(spark, checkpoint, until)
        config = self.binding.source
        plan = self.plan(checkpoint, config.max_records or max_documents)
        if plan.empty:
            return None
        if config.kafka_max_bytes is not None:
            plan = self.bounded(spark, plan, config.kafka_max_bytes)
        return self._batch(spark, checkpoint, plan)

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

    def replay(self, spark: "SparkSession", before: dict[str, Any] | None, after: dict[str, Any]) -> SourceBatch:
        """Exactly a committed epoch's records again (``after``: its checkpoint, whose ``range`` the
        log recorded): for ``recover`` re-staging an epoch whose staged file was lost. Records of the
        range the broker no longer has stop it: the epoch cannot be rebuilt exactly."""
        ranges = {
            (topic, int(partition)): (int(bounds[0]), int(bounds[1]))
            for topic, parts in (after.get("range") or {}).items()
            for partition, bounds in parts.items()
        }
        watermarks = self.offsets().watermarks(self.topics)
        for (topic, partition), (start, end) in sorted(ranges.items()):
            low, high = watermarks.get((topic, partition), (None, None))
            if low is None or low > start or high < end:
                raise SourceError(
                    f"{self.where}: the epoch read {topic}/{partition} offsets {start} to {end - 1}, and the broker "
                    f"now holds {'nothing of that partition' if low is None else f'offsets {low} to {high - 1}'}: the "
                    "epoch cannot be read again exactly. Restore its staged file from a backup."
                )
        plan = Plan(ranges=ranges, positions=positions_of(after))
        batch = self._batch(spark, before, plan)
        batch.checkpoint = after  # the very checkpoint the log holds, "lost" included
        return batch

    def _batch(self, spark: "SparkSession", checkpoint: dict[str, Any] | None, plan: Plan) -> SourceBatch:
        config = self.binding.source
        reader = _KafkaReader(
            spark, self.where, self.binding.key, self.declared_schema(spark), checkpoint, config.payload, config.key_from,
            placeholder=config.unavailable_value, keep_stored=self.binding.placeholders_kept,
            dead_letter=self.binding.on_invalid == "dead_letter",
        )
        change_controlled(reader, self.binding)  # sequence_by (``_meta.source.lsn``, say) and the table's own names
        try:
            parsed = reader.parsed(self.records(spark, plan))
            count, schema = reader.check(parsed)
            rejected = None
            if reader.bad:
                # on_invalid: dead_letter (docs: 'Dead letters'): the valid records go on.
                checked = reader.checked(parsed)
                parsed, rejected = split(checked)[0], reader.rejected_records(checked)
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - a Spark failure reading the range, explained if it is one
            explained = reader.explain(exc)
            if explained is not None:
                raise explained from exc
            raise
        description = plan.description()
        if plan.lost:
            description += f"; SKIPPED lost records: {_offsets_text({p: a for p, (a, _) in plan.lost.items()})} (on_data_loss: skip)"
        if plan.compaction:
            description += (
                f"; read PAST delete.retention.ms of compacted {_offsets_text(plan.compaction)}: deletes may be lost "
                "(on_data_loss: skip)"
            )
        lag, words = self.lag(plan)
        return SourceBatch(
            documents=reader.rows(parsed, schema),
            rejected=rejected,
            rejected_count=reader.bad,
            checkpoint=plan.checkpoint(),
            count=count,
            description=description + words,
            explain=reader.explain,
            lag=lag,
        )

    def records(self, spark: "SparkSession", plan: Plan, raw_columns: bool = False) -> "DataFrame":
        """The epoch's records, exactly ``plan.ranges``, as Spark's Kafka connector reads them
        (``raw_columns``: its own columns, binary key and value)."""
        from pyspark.sql import functions as F

        config = self.binding.source
        assign: dict[str, list[int]] = {}
        for topic, partition in sorted(plan.ranges):
            assign.setdefault(topic, []).append(partition)
        starting = _nested({p: a for p, (a, _) in plan.ranges.items()})
        ending = _nested({p: b for p, (_, b) in plan.ranges.items()})
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
        if config.routed is not None:
            # One topic, many tables: this binding's records only, on the executors; within a
            # partition they keep their offsets, so the table's order is the topic's.
            condition = F.lit(True)
            for path, value in sorted(config.routed.items()):
                condition = condition & (route_field(F.col("value"), path, config.payload) == F.lit(value))
            records = records.where(condition)
        return records


def route_field(value: "Column", path: str, payload: str) -> "Column":
    """The text of field ``path`` (dotted) of a record's JSON ``value``: Debezium's ``payload``
    envelope unwrapped when there is one; null when the value is null, not JSON or has no such field."""
    from pyspark.sql import functions as F

    plain = F.get_json_object(value, f"$.{path}")
    if payload != "debezium":
        return plain
    return F.coalesce(F.get_json_object(value, f"$.payload.{path}"), plain)


# --- reading and checking: the documents source's reader, over records --------------------------


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



class _KafkaReader(DocumentReader):
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
        # Unlike lines of a file, no record is skipped: a blank value is refused as not JSON.
        return records.withColumn("__v", parse_one(F.col("value")))

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
            F.when(event.isNull(), F.lit("not a valid JSON Debezium change event"))
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

        return F.coalesce(F.col("__kafka"), super().problem(lean))

    # --- dead letters ---

    def _carried(self) -> list["Column"]:
        from pyspark.sql import functions as F

        return [F.col("__record")] if self.kafka_dead_letters else []

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
            rows = rows.withColumn(name, F.unbase64(F.col(name)))
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
