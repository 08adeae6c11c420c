"""Binding templates on a real broker (issue 32 item 5): 50 topics declared by one pattern.

Topics ``fleet.t00`` … ``fleet.t48`` and one that does not match exist at the start; ``fleet.t49``
appears after the first epoch and becomes a binding at the next epoch boundary, read from its
start. Epoch 3's apply is cut by a real SIGKILL of the CLI (and its JVM) once some of the 50
tables record it and others do not; the restart applies the others only. Every table is then read
back with delta-rs and equals what was produced (last write per message key, tombstones delete),
and every table records each epoch once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import read_txn_without_spark
from materializer.recovery_log import RecoveryLog
from materializer.runtime import TemplatedRuntime
from materializer.storage import open_store
from materializer.tables import TableRef
from tests.helpers import REPO, cli_env, delta_rs_rows, require_subprocess_tier, write_config
from tests.kafka_broker import Broker

TOPICS = 50
PIPELINE = "fleet-kafka"


def _topic(i: int) -> str:
    return f"fleet.t{i:02d}"


def _wave(broker: Broker, topic: str, wave: int, state: dict[int, dict[str, Any]]) -> None:
    """Four records on three keys (an update of key 1; in wave 2 a tombstone of key 0)."""
    records: list[tuple[int, dict[str, Any] | None]] = [(0, {"v": wave * 10}), (1, {"v": wave * 10 + 1}), (2, {"v": wave * 10 + 2})]
    records.append((1, {"v": wave * 10 + 3, "w": topic}))
    if wave == 2:
        records.append((0, None))
    broker.produce(topic, [(json.dumps({"id": k}).encode(), None if v is None else json.dumps(v).encode(), 0) for k, v in records])
    for k, v in records:
        if v is None:
            state.pop(k, None)
        else:
            state[k] = {"id": k, **v}


def _recorded(table: Path) -> int:
    state = read_txn_without_spark(TableRef(str(table)), PIPELINE)
    assert state is not None
    return state.txn_version or 0


# In the long tier (pytest -m long), not CI's full run: 50 bindings x 3 epochs and a restart took
# 18 minutes on the loaded two-core machine, a fifth of CI's time limit.
@pytest.mark.long
@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.crash
def test_fifty_topics_of_one_pattern_killed_mid_apply_land_exactly(spark: Any, broker: Broker, tmp_path: Path) -> None:
    require_subprocess_tier("the CLI run killed mid-apply")
    expected: dict[str, dict[int, dict[str, Any]]] = {f"t{i:02d}": {} for i in range(TOPICS)}
    for i in range(TOPICS - 1):
        broker.create_topic(_topic(i), 1)
        _wave(broker, _topic(i), 1, expected[f"t{i:02d}"])
    broker.create_topic("fleet_other", 1)
    broker.produce("fleet_other", [(b'{"id": 1}', b'{"v": 1}', 0)])
    tables = tmp_path / "tables"
    path = write_config(
        tmp_path, [], pipeline_id=PIPELINE,
        transaction={"parallel_bindings": 2},
        templates=[{
            "name": "{table}",
            "source": {
                "format": "kafka", "bootstrap_servers": broker.bootstrap, "topic_pattern": r"fleet\.(?P<table>t\d+)",
                "key_from": "message",
            },
            "table": str(tables / "{table}"),
            "key": ["id"],
        }],
    )
    config = load_config(path)
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)

    # Epoch 1: the 49 topics found; then fleet.t49 appears and a second wave lands everywhere.
    assert TemplatedRuntime(config, spark).run().last_epoch == 1
    assert len(log.read().last_commit.driver_checkpoint.templated) == TOPICS - 1
    broker.create_topic(_topic(TOPICS - 1), 1)
    for i in range(TOPICS):
        _wave(broker, _topic(i), 1 if i == TOPICS - 1 else 2, expected[f"t{i:02d}"])
    assert TemplatedRuntime(config, spark).run().last_epoch == 2
    covered = log.read().last_commit.driver_checkpoint.templated
    assert covered == {f"t{i:02d}": f"topic:{_topic(i)}" for i in range(TOPICS)}

    # Epoch 3, run by the CLI and SIGKILLed (with its JVM) once some tables record it.
    for i in range(TOPICS):
        _wave(broker, _topic(i), 3, expected[f"t{i:02d}"])
    env = cli_env()
    run = subprocess.Popen(
        [sys.executable, "-m", "materializer_cli", "run", "--config", str(path)], cwd=REPO, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    deadline = time.monotonic() + 600
    applied: list[str] = []
    try:
        while time.monotonic() < deadline and run.poll() is None:
            applied = [name for name in expected if (tables / name / "_delta_log").exists() and _recorded(tables / name) >= 3]
            if len(applied) >= 3:
                break
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # the CLI and its JVM, mid-apply
        _, stderr = run.communicate(timeout=60)
    assert run.returncode == -9, f"the run ended before it was killed: {stderr.decode()[-3000:]}"
    assert log.read().last_epoch == 3
    applied = [name for name in expected if _recorded(tables / name) >= 3]
    assert 3 <= len(applied) < TOPICS, f"killed with {len(applied)} of {TOPICS} tables applied"

    # The restart applies epoch 3 to the other tables only, then finds nothing new.
    summary = TemplatedRuntime(config, spark).run()
    assert summary.reapplied is not None and summary.epochs == []
    statuses = {r.binding: r.status for r in summary.reapplied.results}
    assert {n for n, s in statuses.items() if s == "skipped"} == set(applied)
    assert {n for n, s in statuses.items() if s == "applied"} == set(expected) - set(applied)

    from deltalake import DeltaTable

    for name, rows in expected.items():
        table = tables / name
        assert delta_rs_rows(table, ["id"]) == {(k,): row for k, row in rows.items()}, name
        # One commit per epoch (the first CREATEs the table, the others MERGE), each tagged with its epoch.
        tagged = [
            (json.loads(c["userMetadata"])["materializer"]["epoch"], c.get("operation"))
            for c in DeltaTable(str(table)).history() if c.get("userMetadata")
        ]
        first = 2 if name == f"t{TOPICS - 1:02d}" else 1
        assert sorted(e for e, _ in tagged) == list(range(first, 4)), f"{name}: each epoch once, found {tagged}"
    assert not (tables / "fleet_other").exists()

    from materializer.tools.status import pipeline_status

    status = pipeline_status(config)
    assert status.agrees and sorted(t.binding for t in status.tables) == sorted(expected)
