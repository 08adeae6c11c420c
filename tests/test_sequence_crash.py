"""Exactly-once for sequenced and scd2 bindings (issue #16): a run stopped at every failure point
(in-process) and restarted; then the tables equal the oracle, each epoch in Delta's history once.

In-process, the kill is a BaseException raised where ``kill_now`` would SIGKILL the process: the
run stops there and nothing after it happens. (Unlike a real kill, ``finally`` and ``except
BaseException`` blocks still run: the real-SIGKILL coverage is the drill test at the end, which
also covers ``mid-apply`` inside the MERGE's Spark job.)
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from materializer import crash
from materializer.tools import oracle
from materializer.config import load_config
from materializer.delta import TableRef, history
from tests.helpers import binding, write_config, write_jsonl


class Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so no ``except Exception`` handler swallows it."""


def _die() -> None:
    raise Killed()


def changes(folder: Path, *, files: int, per_file: int, keys: int, seed: int) -> None:
    """Upserts and deletes with shuffled sequences (late ones, duplicates) over ``files`` files."""
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = []
    for ts in range(1, files * per_file + 1):
        k = rng.randrange(keys)
        if rng.random() < 0.2:
            docs.append({"id": k, "ts": ts, "_meta": {"op": "d"}})
        else:
            docs.append({"id": k, "ts": ts, "v": rng.randrange(4), "note": f"n{ts}"})
    # Some duplicates of a sequence with other values: the later file's wins.
    docs += [{**d, "v": 9} for d in rng.sample([d for d in docs if "v" in d], per_file // 3)]
    rng.shuffle(docs)
    size = len(docs) // files + 1
    for f in range(files):
        write_jsonl(folder / f"part-{f:03d}.jsonl", docs[f * size:(f + 1) * size])


def pipeline(tmp_path: Path) -> Any:
    changes(tmp_path / "src", files=EPOCHS, per_file=8, keys=6, seed=16)
    tables = tmp_path / "tables"
    return load_config(write_config(tmp_path, [
        binding("current", tmp_path / "src", tables / "current", max_files=1, sequence_by=["ts"]),
        binding("history", tmp_path / "src", tables / "history", max_files=1, mode="scd2", sequence_by=["ts"],
                track_history_except=["note"]),
        binding("marked", tmp_path / "src", tables / "marked", max_files=1, soft_delete=True, ignore_null_updates=True),
    ], pipeline_id="seq-crash"))


# (point, epoch): every point that fires in the calling thread, once, each run stopping there. The
# points before the log commit all stop in epoch 1 (nothing committed, the next run reads it again),
# so four epochs hold the schedule: every Spark job of a run is seconds on two cores. mid-apply and
# mid-load fire from a watcher thread (a real kill): the drill test below covers mid-apply, and
# tests/test_crash_points.py every point in process.
SCHEDULE = [
    ("after-stage", 1), ("after-started-commit", 1), ("mid-log-commit", 1), ("after-log-commit", 1),
    ("after-apply", 2), ("after-ack-before-gc", 3),
]
EPOCHS = 4


@pytest.mark.slow
@pytest.mark.spark
def test_stopped_at_every_point_and_restarted_ends_exactly_once(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from materializer.runtime import Runtime

    config = pipeline(tmp_path)
    monkeypatch.setattr(crash, "kill_now", _die)
    for point, epoch in SCHEDULE:
        monkeypatch.setenv(crash.ENV, f"{point}:{epoch}")
        with pytest.raises(Killed):
            Runtime(config, spark).run()
    monkeypatch.delenv(crash.ENV)
    assert Runtime(config, spark).run().last_epoch == EPOCHS

    for b in config.bindings:
        exp = oracle.expected(b, config.transaction.max_documents)
        assert exp.verified, exp.reason
        rows = [r.asDict(recursive=True) for r in spark.read.format("delta").load(b.table).collect()]
        result = oracle.compare(exp, rows, b.key)
        assert result.ok, (b.name, result.lost[:3], result.wrong[:3], result.duplicated[:3])
        tagged = [h["tag"]["epoch"] for h in history(spark, TableRef(b.table)) if h["tag"]]
        assert sorted(tagged) == list(range(1, EPOCHS + 1)) and not [e for e, n in Counter(tagged).items() if n > 1], (b.name, tagged)


@pytest.mark.drill
@pytest.mark.crash
def test_drill_kills_sequenced_and_scd2_bindings_at_every_point(tmp_path: Path) -> None:
    """The drill (real SIGKILLs, mid-apply inside the MERGE included) on the three bindings above."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import REPO

    changes(tmp_path / "src", files=7, per_file=8, keys=6, seed=16)
    prod = tmp_path / "prod"
    prod.mkdir()
    tables = prod / "tables"
    cfg = write_config(prod, [
        binding("current", tmp_path / "src", tables / "current", max_files=1, sequence_by=["ts"]),
        binding("history", tmp_path / "src", tables / "history", max_files=1, mode="scd2", sequence_by=["ts"],
                track_history_except=["note"]),
    ], pipeline_id="seq-drill")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != crash.ENV}
    result = subprocess.run(
        [sys.executable, "-m", "materializer_cli", "drill", "--config", str(cfg), "--workdir", str(tmp_path / "work"),
         "--report", str(report), "--kills", "1", "--seed", "16"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3600,
    )
    data = json.loads(report.read_text())
    assert result.returncode == 0 and data["verdict"] == "pass", result.stdout[-3000:] + result.stderr[-3000:]
    assert data["rows"] == {"lost": 0, "duplicated": 0, "wrong": 0}
    for rnd in data["rounds"]:
        for table in rnd["tables"]:
            assert table["verified"] and table["epochs_applied_twice"] == [] and table["epochs_missing"] == []
    assert data["kills"].get("mid-apply") == 1, data["kills"]
