"""The ``kafka`` source: a topic's partitions, read by Spark's own Kafka connector in batch mode.

Each epoch is a range of offsets per partition, planned from the brokers' offsets and recorded in
the runtime checkpoint before any apply (:mod:`~materializer.sources.kafka.transport`: the
positions, lost records, compaction, ``max_records`` and ``max_bytes``); Spark reads exactly that
range on the executors, and the payload's reader (:mod:`~materializer.sources.kafka.reader`:
``documents`` or ``debezium``) checks the records as documents. A committed epoch is read again
exactly by ``recover`` (:meth:`KafkaSource.replay`).

Order: ``_seq`` is ``struct(topic, partition, offset)``: within a partition, later offsets win,
which is Kafka's own order. Kafka orders nothing across partitions: producers that key records by
the document key (Kafka's default partitioner, Debezium) keep each key in one partition; a key
found in two partitions of one epoch takes the record of the higher (topic, partition).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

from materializer.dead_letters import split
from materializer.errors import SourceError
from materializer.sources import Source, SourceBatch
from materializer.sources.documents.reader import change_controlled, parse_schema
from materializer.sources.kafka.offsets import Offsets, isolation_level
from materializer.sources.kafka.plan import (
    CompactionLag, Plan, byte_budgets, compaction_lags, compaction_risks, cut_by_bytes, offsets_text, plan_epoch, positions_of,
    share,
)
from materializer.sources.kafka.reader import KafkaReader
from materializer.sources.kafka.transport import KafkaTransport
from materializer.storage import Store

T = TypeVar("T")

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


class KafkaSource(KafkaTransport, Source):
    """A topic's records as documents: its transport (:class:`KafkaTransport`: offsets, plan,
    records) and the payload's reader (:class:`KafkaReader`)."""

    _declared: "StructType | None" = None

    def __init__(self, binding: Any, spool: Store) -> None:
        Source.__init__(self, binding, spool)
        KafkaTransport.__init__(self, binding)

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
            self._release()
            return None
        if config.kafka_max_bytes is not None:
            plan = self.bounded(spark, plan, config.kafka_max_bytes)
        return self._batch(spark, checkpoint, plan, defer=self.defer_checks, spool_path=spool_path)

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

    def reader(self, spark: "SparkSession", checkpoint: dict[str, Any] | None) -> KafkaReader:
        """The reader of this binding's records: its key, schema, payload and dead-letter choice."""
        config = self.binding.source
        reader = KafkaReader(
            spark, self.where, self.binding.key, self.declared_schema(spark), checkpoint, config.payload, config.key_from,
            placeholder=config.unavailable_value, keep_stored=self.binding.placeholders_kept,
            dead_letter=self.binding.on_invalid == "dead_letter",
        )
        change_controlled(reader, self.binding)  # sequence_by (``_meta.source.lsn``, say) and the table's own names
        if config.unrouted is not None:
            reader.unrouted = (
                f"the record has no {' or '.join(config.unrouted)} (or its value is not a JSON object): it names no table "
                "of the template's route_by"
            )
        return reader

    def parsed(self, spark: "SparkSession", reader: KafkaReader, plan: Plan, *, hold: bool = False) -> "DataFrame":
        """The plan's records as documents (:meth:`KafkaReader.parsed`), before the checks.
        ``hold``: the records read from the brokers are kept (persisted) until the next batch, so
        the epoch's jobs (its checks, then its staging) read the brokers once."""
        records = self.records(spark, plan)
        return reader.parsed(self._hold(records) if hold else records)

    _held: "DataFrame | None" = None

    def _hold(self, records: "DataFrame") -> "DataFrame":
        from pyspark import StorageLevel

        self._release()
        self._held = records.persist(StorageLevel.MEMORY_AND_DISK)
        return self._held

    def _release(self) -> None:
        """Let go of the records an earlier batch kept (its staging job has run: the runtime reads
        the next batch only after it staged this one)."""
        if self._held is not None:
            self._held.unpersist()
            self._held = None

    def _batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, plan: Plan, *, defer: bool = False, spool_path: str | None = None
    ) -> SourceBatch:
        from materializer.sources.documents.route import SMALL_EPOCH_RECORDS, set_aside, validator

        reader = self.reader(spark, checkpoint)
        small = plan.records < SMALL_EPOCH_RECORDS
        parsed, aside = None, None
        if defer and reader.declared is not None and reader.payload == "documents" and not reader.sequence_by and reader.unrouted is None:
            # The types are known before reading: the checks ride along with the staging job, as
            # the documents source's do (one read of the range and one parse per epoch, not two),
            # checked by msgspec on the executors where the session allows it (document_check).
            # Not for debezium (its rows depend on what the epoch's checks find: placeholders,
            # semantic types) or sequence_by; for dead letters only when the validator finds every
            # record fast (as for files: none can be a dead letter then), the range kept for
            # whichever job comes next.
            chosen = validator(spark, small=small, declared=reader.declared)
            deferred = not reader.dead_letter
            if deferred:
                self._release()  # (a replay's records, say)
                parsed = self.parsed(spark, reader, plan)
            elif chosen == "arrow" and spool_path is not None:
                # The records the validator does not find fast are set aside in the spool: only
                # those can be dead letters (as for files, documents.py).
                parsed = self._explained(reader, lambda: self.parsed(spark, reader, plan, hold=True))
                reader.validator = chosen
                aside = self._explained(reader, lambda: set_aside(reader, self.spool, spool_path.rsplit(".", 1)[0] + "-not-fast"))
                deferred = aside.others is None
            if deferred:
                reader.validator = chosen
                assert parsed is not None
                documents, verify = reader.deferred(parsed)
                lag, words = self.lag(plan)
                return SourceBatch(
                    documents=documents, checkpoint=plan.checkpoint(), count=0, description=self._described(plan) + words,
                    explain=reader.explain, lag=lag, verify=verify, small=small,
                )
        # The checks' job, then the staging job (and the dead letters'): the range is read from
        # the brokers once, by the first of them, and kept for the others.
        held = parsed if parsed is not None else self._explained(reader, lambda: self.parsed(spark, reader, plan, hold=True))
        parsed, rejected = held, None
        if aside is not None and aside.others is not None:
            # Checked from the spool; the staging job judges the held records again and parses
            # the others only (document_route.marked_documents).
            from pyspark.sql import functions as F

            from materializer.sources.documents.route import marked_documents
            from materializer.sources.json_text import parse_one

            others = aside.others.withColumn("__v", parse_one(F.col("value")))
            count, schema = aside.documents, self._explained(reader, lambda: reader.check(others))[1]
            parsed = marked_documents(reader)
            if reader.bad:
                rejected = reader.rejected_records(reader.checked(others))
                parsed = split(reader.checked(parsed))[0]
        else:
            count, schema = self._explained(reader, lambda: reader.check(held))
        if reader.bad and rejected is None:
            # on_invalid: dead_letter (docs: 'Dead letters'): the valid records go on.
            checked = reader.checked(held)
            parsed, rejected = split(checked)[0], reader.rejected_records(checked)
        lag, words = self.lag(plan)
        return SourceBatch(
            # No document, or every one a dead letter (all of them, for source.unrouted): no row,
            # and no type for the key to stage one with; the position and dead letters are committed.
            documents=None if reader.bad == count else reader.rows(parsed, schema),
            rejected=rejected,
            rejected_count=reader.bad,
            checkpoint=plan.checkpoint(),
            count=count,
            description=self._described(plan) + words,
            explain=reader.explain,
            lag=lag,
            small=small,
        )

    @staticmethod
    def _explained(reader: KafkaReader, job: "Callable[[], T]") -> "T":
        """Run one of the epoch's jobs; a Spark failure reading the range is explained if it is one."""
        try:
            return job()
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001
            explained = reader.explain(exc)
            if explained is not None:
                raise explained from exc
            raise

    @staticmethod
    def _described(plan: Plan) -> str:
        description = plan.description()
        if plan.lost:
            description += f"; SKIPPED lost records: {offsets_text({p: a for p, (a, _) in plan.lost.items()})} (on_data_loss: skip)"
        if plan.compaction:
            description += (
                f"; read PAST delete.retention.ms of compacted {offsets_text(plan.compaction)}: deletes may be lost "
                "(on_data_loss: skip)"
            )
        return description


__all__ = [  # besides KafkaSource, what tools and tests import from here (the names live beside it)
    "CompactionLag", "KafkaReader", "KafkaSource", "Offsets", "Plan", "byte_budgets", "compaction_lags", "compaction_risks",
    "cut_by_bytes", "isolation_level", "plan_epoch", "positions_of", "share",
]
