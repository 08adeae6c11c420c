"""The brokers' offsets, from an admin client: metadata only, never records.

Partition lists, watermarks, offsets by time, the topics' compaction settings. Read committed
(Spark's ``kafka.isolation.level``, the default), a range ends at the last stable offset, not the
high watermark: records past it are not readable yet.
"""

from __future__ import annotations

import time
from typing import Any

from materializer.errors import ConfigError, SourceError
from materializer.sources.kafka.plan import Partition

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
