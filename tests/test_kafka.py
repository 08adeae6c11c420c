"""The kafka source: epoch ranges in plain Python; a real KRaft broker for reading, crashes, loss.

The broker tests (marked ``kafka``) share one broker (tests/kafka_broker.py) and the session's
SparkSession, each on its own topic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config, parse_config
from materializer.delta import TableRef, history
from materializer.errors import ConfigError, SourceError
from materializer.progress import ListCollector
from materializer.tools.recover import recover
from materializer.recovery_log import RecoveryLog
from materializer.runtime import Runtime
from materializer.sources.kafka.source import plan_epoch, share
from materializer.storage import open_store
from tests.helpers import run_cli, table_rows, write_config
from tests.kafka_broker import Broker

# --- epoch ranges: no broker, no JVM ----------------------------------------------------------------


def test_a_backlog_larger_than_max_records_is_shared_in_proportion_and_every_partition_moves() -> None:
    assert share({("t", 0): 10, ("t", 1): 5}, 100) == {("t", 0): 10, ("t", 1): 5}
    taken = share({("t", 0): 900, ("t", 1): 90, ("t", 2): 10}, 100)
    assert sum(taken.values()) == 100 and taken[("t", 0)] == 90 and taken[("t", 1)] == 9 and taken[("t", 2)] == 1
    assert sum(share({("t", p): 1 for p in range(5)}, 3).values()) == 3


def test_the_range_starts_at_the_checkpoint_and_is_recorded_with_every_partitions_position() -> None:
    marks = {("t", 0): (0, 50), ("t", 1): (0, 20)}
    plan = plan_epoch(marks, ["t"], None, {("t", 0): 0, ("t", 1): 0}, 30, "fail", "k")
    assert plan.ranges == {("t", 0): (0, 21), ("t", 1): (0, 9)} and plan.lag == 40
    checkpoint = plan.checkpoint()
    assert checkpoint["offsets"] == {"t": {"0": 21, "1": 9}}
    assert checkpoint["range"] == {"t": {"0": [0, 21], "1": [0, 9]}}
    nxt = plan_epoch(marks, ["t"], checkpoint, None, 1000, "fail", "k")
    assert nxt.ranges == {("t", 0): (21, 50), ("t", 1): (9, 20)}
    assert plan_epoch(marks, ["t"], nxt.checkpoint(), None, 1000, "fail", "k").empty


def test_a_new_pipeline_starts_where_told_and_a_new_partition_from_offset_zero() -> None:
    marks = {("t", 0): (5, 50)}
    assert plan_epoch(marks, ["t"], None, {("t", 0): 50}, 10, "fail", "k").empty  # latest
    checkpoint = {"offsets": {"t": {"0": 50}}}
    grown = {("t", 0): (5, 50), ("t", 1): (0, 7)}
    assert plan_epoch(grown, ["t"], checkpoint, None, 100, "fail", "k").ranges == {("t", 1): (0, 7)}
    # A new partition whose first records retention already removed: that is loss too.
    with pytest.raises(SourceError, match="t/1: offsets 0 to 2 \\(3 records\\) are gone"):
        plan_epoch({("t", 0): (5, 50), ("t", 1): (3, 7)}, ["t"], checkpoint, None, 100, "fail", "k")


def test_records_removed_before_they_were_read_stop_the_run_unless_skipping_is_asked() -> None:
    checkpoint = {"offsets": {"t": {"0": 10, "1": 4}}}
    marks = {("t", 0): (15, 30), ("t", 1): (0, 4)}
    with pytest.raises(SourceError, match="partition t/0: offsets 10 to 14 \\(5 records\\) are gone from the broker.*on_data_loss: skip"):
        plan_epoch(marks, ["t"], checkpoint, None, 100, "fail", "k")
    plan = plan_epoch(marks, ["t"], checkpoint, None, 100, "skip", "k")
    assert plan.ranges == {("t", 0): (15, 30)} and plan.lost == {("t", 0): (10, 15)}
    assert plan.checkpoint()["lost"] == {"t": {"0": [10, 15]}}


def test_a_deleted_topic_a_lost_partition_and_offsets_that_went_backwards_are_reported() -> None:
    checkpoint = {"offsets": {"t": {"0": 10, "1": 4}}}
    with pytest.raises(SourceError, match="topic 't' is gone .*t/0@10, t/1@4"):
        plan_epoch({}, ["t"], checkpoint, None, 100, "skip", "k")
    with pytest.raises(SourceError, match="topic 'u' does not exist"):
        plan_epoch({}, ["u"], None, {}, 100, "fail", "k")
    with pytest.raises(SourceError, match="partition t/1 is gone"):
        plan_epoch({("t", 0): (0, 10)}, ["t"], checkpoint, None, 100, "fail", "k")
    with pytest.raises(SourceError, match="t/1 ends at offset 2 but the pipeline has read up to 4"):
        plan_epoch({("t", 0): (0, 10), ("t", 1): (0, 2)}, ["t"], checkpoint, None, 100, "fail", "k")


def _source(**source: Any) -> dict[str, Any]:
    return {
        "pipeline_id": "p", "recovery_log": "log", "staging": "staging",
        "bindings": [{"name": "b", "table": "t", "key": ["id"], "source": source}],
    }


def test_kafka_settings_are_checked_before_anything_starts() -> None:
    good = parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="orders", options={"kafka.security.protocol": "SSL"}), "x")
    assert good.bindings[0].source.topic_names == ["orders"]
    parse_config(_source(format="kafka", bootstrap_servers="h:9092", topics=["a", "b"], starting={"a": {"0": 5}}), "x")
    parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", starting={"timestamp": 1700000000000}), "x")
    refused = [
        (_source(format="documents", path="src", topic="orders"), "topic: only for the kafka format"),
        (_source(format="kafka", bootstrap_servers="h:9092", topic="a", path="src"), "path is not for the kafka format"),
        (_source(format="kafka", topic="a"), "bootstrap_servers is required"),
        (_source(format="kafka", bootstrap_servers="h", topic="a", topics=["b"]), "exactly one of topic"),
        (_source(format="kafka", bootstrap_servers="h", topic="a", options={"startingOffsets": "earliest"}), "sets this itself"),
        (_source(format="kafka", bootstrap_servers="h", topic="a", starting="newest"), "starting must be"),
        (_source(format="kafka", bootstrap_servers="h", topic="a", starting={"b": {"0": 1}}), "not one of the source's topics"),
        (_source(format="kafka", bootstrap_servers="h", topic="a", max_files=3), "only for the documents format"),
        (_source(format="documents"), "path is required"),
    ]
    for data, message in refused:
        with pytest.raises(ConfigError, match=message):
            parse_config(data, "x")


# --- a real broker ----------------------------------------------------------------------------------



def kafka_binding(broker: Broker, name: str, topic: str, table: Path, **source: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": {"format": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic, **source},
        "table": str(table),
        "key": ["id"],
    }


def oracle(docs: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """lastWriteWins in production order (each key is produced to one partition)."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for doc in docs:
        if doc.get("_meta", {}).get("op") == "d":
            state.pop((doc["id"],), None)
        else:
            state[(doc["id"],)] = {k: v for k, v in doc.items() if k != "_meta"}
    return state


def wave(first: int, count: int, keys: range, seed: int) -> list[dict[str, Any]]:
    """``count`` documents over ``keys``, every seventh a delete."""
    docs = []
    for i in range(first, first + count):
        key = keys[(i * 7 + seed) % len(keys)]
        if i % 7 == 3:
            docs.append({"_meta": {"op": "d"}, "id": key})
        else:
            docs.append({"id": key, "v": i, "name": f"n{i}"})
    return docs


def produce(broker: Broker, topic: str, docs: list[dict[str, Any]], partitions: int, pinned: dict[int, int] | None = None) -> None:
    """Each key to partition ``id % partitions`` (or ``pinned[id]``), so a key's order is its partition's."""
    pinned = pinned or {}
    broker.produce(
        topic, [(str(d["id"]).encode(), json.dumps(d).encode(), pinned.get(d["id"], d["id"] % partitions)) for d in docs]
    )


def log_entries(config: Any) -> dict[int, Any]:
    log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
    return {e.epoch: e for e in log.entries() if e.kind == "commit"}


@pytest.mark.kafka
@pytest.mark.spark
def test_two_waves_and_a_partition_added_mid_run_land_exactly_as_produced(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("orders", 3)
    first = wave(0, 150, range(30), seed=1)
    produce(broker, "orders", first, 3)
    config = load_config(
        write_config(tmp_path, [kafka_binding(broker, "orders", "orders", tmp_path / "tables" / "orders", max_records=60)])
    )
    summary = Runtime(config, spark).run()
    assert [sum(e.documents.values()) for e in summary.epochs] == [60, 60, 30]
    assert table_rows(spark, tmp_path / "tables" / "orders", ["id"]) == oracle(first)

    broker.add_partitions("orders", 4)
    # Old keys stay on their partitions; keys 100-109 go to the new partition 3 only.
    second = wave(150, 60, range(30), seed=2) + wave(210, 30, range(100, 110), seed=3)
    produce(broker, "orders", second, 3, pinned={k: 3 for k in range(100, 110)})
    events = ListCollector()
    summary = Runtime(config, spark, events).run()
    assert sum(sum(e.documents.values()) for e in summary.epochs) == 90
    assert table_rows(spark, tmp_path / "tables" / "orders", ["id"]) == oracle(first + second)
    entries = log_entries(config)
    last = entries[max(entries)].runtime_checkpoint["orders"]
    watermarks = {str(p): high for (t, p), (_, high) in _marks(broker, "orders").items()}
    assert last["offsets"] == {"orders": watermarks}
    assert any("orders/3:0-" in e["extent"] for e in events.named("read"))
    epochs = [h["tag"]["epoch"] for h in history(spark, TableRef(str(tmp_path / "tables" / "orders"))) if h["tag"]]
    assert epochs == sorted(entries)


def _marks(broker: Broker, topic: str) -> dict[Any, tuple[int, int]]:
    from materializer.sources.kafka.source import Offsets

    return Offsets(broker.bootstrap, {}, "test").watermarks([topic])


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.crash
def test_a_kill_in_the_merge_of_the_second_wave_replays_the_same_offsets(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("crash", 2)
    first = wave(0, 40, range(12), seed=4)
    produce(broker, "crash", first, 2)
    path = write_config(tmp_path, [kafka_binding(broker, "items", "crash", tmp_path / "tables" / "items")])
    config = load_config(path)
    assert Runtime(config, spark).run().last_epoch == 1
    after_first = {str(p): high for (_, p), (_, high) in _marks(broker, "crash").items()}
    second = wave(40, 50, range(12), seed=5)
    produce(broker, "crash", second, 2)
    after_second = {str(p): high for (_, p), (_, high) in _marks(broker, "crash").items()}

    killed = run_cli("run", "--config", str(path), env={"MATERIALIZER_CRASH_AT": "mid-apply:2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    # Epoch 2 is in the log with its exact range, and not (fully) applied.
    entry = log_entries(config)[2].runtime_checkpoint["items"]
    assert entry["range"] == {"crash": {p: [after_first[p], after_second[p]] for p in after_first}}
    assert entry["offsets"] == {"crash": after_second}

    # Make it harder: epoch 2's staged file is lost and more records arrive before the repair.
    # recover must re-read exactly epoch 2's recorded range, not up to the new latest offsets.
    staged = log_entries(config)[2].driver_checkpoint.staged["items"]
    open_store(config.staging).delete_prefix(staged.uri)
    third = wave(90, 30, range(12), seed=6)
    produce(broker, "crash", third, 2)
    recover(config, spark)
    assert log_entries(config)[2].runtime_checkpoint["items"] == entry

    events = ListCollector()
    summary = Runtime(config, spark, events).run()
    assert summary.reapplied is not None and [r.status for r in summary.reapplied.results] == ["applied"]
    # Then only wave 3, from where epoch 2's range ended.
    assert [e.epoch for e in summary.epochs] == [3]
    assert log_entries(config)[3].runtime_checkpoint["items"]["range"]["crash"] == {
        p: [after_second[p], high] for p, high in {str(p): h for (_, p), (_, h) in _marks(broker, "crash").items()}.items()
    }
    assert table_rows(spark, tmp_path / "tables" / "items", ["id"]) == oracle(first + second + third)
    epochs = [h["tag"]["epoch"] for h in history(spark, TableRef(str(tmp_path / "tables" / "items"))) if h["tag"]]
    assert epochs == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_records_removed_by_retention_and_a_deleted_topic_are_reported(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("retained", 2)
    first = [{"id": i, "v": i} for i in range(20)]
    produce(broker, "retained", first, 2)
    table = tmp_path / "tables" / "r"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "r", "retained", table)]))
    Runtime(config, spark).run()
    second = [{"id": i, "v": i} for i in range(20, 40)]
    produce(broker, "retained", second, 2)
    broker.delete_records("retained", 0, 15)  # partition 0 held offsets 0-19; 10-14 were never read
    with pytest.raises(SourceError, match="retained/0: offsets 10 to 14 \\(5 records\\) are gone from the broker"):
        Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == oracle(first)  # nothing applied

    skipping = load_config(
        write_config(tmp_path, [kafka_binding(broker, "r", "retained", table, on_data_loss="skip")])
    )
    events = ListCollector()
    Runtime(skipping, spark, events).run()
    assert "SKIPPED lost records: retained/0@10" in " ".join(e["extent"] for e in events.named("read"))
    lost = {20, 22, 24, 26, 28}  # ids 20-38 even went to partition 0 at offsets 10-19; the first five are gone
    assert table_rows(spark, table, ["id"]) == oracle(first + [d for d in second if d["id"] not in lost])

    # Records that vanish between the plan and Spark's read (retention racing the epoch) fail the
    # read, and the failure is explained, not passed on as Spark's.
    from materializer.sources.kafka.source import KafkaSource, Plan

    source = KafkaSource(skipping.bindings[0], open_store(skipping.staging))
    with pytest.raises(SourceError, match="disappeared from the broker while Spark read them"):
        source._batch(spark, None, Plan(ranges={("retained", 0): (10, 20)}, positions={("retained", 0): 20}))

    broker.delete_topic("retained")
    with pytest.raises(SourceError, match="topic 'retained' is gone"):
        Runtime(skipping, spark).run()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_a_bad_record_is_named_by_partition_and_offset_and_nothing_lands(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("bad", 1)
    broker.produce("bad", [(b"1", b'{"id": 1, "v": 1}', 0), (b"2", b'{"id": 2, "v": ', 0), (b"3", None, 0)])
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "b", "bad", tmp_path / "tables" / "b")]))
    with pytest.raises(SourceError) as caught:
        Runtime(config, spark).run()
    message = str(caught.value)
    assert "topic bad partition 0 offset 1: not valid JSON" in message
    assert "topic bad partition 0 offset 2: the record's value is null (a tombstone)" in message
    assert not (tmp_path / "tables" / "b").exists()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_debezium_change_events_with_and_without_the_schema_envelope(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("dbz", 2)

    def event(op: str, before: Any, after: Any, envelope: bool = False) -> bytes:
        body = {"before": before, "after": after, "op": op, "source": {"lsn": 1}, "ts_ms": 0}
        return json.dumps({"schema": {"type": "struct"}, "payload": body} if envelope else body).encode()

    messages = [
        (b"1", event("r", None, {"id": 1, "name": "a"}), 1),
        (b"2", event("c", None, {"id": 2, "name": "b"}, envelope=True), 0),
        (b"1", event("u", {"id": 1, "name": "a"}, {"id": 1, "name": "a2"}), 1),
        (b"2", event("d", {"id": 2, "name": "b"}, None), 0),
        (b"2", None, 0),  # the tombstone Debezium writes after a delete
        (b"3", event("c", None, {"id": 3, "name": "c"}, envelope=True), 1),
        (b"3", event("d", {"id": 3}, None, envelope=True), 1),
        (b"3", None, 1),
        (b"3", event("c", None, {"id": 3, "name": "c2"}), 1),
    ]
    broker.produce("dbz", messages)
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "d", "dbz", tmp_path / "tables" / "d", payload="debezium")]))
    summary = Runtime(config, spark).run()
    assert sum(e.documents["d"] for e in summary.epochs) == 7  # two tombstones left out
    assert table_rows(spark, tmp_path / "tables" / "d", ["id"]) == {(1,): {"id": 1, "name": "a2"}, (3,): {"id": 3, "name": "c2"}}

    broker.produce("dbz", [(b"4", event("t", None, None), 0), (b"5", event("d", None, None), 0)])
    with pytest.raises(SourceError) as caught:
        Runtime(config, spark).run()
    assert "topic dbz partition 0 offset 3: Debezium op 't' (truncate 't', message 'm') is not supported" in str(caught.value)
    assert "topic dbz partition 0 offset 4: Debezium delete (op 'd') has no 'before' object" in str(caught.value)


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_keys_from_the_message_key_and_tombstones_that_delete_them(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("keyed", 1)
    broker.produce(
        "keyed",
        [
            (b'{"id": 1}', b'{"v": 1}', 0),
            (b"2", b'{"v": 2}', 0),  # one key field: a JSON scalar key
            (b'{"schema": {"type": "struct"}, "payload": {"id": 3}}', b'{"id": 3, "v": 3}', 0),  # held in both, equal
            (b'{"id": 4}', b"{}", 0),
            (b'{"id": 1}', None, 0),  # a tombstone deletes key 1
        ],
    )
    table = tmp_path / "tables" / "k"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "k", "keyed", table, key_from="message")]))
    Runtime(config, spark).run()
    assert table_rows(spark, table, ["id"]) == {(2,): {"id": 2, "v": 2}, (3,): {"id": 3, "v": 3}, (4,): {"id": 4}}

    broker.produce("keyed", [(b'{"id": 5}', b'{"id": 6, "v": 5}', 0), (None, b'{"v": 7}', 0)])
    with pytest.raises(SourceError) as caught:
        Runtime(config, spark).run()
    assert "offset 5: key field 'id' in the value differs from the record's key" in str(caught.value)
    assert "offset 6: the record has no key" in str(caught.value)


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_the_bench_measures_the_same_documents_from_a_topic(spark: Any, broker: Broker, tmp_path: Path) -> None:
    from materializer.tools.bench import BenchOptions, run_bench, summary_table

    options = BenchOptions(
        table_rows=[500], epoch_rows=[100], epochs=2, out=tmp_path, recovery=False, replay=False, peer=False,
        one_row_epoch=False, warmup=False, mode="test", kafka=broker.bootstrap,
        interleave=False,  # path by path here; tests/test_bench.py runs the default, interleaved
    )
    report = run_bench(options, spark=spark)
    (config,) = report["configs"]
    assert "order" not in config
    assert config["tables_agree"] and config["row_counts"]["kafka"] == config["row_counts"]["expected"]
    kafka = config["kafka"]
    assert [e["epoch"] for e in kafka["epochs"]] == [1, 2]  # max_records = the epoch size: the files' epochs
    assert kafka["rows_per_second"] == pytest.approx(100 / kafka["median_total_seconds"])
    assert config["ratios"]["kafka_over_files"] == pytest.approx(kafka["median_total_seconds"] / config["ours"]["median_total_seconds"])
    _, rows = summary_table(report)
    assert any(r[0] == "ours from Kafka rows/s" and r[1] != "-" for r in rows)


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_several_topics_and_where_a_new_pipeline_starts(spark: Any, broker: Broker, tmp_path: Path) -> None:
    import time

    for topic in ("s_a", "s_b"):
        broker.create_topic(topic, 1)
    broker.produce("s_a", [(None, json.dumps({"id": i, "v": "old"}).encode(), 0) for i in range(5)])
    broker.produce("s_b", [(None, json.dumps({"id": 100 + i, "v": "old"}).encode(), 0) for i in range(5)])
    time.sleep(0.05)
    since = int(time.time() * 1000)
    time.sleep(0.05)
    broker.produce("s_a", [(None, json.dumps({"id": i, "v": "new"}).encode(), 0) for i in range(5, 8)])
    broker.produce("s_b", [(None, json.dumps({"id": 100 + i, "v": "new"}).encode(), 0) for i in range(5, 7)])

    def run(name: str, starting: Any) -> dict[tuple[Any, ...], dict[str, Any]]:
        folder = tmp_path / name
        folder.mkdir()
        source = {"format": "kafka", "bootstrap_servers": broker.bootstrap, "topics": ["s_a", "s_b"], "starting": starting}
        config = load_config(write_config(folder, [{"name": name, "source": source, "table": str(folder / "t"), "key": ["id"]}]))
        Runtime(config, spark).run()
        return table_rows(spark, folder / "t", ["id"]) if (folder / "t").exists() else {}

    assert sorted(k[0] for k in run("earliest", "earliest")) == list(range(8)) + list(range(100, 107))
    by_time = run("by_time", {"timestamp": since})
    assert sorted(k[0] for k in by_time) == [5, 6, 7, 105, 106] and {r["v"] for r in by_time.values()} == {"new"}
    assert sorted(k[0] for k in run("by_offset", {"s_a": {"0": 6}})) == [6, 7] + list(range(100, 107))
    assert run("latest", "latest") == {}
