"""Every crash point of materializer/crash.py, in process: the state its comment promises, then recovery.

One row per point (delta-rs's scenario tables): the pipeline runs in a thread that freezes at the
point (tests/helpers.py ``InProcessCrash``: nothing after it runs, no clean-up, as after a kill -9);
the test reads the log, the tables and the staging area and checks what the point's
``# crash here leaves …`` comment says; then a new Runtime recovers, and the tables must equal
materializer's oracle with every epoch applied exactly once and nothing left staged.

The pipeline: three one-file epochs into two bindings, ``sums`` (standard mode, a ``sum`` reduction,
so it loads current rows: ``mid-load`` is reachable and a double apply would show in the sums) and
``log`` (delta-updates, appends: a double apply would show as duplicated rows). It runs with
``pipelined: false`` so a frozen apply leaves no read of the next epoch under way beside it.
The crash is in epoch 2; epoch 1 is applied by then.

Real SIGKILLs (the JVM dying inside a job, the process group, Spark Connect) are the ``crash``
tests' and the drill's: tests/test_drill.py, tests/test_connect.py, tests/test_kafka.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from materializer import crash
from materializer.config import load_config
from materializer.delta import TableRef, history, table_state
from materializer.recovery_log import RecoveryLog
from materializer.runtime import Runtime
from materializer.tools.status import pipeline_status
from materializer.storage import open_store
from tests.helpers import InProcessCrash, assert_tables_equal_oracle, binding, write_config, write_jsonl

pytestmark = pytest.mark.spark

EPOCH = 2
PIPELINE = "crash-points"


@dataclass(frozen=True)
class Promise:
    """What the state on disk must be at the moment of the crash in epoch ``EPOCH``."""

    log_epoch: int
    """The last committed epoch in the recovery log."""
    sums_epoch: int | tuple[int, ...]
    """The epoch the first binding's table records (txnVersion); a tuple: any of these."""
    log_table_epoch: int
    """The epoch the second binding's table records."""
    staged: str
    """Epoch 2's staged datasets: "none", "orphan" (no committed entry references them) or "referenced"."""
    log_temp_file: bool = False
    """A temp file of the entry, never published, in the log folder."""


# One row per point: (point, what its comment in the code promises).
TABLE = [
    # driver.start_commit: staged files that no committed entry references; the next Open deletes them
    ("after-stage", Promise(log_epoch=1, sums_epoch=1, log_table_epoch=1, staged="orphan")),
    # runtime: the driver checkpoint is in hand, the log entry not yet written
    ("after-started-commit", Promise(log_epoch=1, sums_epoch=1, log_table_epoch=1, staged="orphan")),
    # recovery log: the entry durable in a temp file, not yet published
    ("mid-log-commit", Promise(log_epoch=1, sums_epoch=1, log_table_epoch=1, staged="orphan", log_temp_file=True)),
    # runtime: the entry committed but unapplied; the next Open re-applies it
    ("after-log-commit", Promise(log_epoch=2, sums_epoch=1, log_table_epoch=1, staged="referenced")),
    # driver: inside the Spark job of the first binding's MERGE, nothing of it committed. In process
    # the job is interrupted, not killed, and a MERGE this small may commit before the interrupt
    # lands (as a kill just after its commit would find it): 1 or 2. The JVM dying inside the
    # MERGE, table untouched, is the crash tests' (test_connect, test_s3, test_kafka, the drill).
    ("mid-apply", Promise(log_epoch=2, sums_epoch=(1, 2), log_table_epoch=1, staged="referenced")),
    # driver: one table applied, the other not: the re-apply skips the former
    ("after-apply", Promise(log_epoch=2, sums_epoch=2, log_table_epoch=1, staged="referenced")),
    # driver: every table applied, the staged files in place: the first Acknowledge finds them applied
    ("after-ack-before-gc", Promise(log_epoch=2, sums_epoch=2, log_table_epoch=2, staged="referenced")),
    # driver: inside the Spark job loading epoch 2's current rows; epoch 2 not staged
    ("mid-load", Promise(log_epoch=1, sums_epoch=1, log_table_epoch=1, staged="none")),
]


def test_the_table_covers_every_crash_point() -> None:
    assert sorted(point for point, _ in TABLE) == sorted(crash.POINTS)


def _pipeline(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for n in range(3):  # one file per epoch
        write_jsonl(
            src / f"part-{n}.jsonl",
            [{"id": i % 4, "n": n * 10 + i, "v": i + 1} for i in range(6)] + [{"_meta": {"op": "d"}, "id": n}],
        )
    return write_config(
        tmp_path,
        [
            binding("sums", src, tmp_path / "tables" / "sums", max_files=1, reductions={"v": "sum"}),
            binding("log", src, tmp_path / "tables" / "log", max_files=1, mode="delta_updates"),
        ],
        pipeline_id=PIPELINE,
        # One binding at a time: each row promises one order of the two tables (the bindings side
        # by side, and after-apply then, are tests/test_parallel_bindings.py's).
        transaction={"max_documents": 1000, "pipelined": False, "parallel_bindings": 1},
    )


def _staged(tmp_path: Path) -> list[str]:
    """Epoch ``EPOCH``'s staged datasets (``staged/epoch-<n, zero-padded>/<binding>-<random>``)."""
    root = tmp_path / "staging" / PIPELINE / "staged"
    folders = [p for p in root.glob("epoch-*") if int(p.name.split("-")[1]) == EPOCH] if root.is_dir() else []
    return sorted(d.name for folder in folders for d in folder.iterdir())


@pytest.mark.parametrize(("point", "promise"), TABLE, ids=[p for p, _ in TABLE])
def test_each_crash_point_leaves_what_it_promises_and_recovers(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, promise: Promise
) -> None:
    config_path = _pipeline(tmp_path)
    config = load_config(config_path)
    killed = InProcessCrash(monkeypatch, f"{point}:{EPOCH}")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        # --- the state at the crash ---
        log = RecoveryLog(open_store(config.recovery_log), PIPELINE)
        last = log.read().last_commit
        assert (last.epoch if last else 0) == promise.log_epoch
        tables = {b: table_state(spark, TableRef(str(tmp_path / "tables" / b)), PIPELINE).txn_version for b in ("sums", "log")}
        sums = promise.sums_epoch if isinstance(promise.sums_epoch, tuple) else (promise.sums_epoch,)
        assert tables["sums"] in sums and tables["log"] == promise.log_table_epoch, tables
        staged = _staged(tmp_path)
        if promise.staged == "none":
            assert staged == []
        else:
            assert sorted(s.split("-")[0] for s in staged) == ["log", "sums"], staged
            referenced = last is not None and last.epoch == EPOCH
            assert referenced == (promise.staged == "referenced")
            if referenced:
                uris = [f.uri for f in last.driver_checkpoint.staged.values() if f is not None]
                assert sorted(u.rstrip("/").rsplit("/", 1)[-1] for u in uris) == staged
        temp_files = [p for p in (tmp_path / "log").rglob("*") if p.is_file() and p.name.startswith(".tmp")]
        assert bool(temp_files) == promise.log_temp_file, temp_files

        # --- recovery: a new run, as after a restart ---
        killed.disarm()
        summary = Runtime(config, spark).run()
        assert summary.last_epoch == 3
        # Open deletes the orphans (file by file: a dataset is several files) and keeps the rest.
        assert (summary.orphans_deleted >= len(staged)) if promise.staged == "orphan" else summary.orphans_deleted == 0
        if promise.log_epoch == EPOCH:  # the first Acknowledge re-applied (or found applied) epoch 2
            statuses = {r.binding: r.status for r in summary.reapplied.results}
            assert statuses == {
                "sums": "skipped" if tables["sums"] == EPOCH else "applied",
                "log": "skipped" if promise.log_table_epoch == EPOCH else "applied",
            }

        # --- the end state, the crashed run still frozen: exactly once, nothing left behind ---
        assert_tables_equal_oracle(spark, config_path)
        for name in ("sums", "log"):
            ref = TableRef(str(tmp_path / "tables" / name))
            assert [h["tag"]["epoch"] for h in history(spark, ref) if h["tag"]] == [1, 2, 3], name
        assert [p for p in (tmp_path / "staging").rglob("*") if p.is_file()] == []
        assert [p for p in (tmp_path / "log").rglob("*") if p.is_file() and p.name.startswith(".tmp")] == []
        status = pipeline_status(config, spark)
        assert status.agrees and status.last_epoch == 3 and status.orphaned == []
    finally:
        killed.thaw()
        frozen.join(timeout=120)
