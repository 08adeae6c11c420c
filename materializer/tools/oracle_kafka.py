"""The drill's oracle for ``kafka`` sources: the topic's records read with confluent-kafka's own
consumer (not Spark's connector, which the pipeline reads with), then the payload's documented
semantics in plain Python:

* ``documents``: each value a JSON document (``key_from: message``: the key fields from the
  record's key, a null value deletes that key), folded per key in offset order as for files;
* ``debezium``: ``c``/``r``/``u`` upsert ``after``, ``d`` deletes the key of ``before``, null
  values (tombstones) carry nothing;
* ``cdcv2``: the statements, as the cdcv2 oracle reads a folder's lines.

Kafka orders records within a partition only: a key found in two partitions makes the expected
row depend on epoch boundaries, so such a topic is "not verified" (with the reason), never guessed.
The topic must not change while the drill runs (the oracle reads it to its end when it verifies),
and the pipeline must start at ``earliest``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from materializer.config import BindingConfig
from materializer.errors import SourceError
from materializer.tools.oracle_rows import SET_ASIDE, Expected, Key, Row, canonical, cdcv2_state, fold, is_delete, key_of, register

Record = tuple[str, int, int, "bytes | None", "bytes | None"]
"""(topic, partition, offset, key, value)."""


def read_topic(bootstrap: str, topics: list[str], client_options: dict[str, str] | None = None, timeout: float = 120) -> list[Record]:
    """Every record of ``topics`` from each partition's earliest to its latest offset, in
    (topic, partition, offset) order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **(client_options or {}),
            "bootstrap.servers": bootstrap,
            "group.id": "materializer-oracle",  # never committed: offsets are assigned explicitly
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=30)
        wanted: dict[tuple[str, int], int] = {}
        assignment = []
        for topic in topics:
            if topic not in metadata.topics or metadata.topics[topic].error is not None:
                raise SourceError(f"oracle: topic {topic!r} does not exist on {bootstrap}")
            for partition in sorted(metadata.topics[topic].partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                if high > low:
                    wanted[(topic, partition)] = high
                    assignment.append(TopicPartition(topic, partition, low))
        records: list[Record] = []
        if not assignment:
            return records
        consumer.assign(assignment)
        left = set(wanted)
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise SourceError(f"oracle: reading {topics} did not reach the end of {sorted(left)} in {timeout:.0f} s")
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                where = (message.topic(), message.partition())
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        left.discard(where)
                        continue
                    raise SourceError(f"oracle: reading {where}: {message.error()}")
                if message.offset() < wanted[where]:
                    records.append((where[0], where[1], message.offset(), message.key(), message.value()))
                if message.offset() + 1 >= wanted[where]:
                    left.discard(where)
        records.sort(key=lambda r: r[:3])
        return records
    finally:
        consumer.close()


def _text(raw: "bytes | None") -> str | None:
    return None if raw is None else raw.decode("utf-8")


def _null_envelope(text: str) -> bool:
    try:
        return json.loads(text) == {"schema": None, "payload": None}
    except ValueError:
        return False


def _key_fields(binding: BindingConfig, raw: "bytes | None") -> Row:
    text = _text(raw)
    try:
        key: Any = json.loads(text) if text is not None else None
    except ValueError:
        key = text  # plain text: one key field's value
    if isinstance(key, dict) and "schema" in key and "payload" in key:
        key = key["payload"]
    if isinstance(key, dict):
        return {k: key.get(k) for k in binding.key}
    return {binding.key[0]: key}


def documents_of(binding: BindingConfig, records: list[Record]) -> list[tuple[tuple[str, int], Row]]:
    """The payload's documents with their partition; a delete is marked ``_meta.op: "d"``."""
    source = binding.source
    out: list[tuple[tuple[str, int], Row]] = []
    for topic, partition, _offset, key, value in records:
        where = (topic, partition)
        text = _text(value)
        if text is not None and _null_envelope(text):
            text = None  # Kafka Connect's JSON converter's tombstone
        if source.payload == "debezium":
            if text is None:
                continue  # a tombstone: no change
            event = json.loads(text)
            if isinstance(event, dict) and "schema" in event and "payload" in event:
                event = event["payload"]
            if event["op"] == "d":
                out.append((where, {"_meta": {"op": "d"}, **event["before"]}))
            else:
                out.append((where, dict(event["after"])))
        elif source.key_from == "message":
            fields = _key_fields(binding, key)
            out.append((where, {"_meta": {"op": "d"}, **fields} if text is None else {**json.loads(text), **fields}))
        else:
            out.append((where, json.loads(text) if text is not None else {}))
    return out


@register("kafka", "standard")
def kafka_standard(binding: BindingConfig, max_documents: int) -> Expected:
    source = binding.source
    if source.starting != "earliest":
        return Expected(binding=binding.name, verified=False, reason="the kafka oracle reads from the earliest offsets only")
    records = read_topic(str(source.bootstrap_servers), source.topic_names, dict(source.client_options))
    set_aside = SET_ASIDE.get().get(f"kafka:{binding.name}")
    if set_aside is not None:
        # The records the binding set aside as dead letters are not folded; any other the oracle
        # cannot read was neither applied nor set aside: lost.
        records = [r for r in records if r[:3] not in set_aside]
        for topic, partition, offset, _key, value in records:
            if value is not None and value.strip():
                try:
                    json.loads(value)
                except ValueError as exc:
                    raise SourceError(
                        f"topic {topic!r} partition {partition} offset {offset}: not valid JSON ({exc}) and is not in the "
                        "binding's dead-letter table"
                    ) from None
    if source.payload == "cdcv2":
        expected = cdcv2_state(binding, (json.loads(v) for *_, v in records if v is not None and v.strip()))
        expected.epochs = None
        return expected
    if source.payload == "debezium":
        from materializer.sources.kafka.debezium_types import DECODED

        signs = [source.unavailable_value, *DECODED]
        if any(v is not None and any(sign.encode() in v for sign in signs) for *_, v in records):
            return Expected(
                binding=binding.name, verified=False,
                reason="the kafka oracle does not model Debezium's placeholders or decoded semantic types",
            )
    state: dict[Key, Row] = {}
    home: dict[Key, tuple[str, int]] = {}
    count = 0
    for where, doc in documents_of(binding, records):
        count += 1
        k = key_of(doc, binding.key)
        if home.setdefault(k, where) != where:
            return Expected(
                binding=binding.name, verified=False,
                reason=f"key {list(k)} is in partitions {home[k]} and {where}: Kafka orders nothing across partitions",
            )
        if is_delete(doc):
            state.pop(k, None)
        else:
            state[k] = fold(binding, state.get(k), doc)
    return Expected(
        binding=binding.name,
        verified=True,
        unique_keys=True,
        rows={k: Counter([canonical(row)]) for k, row in state.items()},
        epochs=None,
        documents=count,
    )
