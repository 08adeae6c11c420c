"""The runtime's transaction loop against a fake driver and a fake source: the protocol's order, no JVM.

The runtime talks to a driver, the recovery log and the sources alone, so its ordering (DESIGN.md's
loop and invariants 1-4) is visible with stand-ins for both: the recovery log is the real one, on
a temporary folder. Every step is recorded in one journal, in the order it happened:

* Open (its table checks and orphan clean-up) before the first read;
* StartCommit of N before N's log commit; Acknowledge of N only after N's log commit (log before apply);
* pipelined: the read of N+1 overlaps the Acknowledge of N; Flush and StartCommit of N+1 wait for
  its Acknowledged (read-committed loads; the log at most one epoch ahead of the tables);
* not pipelined: the Acknowledge of N ends before the read of N+1;
* the first Acknowledge after Open re-applies the last committed epoch before anything is staged;
* an apply's failure is reported after its entry is committed, and nothing after it is committed;
* the driver's keep-alive runs on a clock, during a long step too, and stops before the driver closes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from materializer import reductions
from materializer.config import load_config
from materializer.errors import ApplyError
from materializer.protocol import (
    Acknowledge,
    Acknowledged,
    Driver,
    DriverCheckpoint,
    Flush,
    Flushed,
    Load,
    Open,
    Opened,
    StagedFile,
    StartCommit,
    StartedCommit,
    Store,
)
from materializer.runtime import Runtime
from materializer.sources import Source, SourceBatch
from tests.helpers import binding, write_config

EPOCHS = 3


class Journal:
    def __init__(self) -> None:
        self.steps: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self.read_began: dict[int, threading.Event] = {}

    def add(self, step: str, epoch: int = 0) -> None:
        with self._lock:
            self.steps.append((step, epoch))

    def at(self, step: str, epoch: int) -> int:
        return self.steps.index((step, epoch))

    def read_event(self, epoch: int) -> threading.Event:
        with self._lock:
            return self.read_began.setdefault(epoch, threading.Event())


class FakeSource(Source):
    """``EPOCHS`` batches of one document each; the checkpoint is the number of batches taken."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def next_batch(self, spark: Any, checkpoint: Any, max_documents: int, spool_path: str, *, until: Any = None) -> SourceBatch | None:
        taken = (checkpoint or {}).get("taken", 0)
        epoch = int(spool_path.split("epoch-")[1].split("/")[0])
        self.journal.add("read", epoch)
        self.journal.read_event(epoch).set()
        if taken >= EPOCHS:
            return None
        return SourceBatch(documents=f"documents {taken + 1}", checkpoint={"taken": taken + 1}, count=1, description=f"batch {taken + 1}")


class FakeDriver(Driver):
    def __init__(self, journal: Journal, *, pipelined: bool, fail_at: int | None = None) -> None:
        self.journal = journal
        self.pipelined = pipelined
        self.fail_at = fail_at
        self.overlapped: dict[int, bool] = {}
        """Per acknowledged epoch: did the read of the next epoch begin while it was applied?"""
        self.epoch = 0

    def validate(self) -> None:
        self.journal.add("validate")

    def open(self, message: Open) -> Opened:
        self.journal.add("open", message.last_epoch)
        return Opened()

    def acknowledge(self, message: Acknowledge) -> Acknowledged:
        self.journal.add("acknowledge", message.epoch)
        if self.pipelined:
            # Held until the next epoch's read has begun: only an overlapping read releases it.
            self.overlapped[message.epoch] = self.journal.read_event(message.epoch + 1).wait(timeout=20)
        if message.epoch == self.fail_at:
            self.journal.add("apply failed", message.epoch)
            raise ApplyError("Delta refused to apply the epoch", epoch=message.epoch, binding="items")
        self.journal.add("acknowledged", message.epoch)
        return Acknowledged(epoch=message.epoch, results=[])

    def load(self, message: Load) -> None:
        self.journal.add("load", self.epoch + 1)

    def keep_alive(self) -> None:
        self.journal.add("keep alive")
        raise RuntimeError("a failed touch is not the run's error")

    def close(self) -> None:
        self.journal.add("close")

    def flush(self, message: Flush) -> Flushed:
        self.journal.add("flush")
        return Flushed()

    def store(self, message: Store) -> None:
        self.journal.add("store")

    def prestage(self, message: Store, epoch: int) -> None:
        self.journal.add("prestage", epoch)

    def start_commit(self, message: StartCommit) -> StartedCommit:
        self.journal.add("start_commit", message.epoch)
        staged = StagedFile(uri=f"staged/epoch-{message.epoch:012d}/items-fake", rows=1, bytes=1, files=1)
        return StartedCommit(driver_checkpoint=DriverCheckpoint(epoch=message.epoch, staged={"items": staged}, rewind=message.rewind))


def _runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, pipelined: bool, fail_at: int | None = None) -> tuple[Runtime, Journal, FakeDriver]:
    config = load_config(
        write_config(
            tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")],
            transaction={"max_documents": 1000, "pipelined": pipelined},
        )
    )
    assert config.transaction.pipelined is pipelined
    # The reduction is Spark's work; here a batch's "rows" are its documents as they are.
    monkeypatch.setattr(reductions, "reduce", lambda documents, loaded, binding: documents)
    journal = Journal()
    driver = FakeDriver(journal, pipelined=pipelined, fail_at=fail_at)
    runtime = Runtime(config, None, driver=driver, sources={"items": FakeSource(journal)})  # type: ignore[arg-type]
    commit = runtime.log.commit

    def logged(epoch: int, *args: Any, **kwargs: Any) -> Any:
        entry = commit(epoch, *args, **kwargs)
        journal.add("log commit", epoch)
        return entry

    monkeypatch.setattr(runtime.log, "commit", logged)
    return runtime, journal, driver


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "sequential"])
def test_the_loop_keeps_the_protocols_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipelined: bool) -> None:
    runtime, journal, driver = _runtime(tmp_path, monkeypatch, pipelined=pipelined)
    summary = runtime.run()
    assert summary.last_epoch == EPOCHS and [e.epoch for e in summary.epochs] == [1, 2, 3]
    steps = journal.steps
    # Before the log is opened: the configuration's checks; then Open before the first read.
    assert steps[0] == ("validate", 0) and steps[1] == ("open", 0) and steps[2] == ("read", 1)
    for n in range(1, EPOCHS + 1):
        # Staged, then committed to the log, then applied (log before apply, invariant 1).
        assert journal.at("start_commit", n) < journal.at("log commit", n) < journal.at("acknowledge", n)
        assert journal.at("acknowledged", n) > journal.at("log commit", n)
        if n > 1:
            # Epoch n's staging waits for n-1's Acknowledged (read-committed loads, invariant 4).
            flush = next(i for i, s in enumerate(steps) if s[0] == "flush" and i > journal.at("read", n))
            assert flush > journal.at("acknowledged", n - 1)
            assert journal.at("start_commit", n) > journal.at("acknowledged", n - 1)
        if pipelined:
            # The read of n+1 begins while n is being applied, and n+1's bindings need no table:
            # their rows are prestaged meanwhile.
            assert driver.overlapped[n] and journal.at("read", n + 1) < journal.at("acknowledged", n)
            if n < EPOCHS:
                assert journal.at("prestage", n + 1) < journal.at("start_commit", n + 1)
        else:
            assert journal.at("acknowledged", n) < journal.at("read", n + 1)
    # Applied in order, once each.
    assert [e for s, e in steps if s == "acknowledged"] == [1, 2, 3]


def test_the_first_acknowledge_after_open_re_applies_the_last_committed_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, journal, _driver = _runtime(tmp_path, monkeypatch, pipelined=False)
    runtime.run(max_epochs=2)
    # The second run: epoch 2 is committed (and applied, but the runtime cannot know): it re-applies it first.
    again, journal, _driver = _runtime(tmp_path, monkeypatch, pipelined=False)
    summary = again.run()
    steps = journal.steps
    assert steps[:4] == [("validate", 0), ("open", 2), ("acknowledge", 2), ("acknowledged", 2)]
    assert summary.reapplied is not None and summary.reapplied.epoch == 2
    assert [e for s, e in steps if s == "start_commit"] == [3]


def test_a_failed_apply_is_reported_after_its_entry_is_committed_and_nothing_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, journal, _driver = _runtime(tmp_path, monkeypatch, pipelined=True, fail_at=2)
    with pytest.raises(ApplyError):
        runtime.run()
    steps = journal.steps
    assert journal.at("log commit", 2) < journal.at("acknowledge", 2) < journal.at("apply failed", 2)
    # The read of epoch 3 overlapped the failing apply; nothing of epoch 3 was staged or committed.
    assert ("read", 3) in steps and ("start_commit", 3) not in steps and ("log commit", 3) not in steps
    assert runtime.log.read().last_epoch == 2
    # Recorded for `status`: which epoch and binding are stuck, and why.
    assert "Delta refused" in runtime.log.failures()[(2, "items")]


def test_the_keep_alive_runs_on_a_clock_during_a_long_step_and_stops_before_the_driver_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Connect server closes sessions idle for its timeout, and the apply session is idle while
    an epoch is staged however long that takes: the keep-alive is a clock, not a step of the loop."""
    import time

    from materializer.runtime import loop

    monkeypatch.setattr(loop, "KEEP_ALIVE_SECONDS", 0.05)
    runtime, journal, driver = _runtime(tmp_path, monkeypatch, pipelined=False)
    start_commit = driver.start_commit

    def slow(message: StartCommit) -> StartedCommit:
        journal.add("staging began", message.epoch)
        time.sleep(0.5)
        return start_commit(message)

    monkeypatch.setattr(driver, "start_commit", slow)
    summary = runtime.run(max_epochs=1)
    assert summary.last_epoch == 1
    steps = journal.steps
    touches = [i for i, (step, _) in enumerate(steps) if step == "keep alive"]
    # Several touches while epoch 1 was staged (each one failing, and the run went on).
    assert sum(journal.at("staging began", 1) < i < journal.at("start_commit", 1) for i in touches) >= 3
    assert max(touches) < journal.at("close", 0)
    time.sleep(0.2)
    assert [step for step, _ in journal.steps].count("keep alive") == len(touches)  # stopped for good
