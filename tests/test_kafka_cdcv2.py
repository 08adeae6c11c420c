"""Kafka's ``cdcv2`` payload: CDC v2 statements from a topic's partitions, into exact tables.

The statements are the cdcv2 tests' own (a random keyed history, encoded, every statement maybe
duplicated, shuffled, dealt over partitions instead of files), produced to the shared broker.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from materializer import crash
from materializer.config import load_config, parse_config
from materializer.delta import TableRef, history
from materializer.errors import ConfigError, SourceError
from materializer.tools.recover import recover
from materializer.runtime import Runtime
from materializer.sources.kafka.source import Offsets
from materializer.storage import open_store
from tests.helpers import write_config
from tests.kafka_broker import Broker
from tests.test_cdcv2 import Killed, _raise_killed, _table, encode, mangle, oracle, random_history
from tests.test_kafka import _source, kafka_binding, log_entries


def test_payload_cdcv2_takes_no_max_records_and_no_schema() -> None:
    parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", payload="cdcv2"), "x")
    with pytest.raises(ConfigError, match="max_records is not for payload cdcv2"):
        parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", payload="cdcv2", max_records=5), "x")
    with pytest.raises(ConfigError, match="schema is only for documents"):
        parse_config(_source(format="kafka", bootstrap_servers="h:9092", topic="a", payload="cdcv2", schema="id INT"), "x")


def _produce(broker: Broker, topic: str, dealt: list[list[dict[str, Any]]]) -> None:
    broker.produce(topic, [(None, json.dumps(s).encode(), p) for p, statements in enumerate(dealt) for s in statements])


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_a_mangled_history_from_three_partitions_with_a_kill_a_lost_staged_file_and_retention(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    rng = random.Random(17)
    updates = random_history(rng, keys=5, times=8)
    dealt = mangle(rng, encode(rng, updates, None, horizon=8), files=3)
    # The progress past time 4 arrives late (every copy): the frontier waits for it, and updates
    # at later times are already in the topic, still needed.
    def late(statement: dict[str, Any]) -> bool:
        upper = statement.get("progress", {}).get("upper", [0])
        return not upper or upper[0] > 4

    held = [s for statements in dealt for s in statements if late(s)]
    dealt = [[s for s in statements if not late(s)] for statements in dealt]
    broker.create_topic("cdc", 3)
    _produce(broker, "cdc", dealt)
    table = tmp_path / "tables" / "rows"
    path = write_config(tmp_path, [kafka_binding(broker, "rows", "cdc", table, payload="cdcv2")], max_documents=4)
    config = load_config(path)

    # Killed after epoch 2's log commit, and its staged file lost: recover re-reads exactly the
    # epoch's records (offsets to read) and times, though more statements have arrived since.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(crash, "kill_now", _raise_killed)
        mp.setenv(crash.ENV, "after-log-commit:2")
        with pytest.raises(Killed):
            Runtime(config, spark).run()
    entry = log_entries(config)[2]
    open_store(config.staging).delete_prefix(entry.driver_checkpoint.staged["rows"].uri)
    broker.produce("cdc", [(None, json.dumps(s).encode(), 0) for s in rng.sample(dealt[0], 3)])  # duplicates
    recover(config, spark)
    assert log_entries(config)[2].runtime_checkpoint["rows"] == entry.runtime_checkpoint["rows"]
    Runtime(config, spark).run()

    checkpoint = log_entries(config)[max(log_entries(config))].runtime_checkpoint["rows"]
    frontier = checkpoint["frontier"]
    assert frontier is not None  # the held statements are missing
    assert _table(spark, table) == oracle(updates, frontier)
    marks = Offsets(broker.bootstrap, {}, "test").watermarks(["cdc"])
    assert checkpoint["read"] == {"cdc": {str(p): high for (_, p), (_, high) in marks.items()}}
    needed = {int(p): o for p, o in checkpoint["offsets"]["cdc"].items()}
    assert any(needed[p] < marks[("cdc", p)][1] for p in needed)  # something is still needed
    # Retention removes what the frontier has passed: nothing needed is lost, so it is no loss.
    for partition, offset in needed.items():
        if offset > 0:
            broker.delete_records("cdc", partition, offset)

    _produce(broker, "cdc", [[], [], held])
    Runtime(config, spark).run()
    assert _table(spark, table) == oracle(updates, None)
    entries = log_entries(config)
    last = entries[max(entries)].runtime_checkpoint["rows"]
    assert last["frontier"] is None and last["offsets"] == last["read"]  # the stream ended: nothing needed
    epochs = [h["tag"]["epoch"] for h in history(spark, TableRef(str(table))) if h["tag"]]
    assert 2 in epochs and len(epochs) == len(set(epochs))  # the recovered epoch applied, nothing twice


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_a_malformed_statement_is_named_by_topic_partition_and_offset(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("cdc-bad", 1)
    good = {"updates": [[{"id": 1, "v": 1}, 0, 1]]}
    broker.produce("cdc-bad", [(None, json.dumps(good).encode(), 0), (None, b'{"updates": [[{"v": 2}, 0, 1]]}', 0)])
    config = load_config(write_config(tmp_path, [kafka_binding(broker, "rows", "cdc-bad", tmp_path / "t", payload="cdcv2")]))
    with pytest.raises(SourceError, match="topic cdc-bad partition 0 offset 1: malformed CDC v2 statement: update #1 has data without the key field 'id'"):
        Runtime(config, spark).run()
    assert not (tmp_path / "t").exists()


@pytest.mark.spark
def test_recover_re_reads_a_cdcv2_epoch_to_its_recorded_frontier_though_more_times_completed(spark: Any, tmp_path: Path) -> None:
    """The seam both readers share: with ``until`` an epoch ends at the log's frontier (it used to
    take every time complete by then, up to max_documents, and recover refused the mismatch)."""
    from materializer.sources.cdcv2.source import CdcV2Source

    source_dir = tmp_path / "src"
    source_dir.mkdir()
    first = [{"updates": [[{"id": t, "v": t}, t, 1]]} for t in range(3)]
    first.append({"progress": {"lower": [0], "upper": [3], "counts": [[t, 1] for t in range(3)]}})
    (source_dir / "a.jsonl").write_text("".join(json.dumps(s) + "\n" for s in first))
    config = load_config(write_config(tmp_path, [{"name": "rows", "table": str(tmp_path / "t"), "key": ["id"],
                                                  "source": {"format": "cdcv2", "path": str(source_dir)}}]))
    spool = open_store(config.staging)
    batch = CdcV2Source(config.bindings[0], spool).next_batch(spark, None, 100, "spool/a")
    assert batch is not None and batch.checkpoint == {"frontier": 3}
    later = [{"updates": [[{"id": t, "v": t}, t, 1]]} for t in (3, 4)]
    later.append({"progress": {"lower": [3], "upper": [5], "counts": [[3, 1], [4, 1]]}})
    (source_dir / "b.jsonl").write_text("".join(json.dumps(s) + "\n" for s in later))
    again = CdcV2Source(config.bindings[0], spool).next_batch(spark, None, 100, "spool/b", until={"frontier": 3})
    assert again is not None and again.checkpoint == {"frontier": 3} and again.count == 3
