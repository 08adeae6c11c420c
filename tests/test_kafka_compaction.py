"""Compacted topics on a real broker with its log cleaner on: a pipeline that fell behind a
compacted topic by more than its ``delete.retention.ms`` stops (or goes on, logged, under
``on_data_loss: skip``) instead of missing deletes the cleaner removed."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.errors import SourceError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from materializer.events import Progress
from materializer.sources.kafka.source import CompactionLag, compaction_lags, compaction_risks
from materializer.tools.status import pipeline_status
from materializer.tools.oracle_kafka import read_topic
from tests.helpers import write_config
from tests.kafka_broker import Broker
from tests.test_kafka import kafka_binding
from tests.test_kafka_transactions import delta_rs_rows


def test_only_a_read_partition_of_a_compacted_topic_whose_first_unread_record_is_out_of_the_window_is_at_risk() -> None:
    marks = {("c", 0): (0, 10), ("c", 1): (0, 10), ("c", 2): (0, 10), ("d", 0): (0, 10)}
    known = {("c", 0): 4, ("c", 1): 4, ("c", 2): 10, ("d", 0): 0}
    # c/0: the first record within the window is after the position; c/1: the position is within
    # it; c/2: nothing unread; d: not compacted.
    assert compaction_risks(known, marks, {"c": 1000}, {("c", 0): 6, ("c", 1): 3, ("c", 2): -1}) == {("c", 0): 4}
    assert compaction_risks(known, marks, {"c": 1000}, {("c", 0): -1, ("c", 1): 4}) == {("c", 0): 4}  # none within it


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_a_delete_the_cleaner_removed_before_it_was_read_stops_the_run_unless_skipping_is_asked(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    topic = "compacted"
    broker.create_topic(
        topic, 1, **{
            "cleanup.policy": "compact", "delete.retention.ms": "1000", "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.001", "min.compaction.lag.ms": "0",
        }
    )
    broker.produce(topic, [(json.dumps({"id": i}).encode(), json.dumps({"v": i}).encode(), 0) for i in (1, 2, 3)])
    table = tmp_path / "tables" / "c"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "c", topic, table, key_from="message")]))
    Runtime(config, spark).run()
    assert sorted(delta_rs_rows(table)) == [1, 2, 3]

    # Key 2 is deleted; the pipeline does not run while the cleaner removes the tombstone (a new
    # record now and then rolls the segments so the cleaner has something to clean).
    broker.produce(topic, [(b'{"id": 2}', None, 0)])
    deadline = time.monotonic() + 120
    filler = 100
    while time.monotonic() < deadline:
        time.sleep(0.5)
        filler += 1
        broker.produce(topic, [(json.dumps({"id": filler}).encode(), b'{"v": 0}', 0)])
        if not any(r[3] == b'{"id": 2}' for r in read_topic(broker.bootstrap, [topic])):
            break
    else:
        pytest.fail("the log cleaner did not remove the tombstone within 120 s")

    with pytest.raises(SourceError, match=(
        "partition compacted/0 of compacted topic 'compacted': the first record the pipeline has not read \\(offset 3\\) "
        "is older than the topic's delete.retention.ms, 1000 ms \\(1 s\\)"
    )):
        Runtime(config, spark).run()
    assert sorted(delta_rs_rows(table)) == [1, 2, 3]  # nothing applied

    skipping = load_config(write_config(tmp_path, [kafka_binding(broker, "c", topic, table, key_from="message", on_data_loss="skip")]))
    events = ListCollector()
    Runtime(skipping, spark, events).run()
    assert "read PAST delete.retention.ms of compacted compacted/0@3" in " ".join(e["extent"] for e in events.named("read"))
    rows = delta_rs_rows(table)
    assert 2 in rows and 101 in rows  # the lost delete, as the user accepted: the key stays


def test_the_lag_beside_the_window_is_the_age_of_the_first_unread_record_nearest_to_its_window_first() -> None:
    marks = {("c", 0): (0, 10), ("c", 1): (0, 10), ("c", 2): (0, 10), ("d", 0): (0, 10)}
    positions = {("c", 0): 4, ("c", 1): 2, ("c", 2): 10, ("d", 0): 0}
    stamps = {("c", 0): 9_000, ("c", 1): 4_000, ("d", 0): 0}
    # c/2: caught up; d: not compacted. c/1's first unread record is older: nearest its window.
    lags = compaction_lags(positions, marks, {"c": 10_000}, stamps, now_ms=10_000)
    assert lags == [CompactionLag("c", 1, 2, 6_000, 10_000), CompactionLag("c", 0, 4, 1_000, 10_000)]
    assert lags[0].margin_ms == 4_000 and "60% of delete.retention.ms 10000 ms (10 s)" in lags[0].describe()
    assert "PAST" in CompactionLag("c", 0, 4, 11_000, 10_000).describe()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_progress_records_and_status_show_the_oldest_unread_record_beside_delete_retention(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    topic, window = "compacted-lag", 3_600_000
    broker.create_topic(topic, 1, **{"cleanup.policy": "compact", "delete.retention.ms": str(window)})
    old = int(time.time() * 1000) - 40 * 60_000  # written 40 minutes ago: 2/3 of the window
    broker.produce(topic, [(json.dumps({"id": i}).encode(), json.dumps({"v": i}).encode(), 0) for i in (1, 2, 3)], timestamp_ms=old)
    table = tmp_path / "tables" / "c"
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "c", topic, table, key_from="message", max_records=2)]))
    events = ListCollector()
    Runtime(config, spark, events).run()
    assert sorted(delta_rs_rows(table)) == [1, 2, 3]

    # Epoch 1 left offset 2 unread (40 minutes old); epoch 2 caught up: no lag to show.
    records = {p.record.epoch: p.record for p in events.of(Progress)}
    first = records[1]
    assert first.lag_records == 1 and first.delete_retention_ms == window
    assert 40 * 60_000 <= first.oldest_unread_ms < window
    assert first.bindings[0].oldest_unread_ms == first.oldest_unread_ms
    assert records[2].oldest_unread_ms is None and records[2].lag_records == 0
    extent = events.named("read")[0]["extent"]
    assert re.search(r"oldest unread record \(offset 2\) is \d+ min old, \d+% of delete.retention.ms 3600000 ms \(1 h\)", extent), extent

    # What status shows between runs: the record written since, beside the window.
    broker.produce(topic, [(b'{"id": 4}', b'{"v": 4}', 0)], timestamp_ms=old)
    tables = pipeline_status(config).tables
    assert [(c["topic"], c["partition"], c["offset"], c["delete_retention_ms"]) for c in tables[0].compaction] == [(topic, 0, 3, window)]
    assert first.oldest_unread_ms <= tables[0].compaction[0]["oldest_unread_ms"] < window
    assert "compacted compacted-lag/0: oldest unread record (offset 3)" in tables[0].compaction_note
