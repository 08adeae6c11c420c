"""An epoch's bindings side by side (``transaction.parallel_bindings``, issue 32).

First :func:`materializer.side_by_side.run_each` alone (no JVM): order, slots, a failure. Then the
driver on Spark, in process: several bindings applied by several threads equal the oracle (Spark
and delta-rs), each epoch once per table; a failure in one binding's stage or apply names it and
leaves the others consistent; a crash between tables (``after-apply``) with others in flight is
recovered, re-applying only the tables that were not applied.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import TableRef, history, table_state
from materializer.errors import ApplyError, SourceError
from materializer.merge import DeltaWriter
from materializer.progress import ListCollector
from materializer.recovery_log import RecoveryLog
from materializer.runtime import Runtime
from materializer.side_by_side import machine_cores, run_each, workers_for
from materializer.storage import open_store
from tests.helpers import InProcessCrash, assert_tables_equal_oracle, binding, write_config, write_jsonl

PIPELINE = "side-by-side"


# --- run_each, no JVM ---


def test_results_come_in_item_order_and_no_slot_is_shared() -> None:
    holding: set[int] = set()
    lock = threading.Lock()
    seen_slots: set[int] = set()

    def work(item: int, slot: int) -> int:
        with lock:
            assert slot not in holding, "two items in one slot at once"
            holding.add(slot)
            seen_slots.add(slot)
        time.sleep(0.01 * (item % 3))
        with lock:
            holding.discard(slot)
        return item * 10

    assert run_each(list(range(12)), work, workers=3) == [i * 10 for i in range(12)]
    assert seen_slots == {0, 1, 2}


def test_one_worker_is_the_sequential_loop() -> None:
    calls: list[tuple[str, Any]] = []
    run_each(
        ["a", "b", "c"],
        lambda item, slot: calls.append(("work", item, slot, threading.current_thread().name)) or item,  # type: ignore[func-returns-value]
        workers=1,
        after_each=lambda item, _r, unfinished: calls.append(("after", item, unfinished)),
    )
    me = threading.current_thread().name
    assert calls == [
        ("work", "a", 0, me), ("after", "a", 2), ("work", "b", 0, me), ("after", "b", 1), ("work", "c", 0, me), ("after", "c", 0),
    ]


def test_auto_is_half_the_drivers_cores_between_one_and_eight_and_one_over_connect() -> None:
    for cores, threads in ((1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (16, 8), (96, 8)):
        assert workers_for("auto", connect=False, cores=lambda c=cores: c) == threads, cores
    assert workers_for("auto", connect=True, cores=lambda: 64) == 1
    assert workers_for(3, connect=True) == 3  # a number is taken as it is
    assert 1 <= machine_cores() <= (os.cpu_count() or 1)
    from materializer.config.pipeline import TransactionConfig

    assert TransactionConfig().parallel_bindings == "auto"
    assert TransactionConfig.model_validate({"parallel_bindings": 4}).parallel_bindings == 4
    for wrong in (0, 65, "many"):
        with pytest.raises(ValueError):
            TransactionConfig.model_validate({"parallel_bindings": wrong})


def test_a_failure_starts_nothing_more_waits_for_those_in_flight_and_names_the_earliest() -> None:
    started: list[int] = []
    ended: list[int] = []

    def work(item: int, _slot: int) -> int:
        started.append(item)
        if item == 1:
            time.sleep(0.05)
            raise ValueError("item 1")
        if item == 2:
            raise KeyError("item 2")
        time.sleep(0.3)  # item 0: still running when 1 and 2 fail
        ended.append(item)
        return item

    with pytest.raises(ValueError, match="item 1"):  # 1 before 2 in item order, though 2 failed first
        run_each(list(range(8)), work, workers=3)
    assert ended == [0], "the item in flight ended before the failure was raised"
    assert sorted(started) == [0, 1, 2], "nothing started after the failure"


def test_after_each_sees_what_is_unfinished() -> None:
    unfinished: list[int] = []
    run_each(list(range(5)), lambda item, _slot: item, workers=2, after_each=lambda _i, _r, n: unfinished.append(n))
    assert sorted(unfinished, reverse=True) == [4, 3, 2, 1, 0]


# --- the driver on Spark ---

BINDINGS = 4


def _pipeline(tmp_path: Path, *, bindings: int = BINDINGS, parallel: int = 3, epochs: int = 3, **transaction: Any) -> Path:
    """``bindings`` bindings, alternately standard (a ``sum``, so loads and a double apply show)
    and delta-updates (appends: a double apply duplicates rows), ``epochs`` one-file epochs each."""
    specs = []
    for b in range(bindings):
        src = tmp_path / "src" / f"b{b}"
        for n in range(epochs):
            write_jsonl(
                src / f"part-{n}.jsonl",
                [{"id": i % 5, "n": n * 100 + i, "v": b + i} for i in range(8)] + [{"_meta": {"op": "d"}, "id": (n + b) % 5}],
            )
        table = tmp_path / "tables" / f"b{b}"
        if b % 2 == 0:
            specs.append(binding(f"b{b}", src, table, max_files=1, reductions={"v": "sum"}))
        else:
            specs.append(binding(f"b{b}", src, table, max_files=1, mode="delta_updates"))
    return write_config(
        tmp_path, specs, pipeline_id=PIPELINE,
        transaction={"max_documents": 1000, "parallel_bindings": parallel, **transaction},
    )


def _epochs(spark: Any, tmp_path: Path, name: str) -> list[int]:
    return [h["tag"]["epoch"] for h in history(spark, TableRef(str(tmp_path / "tables" / name))) if h["tag"]]


def _txn(spark: Any, tmp_path: Path, name: str) -> int | None:
    return table_state(spark, TableRef(str(tmp_path / "tables" / name)), PIPELINE).txn_version


class ThreadsOfApplied(ListCollector):
    """Also records the thread each binding's Applied event was sent from."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[tuple[int, str], str] = {}

    def emit(self, event: Any) -> None:
        super().emit(event)
        if event.kind == "applied":
            self.threads[(event.epoch, event.binding)] = threading.current_thread().name


@pytest.mark.spark
def test_bindings_applied_side_by_side_equal_the_oracle(spark: Any, tmp_path: Path) -> None:
    config_path = _pipeline(tmp_path)
    collector = ThreadsOfApplied()
    summary = Runtime(load_config(config_path), spark, collector).run()
    assert summary.last_epoch == 3
    assert_tables_equal_oracle(spark, config_path)  # Spark and delta-rs
    for b in range(BINDINGS):
        assert _epochs(spark, tmp_path, f"b{b}") == [1, 2, 3], f"b{b}"
    threads = set(collector.threads.values())
    assert len(threads) > 1 and all(t.startswith("materializer-apply") for t in threads), threads
    assert not list((tmp_path / "staging").rglob("*.parquet")), "applied epochs' staged files deleted"


@pytest.mark.spark
def test_an_apply_failure_names_its_binding_and_leaves_the_others_consistent(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_path = _pipeline(tmp_path, pipelined=False)
    config = load_config(config_path)
    real_apply = DeltaWriter.apply

    def apply(self: DeltaWriter, binding: Any, epoch: int, staged: Any) -> Any:
        if binding.name == "b2" and epoch == 2:
            time.sleep(0.5)  # the other threads are mid-MERGE when it fails
            raise ApplyError(f"epoch {epoch}, binding {binding.name}: refused (test)", epoch=epoch, binding=binding.name)
        return real_apply(self, binding, epoch, staged)

    monkeypatch.setattr(DeltaWriter, "apply", apply)
    with pytest.raises(ApplyError, match="binding b2") as failed:
        Runtime(config, spark).run()
    assert failed.value.binding == "b2"
    # Epoch 2 is committed; the failure came after the applies in flight ended, and no binding
    # started after it: every other table records epoch 1 or 2, whole, b2 records 1.
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE).read().last_commit
    assert log is not None and log.epoch == 2
    states = {f"b{b}": _txn(spark, tmp_path, f"b{b}") for b in range(BINDINGS)}
    assert states["b2"] == 1 and set(states.values()) <= {1, 2}, states
    applied_before = {name for name, v in states.items() if v == 2}

    monkeypatch.setattr(DeltaWriter, "apply", real_apply)
    collector = ListCollector()
    summary = Runtime(config, spark, collector).run()
    assert summary.last_epoch == 3
    reapplied = {r.binding: r.status for r in summary.reapplied.results}
    assert {n for n, s in reapplied.items() if s == "skipped"} == applied_before, reapplied
    assert_tables_equal_oracle(spark, config_path)
    for b in range(BINDINGS):
        assert _epochs(spark, tmp_path, f"b{b}") == [1, 2, 3], f"b{b}"


@pytest.mark.spark
def test_a_stage_failure_names_its_binding_and_discards_every_staged_file(spark: Any, tmp_path: Path) -> None:
    config_path = _pipeline(tmp_path, pipelined=False, epochs=2)
    config = load_config(config_path)
    assert Runtime(config, spark).run().last_epoch == 2
    # A third epoch whose b2 rows break a CHECK constraint of its table: refused before the commit.
    spark.sql(f"ALTER TABLE delta.`{tmp_path / 'tables' / 'b2'}` ADD CONSTRAINT small CHECK (v < 1000)")
    for b in range(BINDINGS):
        write_jsonl(tmp_path / "src" / f"b{b}" / "part-2.jsonl", [{"id": 1, "n": 1, "v": 5000 if b == 2 else 1}])
    with pytest.raises(SourceError, match="binding b2"):
        Runtime(config, spark).run()
    assert RecoveryLog(open_store(config.recovery_log), PIPELINE).read().last_commit.epoch == 2  # type: ignore[union-attr]
    assert not list((tmp_path / "staging").rglob("*.parquet")), "the other bindings' staged files are discarded"
    for b in range(BINDINGS):
        assert _txn(spark, tmp_path, f"b{b}") == 2


@pytest.mark.spark
def test_a_crash_between_tables_reapplies_only_the_others(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two threads, four bindings: the crash fires when the first table of epoch 2 is applied; the
    # other one in flight ends (in process nothing kills it; a real crash may leave it mid-MERGE,
    # as mid-apply does), the last two never start.
    config_path = _pipeline(tmp_path, bindings=4, parallel=2, pipelined=False)
    config = load_config(config_path)
    killed = InProcessCrash(monkeypatch, "after-apply:2")
    first = ListCollector()
    frozen = killed.run(lambda: Runtime(config, spark, first).run())
    try:
        deadline = time.monotonic() + 120
        while len([e for e in first.named("applied") if e["epoch"] == 2]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        applied = {e["binding"] for e in first.named("applied") if e["epoch"] == 2}
        assert applied == {"b0", "b1"}, applied  # the two started first, in binding order
        assert {f"b{b}": _txn(spark, tmp_path, f"b{b}") for b in range(4)} == {"b0": 2, "b1": 2, "b2": 1, "b3": 1}

        killed.disarm()
        summary = Runtime(config, spark).run()
        assert summary.last_epoch == 3
        assert {r.binding: r.status for r in summary.reapplied.results} == {
            "b0": "skipped", "b1": "skipped", "b2": "applied", "b3": "applied",
        }
        assert_tables_equal_oracle(spark, config_path)
        for b in range(4):
            assert _epochs(spark, tmp_path, f"b{b}") == [1, 2, 3], f"b{b}"
    finally:
        killed.thaw()
        frozen.join(timeout=120)
