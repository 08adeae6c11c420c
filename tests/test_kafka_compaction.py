"""Compacted topics on a real broker with its log cleaner on: a pipeline that fell behind a
compacted topic by more than its ``delete.retention.ms`` stops (or goes on, logged, under
``on_data_loss: skip``) instead of missing deletes the cleaner removed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.errors import SourceError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from materializer.sources.kafka import compaction_risks
from materializer.tools.oracle_kafka import read_topic
from tests.helpers import write_config
from tests.kafka_broker import Broker, broker  # noqa: F401 - the session fixture
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
