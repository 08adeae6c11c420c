"""Kafka's ``cdcv2`` payload: CDC v2 statements (Materialize's protocol) read from a topic.

Each record's value is one statement, exactly a line of the ``cdcv2`` format's files, and the
cdcv2 source's reader (:class:`~materializer.sources.cdcv2.reader.CdcV2Reader`) does everything else: the
statements' checks, duplicates absorbed, the progress bookkeeping, complete times taken in order,
the frontier as the runtime checkpoint. Only where the statements come from changes (its ``_lines``
seam): Spark's Kafka connector reads a range of offsets per partition instead of a folder, and a
statement is named by topic, partition and offset instead of file and line.

Statements of one time may be anywhere in the topic (any partition, any order), so a record stays
needed until the frontier has passed every time it speaks of. The checkpoint is therefore

``{"frontier": t, "offsets": {topic: {partition: o}}, "read": {...}}``

``frontier`` is the CDC v2 frontier (every time below it is in the table); ``offsets`` is per
partition the first record that may still matter at that frontier (an update at a time at or
above it, a progress statement whose upper bound is above it), or where the reading ended if none
does; ``read`` is where the epoch's reading ended. Each epoch reads every partition from
``offsets`` to the brokers' latest offsets (as the file reader reads every file: ``max_records``
does not cut a time's statements apart), and the next reading starts at ``offsets`` again, so a
restart after a crash reads the same statements and the frontier applies nothing twice.
Records before ``offsets`` are never read again: retention may remove them. Records at or after
it that the broker no longer has stop the run (the kafka source's data-loss checks).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from materializer.config import BindingConfig
from materializer.errors import SourceError
from materializer.columns import SEQ
from materializer.sources import SourceBatch
from materializer.sources.cdcv2.progress import START, Origin
from materializer.sources.cdcv2.reader import CdcV2Reader, Scan
from materializer.sources.cdcv2.statements import statements
from materializer.sources.json_text import parse_one
from materializer.sources.kafka.plan import Partition, Plan, nested, positions_of
from materializer.sources.kafka.transport import KafkaTransport, null_envelope
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_FOREVER = sys.maxsize
"""The horizon of a progress statement with an empty upper frontier: needed until the stream ends."""


class KafkaCdcV2Source(CdcV2Reader):
    """CDC v2 statements from a topic; see the module docstring."""

    _per_file = False

    def __init__(self, binding: BindingConfig, spool: Store) -> None:
        super().__init__(binding, spool)
        self.kafka = KafkaTransport(binding)
        self._plan: Plan | None = None
        """The reading the current epoch is planned on (set by next_batch before the scan)."""
        self._records: "DataFrame | None" = None
        """The current scan's records, persisted: the statements and the next ``offsets`` come from it."""
        self._scan_starts: dict[Partition, int] = {}

    @property
    def label(self) -> str:
        return self.kafka.where

    # --- the reader's seams (CdcV2Reader) ---

    def _lines(self, spark: "SparkSession", listing: tuple[tuple[str, int], ...]) -> "DataFrame":
        assert self._records is not None
        return self._records.select("value", "file")

    def _name(self, spark_uri: str, names: Any) -> str:
        return spark_uri  # already "kafka://… topic T partition P offset O"

    def _locate(self, origin: Origin) -> Origin:
        return origin  # the record's offset is in its name; there is no line to find

    def _scan_for(self, spark: "SparkSession", frontier: int) -> Scan | None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        plan = self._plan
        assert plan is not None
        if plan.empty:
            return None  # nothing still needed, nothing new
        # The reading is identified by where it ends; one that started at or before this epoch's
        # offsets holds every statement still needed (earlier ones are below the frontier).
        listing = tuple((f"{t}/{p}", end) for (t, p), end in sorted(plan.positions.items()))
        scan = self._scan
        if (
            scan is not None and scan.listing == listing and scan.frontier <= frontier
            and all(self._scan_starts.get(p, _FOREVER) <= a for p, (a, _) in plan.ranges.items())
        ):
            return scan
        self._drop_scan()
        records = self.kafka.records(spark, plan)
        where = self.kafka.where
        self._records = (
            records.select(
                F.col("value"),
                F.col(f"{SEQ}.topic").alias("topic"),
                F.col(f"{SEQ}.partition").alias("partition"),
                F.col(f"{SEQ}.offset").alias("offset"),
                F.col("key"),
                F.col("timestamp"),
                F.concat(
                    F.lit(f"{where} topic "), F.col(f"{SEQ}.topic"), F.lit(" partition "), F.col(f"{SEQ}.partition").cast("string"),
                    F.lit(" offset "), F.col(f"{SEQ}.offset").cast("string"),
                ).alias("file"),
            )
            # A null or blank value holds no statement (as a blank line of a file does): a
            # compaction tombstone (also in Kafka Connect's JSON form), which CDC v2 does not write.
            .where((F.trim("value") != "") & ~null_envelope(F.col("value")))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self._scan_starts = {p: a for p, (a, _) in plan.ranges.items()}
        self._scan = self._read(spark, listing, frontier)
        return self._scan

    def _drop_scan(self) -> None:
        if self._scan is not None:
            self._scan.distinct.unpersist()
        if self._records is not None:
            self._records.unpersist()
        self._scan, self._records = None, None

    def _dead_letters(
        self, spark: "SparkSession", scan: Scan, checkpoint: dict[str, Any] | None, until: dict[str, Any] | None
    ) -> "tuple[DataFrame | None, int, dict[str, Any]]":
        """``on_invalid: dead_letter``: the malformed records this epoch sets aside, as the kafka
        source's dead letters are (``source``, ``topic``, ``partition``, ``offset``, ``timestamp``,
        ``key``, ``reason``, ``value``). Readings overlap (each starts at the first record still
        needed), so a record is set aside by the epoch whose reading first reached it: at or after
        where the previous epoch's reading ended (the checkpoint's ``read``); the checkpoint needs
        nothing more."""
        from pyspark.sql import functions as F

        if not scan.bad or self._records is None:
            return None, 0, {}
        seen = F.lit(False)
        for (topic, partition), end in sorted(positions_of({"offsets": (checkpoint or {}).get("read") or {}}).items()):
            seen = seen | ((F.col("topic") == topic) & (F.col("partition") == partition) & (F.col("offset") < end))
        rejected = self._rejected(statements(self._records.where(~seen), self.binding.key), scan).select(
            F.lit(self.kafka.where).alias("source"), "topic", "partition", "offset", "timestamp", "key", "reason", "value"
        )
        count = rejected.count()
        return (rejected if count else None), count, {}

    # --- epochs ---

    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str,
        *, until: dict[str, Any] | None = None,
    ) -> SourceBatch | None:
        if (checkpoint or {}).get("frontier", START) is None:
            return None  # the stream has ended
        if until is not None and until == checkpoint:
            return None
        if until is not None:
            # recover: exactly the reading the committed epoch made, [offsets, read), whatever
            # arrived since, so the same records give the same frontier and the same offsets.
            watermarks = self.kafka.offsets().watermarks(self.kafka.topics)
            start = positions_of(checkpoint) if checkpoint is not None else self.kafka.start_positions(watermarks)
            read = positions_of({"offsets": until.get("read") or {}})
            for partition, end in sorted(read.items()):
                low, high = watermarks.get(partition, (None, None))
                begin = start.get(partition, 0)
                if begin < end and (low is None or low > begin or high < end):
                    raise SourceError(
                        f"{self.label}: the epoch read {partition[0]}/{partition[1]} offsets {begin} to {end - 1}, and "
                        f"the broker now holds {'nothing of that partition' if low is None else f'offsets {low} to {high - 1}'}: "
                        "the epoch cannot be read again exactly. Restore its staged file from a backup."
                    )
            self._plan = Plan(
                ranges={p: (start.get(p, 0), end) for p, end in read.items() if start.get(p, 0) < end}, positions=read
            )
        else:
            # Every partition from the checkpoint's offsets to the latest: a time's statements
            # are never cut apart (max_records does not apply; transaction.max_documents bounds
            # the epoch's updates, whole times, as for files).
            self._plan = self.kafka.plan({"offsets": (checkpoint or {}).get("offsets") or {}} if checkpoint else None, _FOREVER)
        batch = super().next_batch(spark, checkpoint, max_documents, spool_path, until=until)
        if batch is None:
            return None
        frontier = batch.checkpoint["frontier"]
        batch.checkpoint = {
            "frontier": frontier,
            "offsets": nested(self._needed_from(frontier)),
            "read": nested(self._plan.positions),
        }
        if until is not None and batch.checkpoint != until:
            raise SourceError(
                f"{self.label}: re-reading the epoch ends at {batch.checkpoint}, but it ended at {until}: the "
                "epoch cannot be re-staged exactly. Restore its staged file from a backup."
            )
        # The oldest record still needed is the one a compaction window threatens.
        lag, words = self.kafka.lag(self._plan, positions_of({"offsets": batch.checkpoint["offsets"]}))
        batch.description += f" ({self._plan.records} records read){words}"
        batch.lag = lag
        return batch

    def _needed_from(self, frontier: int | None) -> dict[Partition, int]:
        """Per partition, the first record of the reading still needed at ``frontier``, or where the
        reading ended: one aggregate, one row per partition to the driver."""
        from pyspark.sql import functions as F

        plan = self._plan
        assert plan is not None
        out = dict(plan.positions)
        if frontier is None or self._records is None:
            return out  # the stream ended: nothing is needed any more
        v = parse_one(F.col("value"))
        # The last time a statement speaks of: its updates' latest time, or below its progress's
        # upper bound (an empty upper frontier: every time on).
        times = F.transform(F.try_variant_get(v, "$.updates", "array<variant>"), lambda u: F.try_variant_get(u, "$[1]", "bigint"))
        upper = F.try_variant_get(v, "$.progress.upper", "array<bigint>")
        horizon = F.coalesce(
            F.array_max(times),
            F.when(upper.isNotNull(), F.when(F.array_size(upper) == 0, F.lit(_FOREVER)).otherwise(upper[0] - 1)),
        )
        needed = (
            self._records.where(horizon >= F.lit(frontier))
            .groupBy("topic", "partition")
            .agg(F.min("offset").alias("offset"))
            .collect()
        )
        for row in needed:
            out[(row["topic"], int(row["partition"]))] = int(row["offset"])
        return out
