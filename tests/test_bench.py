"""The benchmark's machinery at a tiny size: the report has its fields and its figures are sane.

Timings are not asserted against the goals (the benchmark reports those); only that they exist,
are positive, and that the ratios are computed from them. The kill-and-restart measurement starts
two extra JVMs and is left to ``materializer bench`` itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from materializer.tools.bench import BenchOptions, epoch_phases, generate_collection, summary_table


def test_generator_writes_distinct_keys_per_epoch_and_predicts_the_table(tmp_path: Path) -> None:
    collection = generate_collection(tmp_path, table_rows=100, epoch_rows=20, epochs=2, ratios=(0.5, 0.3, 0.2), seed=1)
    assert [p.name for p in collection.files] == ["epoch-000001.jsonl", "epoch-000002.jsonl", "epoch-000003.jsonl"]
    alive = set(range(100))
    for path in collection.files:
        docs = [json.loads(line) for line in path.read_text().splitlines()]
        keys = [d["id"] for d in docs]
        assert len(keys) == len(set(keys)), "keys repeat within an epoch"
        for doc in docs:
            if doc.get("_meta", {}).get("op") == "d":
                assert doc["id"] in alive, "a delete of a key that is not there"
                alive.discard(doc["id"])
            else:
                alive.add(doc["id"])
    assert [len(p.read_text().splitlines()) for p in collection.files] == [20, 20, 1]
    assert collection.alive == len(alive) == 100 + 2 * 10 - 2 * 4
    # The streaming file source orders by modification time: it must follow the names.
    mtimes = [p.stat().st_mtime for p in collection.files]
    assert mtimes == sorted(mtimes)


def test_epoch_phases_split_each_epoch_at_the_runtime_events() -> None:
    events = [
        (0.0, "opened", {}),
        (1.0, "read", {"epoch": 1, "documents": 5}),
        (3.0, "committed", {"epoch": 1}),
        (7.0, "acknowledged", {"epoch": 1, "first": False}),
        (7.5, "read", {"epoch": 2, "documents": 1}),
        (8.0, "committed", {"epoch": 2}),
        (9.0, "acknowledged", {"epoch": 2, "first": False}),
    ]
    phases = epoch_phases(events)
    assert [(p["epoch"], p["read"], p["stage"], p["apply"], p["total"]) for p in phases] == [
        (1, 1.0, 2.0, 4.0, 7.0),
        (2, 0.5, 0.5, 1.0, 2.0),
    ]


def test_epoch_phases_carry_the_python_and_jvm_cpu_seconds_of_each_epoch() -> None:
    from materializer.events import Opened
    from materializer.tools.bench import TimingCollector

    events = [
        (0.0, "opened", {}),
        (1.0, "read", {"epoch": 1, "documents": 5}),
        (3.0, "committed", {"epoch": 1}),
        (7.0, "acknowledged", {"epoch": 1, "first": False}),
        (7.5, "read", {"epoch": 2, "documents": 1}),
        (8.0, "committed", {"epoch": 2}),
        (9.0, "acknowledged", {"epoch": 2, "first": False}),
    ]
    cpu = [(1.0, 10.0), (1.1, 11.0), (1.2, 15.0), (1.5, 20.0), (1.5, 20.0), (1.6, 21.0), (1.75, 24.0)]
    phases = epoch_phases(events, cpu)
    assert [(p["python_cpu"], p["jvm_cpu"]) for p in phases] == [(0.5, 10.0), (0.25, 4.0)]
    collector = TimingCollector()
    collector.emit(Opened(pipeline="p", epoch=0, writer="w"))
    python, jvm, workers = collector.cpu[0]
    assert python > 0 and jvm >= 0 and workers >= 0  # measured from the process, not made up
    # With the Python workers' figures, each epoch gets theirs too.
    three = [(p, j, j / 10) for p, j in cpu]
    assert [p["worker_cpu"] for p in epoch_phases(events, three)] == [pytest.approx(1.0), pytest.approx(0.4)]


def test_cpu_per_epoch_is_the_big_epochs_total_over_their_count_not_a_median() -> None:
    # Ours pipelines: epoch 1's interval holds epoch 2's staging, the last big epoch's only its
    # apply. The median (19) would leave out a third of what the run cost; the one-row epoch (4)
    # is not a big epoch.
    from materializer.tools.bench.report import _cpu, _cpu_total

    epochs = [
        {"epoch": 1, "python_cpu": 1.0, "jvm_cpu": 33.0},
        {"epoch": 2, "python_cpu": 0.5, "jvm_cpu": 18.5},
        {"epoch": 3, "python_cpu": 0.5, "jvm_cpu": 8.5},
        {"epoch": 4, "python_cpu": 0.2, "jvm_cpu": 4.0},
    ]
    block = _cpu(epochs, big=3)
    assert block == {"python_cpu_seconds_per_epoch": pytest.approx(2.0 / 3), "jvm_cpu_seconds_per_epoch": pytest.approx(20.0)}
    assert _cpu_total(block) == pytest.approx(62.0 / 3)
    assert _cpu([{"epoch": 1}], big=1) == {"python_cpu_seconds_per_epoch": None, "jvm_cpu_seconds_per_epoch": None}
    # Spark's Python workers count in the total (issue #25): moving work to them is not free.
    workers = [{**e, "worker_cpu": 3.0} for e in epochs]
    assert _cpu_total(_cpu(workers, big=3)) == pytest.approx(62.0 / 3 + 3.0)


def test_cpu_seconds_count_the_jvms_children_alive_and_exited(tmp_path: Path) -> None:
    # A stand-in for the JVM (a process named java) whose child burns CPU and exits, as a Spark
    # Python worker does, under a parent that ignores SIGCHLD as pyspark.daemon does (the kernel
    # then discards the child's times): its seconds must show as the workers', not vanish with it.
    import os
    import subprocess
    import sys

    from materializer.tools.bench import cpu_seconds

    java = tmp_path / "java"
    os.symlink(sys.executable, java)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass\n"
    parent = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
        f"child = subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
        "while child.poll() is None: time.sleep(0.05)\n"
        "print('done', flush=True)\n"
        "time.sleep(30)\n"
    )
    before = cpu_seconds()
    fake = subprocess.Popen([str(java), "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == "done"
        after = cpu_seconds()
        assert after[2] - before[2] >= 0.5, (before, after)
        assert cpu_seconds()[2] >= after[2]  # never falls: an exited worker keeps its last reading
    finally:
        fake.kill()
        fake.wait()


def test_the_samplers_own_cpu_is_not_charged_to_the_drivers_python() -> None:
    # The memory sampler reads the process tree five times a second for the whole bench: its CPU
    # grows with an epoch's wall time and is the bench's, not the pipeline's. Here it samples as
    # fast as it can while the main thread does nothing: the driver's figure must stay near zero.
    import time

    from materializer.tools.bench import MemorySampler, cpu_seconds
    from materializer.tools.bench.measurement import OWN_CPU

    sampler = MemorySampler(interval=0.0005)
    own_before = OWN_CPU.seconds
    before = cpu_seconds()
    with sampler.start().phase("idle"):
        time.sleep(1.5)
    sampler.stop()
    after = cpu_seconds()
    spent = OWN_CPU.seconds - own_before
    assert spent >= 0.1, f"the sampler used {spent:.3f} s: too little to tell"
    assert after[0] - before[0] < 0.25 * spent, (before, after, spent)


def test_epoch_phases_of_a_pipelined_run_overlap_the_read_with_the_apply() -> None:
    # Epoch 2 is read (3.0 -> 4.0) while epoch 1 is applied (3.0 -> 7.0); its total is what it
    # adds to the run: from epoch 1's Acknowledged to its own.
    events = [
        (0.0, "opened", {}),
        (1.0, "read", {"epoch": 1, "documents": 5}),
        (3.0, "committed", {"epoch": 1}),
        (4.0, "read", {"epoch": 2, "documents": 5}),
        (7.0, "acknowledged", {"epoch": 1, "first": False}),
        (8.0, "committed", {"epoch": 2}),
        (9.0, "acknowledged", {"epoch": 2, "first": False}),
    ]
    phases = epoch_phases(events)
    assert [(p["epoch"], p["read"], p["stage"], p["apply"], p["total"]) for p in phases] == [
        (1, 1.0, 2.0, 4.0, 7.0),
        (2, 1.0, 4.0, 1.0, 2.0),
    ]


def test_ratios_must_add_to_one() -> None:
    with pytest.raises(ValueError):
        BenchOptions(insert_ratio=0.5, update_ratio=0.5, delete_ratio=0.5)


@pytest.mark.spark
def test_bench_at_a_tiny_size_writes_a_sane_report(spark: object, tmp_path: Path) -> None:
    from materializer.tools.bench import run_bench

    options = BenchOptions(
        table_rows=[500],
        epoch_rows=[100],
        epochs=2,
        out=tmp_path,
        recovery=False,  # two JVM start-ups: measured by `materializer bench`, too slow here
        one_row_epoch=False,  # halves the Spark work; its figure is then reported as missing
        warmup=False,
        mode="test",
    )
    report = run_bench(options, spark=spark)  # type: ignore[arg-type]

    on_disk = json.loads(Path(report["paths"]["json"]).read_text())
    assert Path(report["paths"]["chart"]).stat().st_size > 0
    assert {"machine", "options", "configs", "goals", "peak_memory", "seconds"} <= set(on_disk)
    (config,) = on_disk["configs"]
    assert config["tables_agree"], config["row_counts"]
    assert config["row_counts"]["expected"] == 500 + 2 * (50 - 10)
    # Interleaved (the default): epoch by epoch, every path in turn, the order turned each epoch.
    assert config["order"] == [["bare", "ours", "peer"], ["ours", "peer", "bare"]]

    ours, bare, peer = config["ours"], config["bare"], config["peer"]
    for block, parts in ((ours, ("read", "stage", "apply", "total")), (bare, ("stage", "merge", "total")), (peer, ("total",))):
        for part in parts:
            assert block[f"median_{part}_seconds"] > 0, (part, block)
        assert block["one_row_seconds"] is None
        assert block["rows_per_second"] == pytest.approx(100 / block["median_total_seconds"])
        # Two big epochs: a mean of two (the median of an even count), and per-epoch CPU the same way.
        assert block["median_total_seconds"] == pytest.approx(sum(e["total"] for e in block["epochs"]) / 2)
    assert [e["epoch"] for e in ours["epochs"]] == [e["epoch"] for e in bare["epochs"]] == [e["epoch"] for e in peer["epochs"]] == [1, 2]
    assert all(e["jvm_cpu"] > 0 for block in (ours, bare, peer) for e in block["epochs"])
    assert ours["median_total_seconds"] == pytest.approx(
        ours["median_read_seconds"] + ours["median_stage_seconds"] + ours["median_apply_seconds"]
    )
    assert ours["epochs"][0]["spark_jobs"] > 0
    assert any(step.startswith("apply: MERGE") for step in ours["steps"])

    ratios = config["ratios"]
    assert ratios["ours_over_bare"] == pytest.approx(ours["median_total_seconds"] / bare["median_total_seconds"])
    assert ratios["ours_apply_over_bare_merge"] == pytest.approx(ours["median_apply_seconds"] / bare["median_merge_seconds"])
    assert ratios["ours_over_peer"] == pytest.approx(ours["median_total_seconds"] / peer["median_total_seconds"])

    replay = config["replay"]
    assert replay["statuses"] == ["skipped"] and replay["epoch"] == 2
    assert 0 < replay["reapply_seconds"] < replay["run_seconds"] + 1e-9
    assert on_disk["peak_memory"]["python_rss"] > 0 and on_disk["peak_memory"]["jvm_rss"] > 0
    assert {g["goal"] for g in on_disk["goals"]} >= {"replayed epoch < 1 s"}

    header, rows = summary_table(on_disk)
    assert header == ["figure", config["name"]] and all(len(r) == 2 for r in rows)


@pytest.mark.slow
def test_freshness_bench_times_each_change_from_its_file_to_its_rows(spark: Any, tmp_path: Path) -> None:
    # Follow mode in this process, three one-document changes written one at a time (the first a
    # warm-up): each is timed from its file's rename to its epoch's Acknowledged, and its parts add up.
    from materializer.tools.bench_freshness import FreshnessOptions, run_bench_freshness, summary_lines

    from tests.helpers import delta_rs_list

    options = FreshnessOptions(changes=2, warmup=1, poll=0.2, pause=0.2, out=tmp_path / "out", keep_data=True, timeout=120)
    report = run_bench_freshness(options, say=lambda _m: None, spark=spark)
    changes = report["changes"]
    assert [c["change"] for c in changes] == [0, 1, 2]
    epochs = [c["epoch"] for c in changes]
    assert epochs == sorted(set(epochs)), f"one epoch per change: {epochs}"
    for change in changes:
        assert change["apply"] > 0 and change["read_to_commit"] > 0, change
        parts = change["wait"] + change["read_to_commit"] + change["apply"]
        assert abs(parts - change["freshness"]) < 0.05, change
    summary = report["summary"]
    assert summary["p50"] > 0 and summary["max"] >= summary["p50"]
    assert summary["poll_interval_seconds"] == 0.2
    assert "p50" in summary_lines(report)[0]
    # Each change's rows are in the table when it is reported applied: the last values of each key.
    rows = {r["id"]: r["n"] for r in delta_rs_list(tmp_path / "out" / "run" / "tables" / "changes")}
    assert rows == {0: 0, 1: 1, 2: 2}


@pytest.mark.slow
def test_bindings_bench_times_the_peer_floor_on_the_same_rows(spark: Any, tmp_path: Path) -> None:
    # The floor under an epoch of N bindings: one hand-written MERGE per table of the same files.
    # It must do the same work as ours: its tables hold exactly ours' rows.
    from materializer.tools.bench_bindings import BindingsOptions, run_bench_bindings, summary_lines

    from tests.helpers import delta_rs_list

    options = BindingsOptions(bindings=[1, 2], rows=6, epochs=2, parallel=2, sequential=False, peer=True, out=tmp_path, keep_data=True)
    report = run_bench_bindings(options, say=lambda _m: None, spark=spark)
    modes = [(r["bindings"], r["mode"], r["parallel_bindings"]) for r in report["runs"]]
    assert modes == [(1, "parallel", 2), (1, "peer", 2), (2, "parallel", 2), (2, "peer", 2)], modes
    assert all(r["epoch_wall"] > 0 and r["epoch_cpu"] > 0 for r in report["runs"])
    for index in range(2):
        ours = delta_rs_list(tmp_path / "run-2-parallel" / "tables" / f"b{index:03d}")
        peer = delta_rs_list(tmp_path / "peer-2-2" / f"t{index:03d}")
        assert ours and sorted(ours, key=lambda r: r["id"]) == sorted(peer, key=lambda r: r["id"])
    assert any(line.startswith("       1       peer") for line in summary_lines(report))
    each = report["per_table"]
    two, one = (next(r for r in report["runs"] if r["bindings"] == n and r["mode"] == "parallel") for n in (2, 1))
    assert each["wall"] == round(two["epoch_wall"] - one["epoch_wall"], 3)
    assert any(line.startswith("each binding beyond 1 (to 2):") for line in summary_lines(report))


def test_the_job_counter_costs_the_same_however_many_jobs_ran(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``next_job_id`` counts a step's Spark jobs; reading the job groups' whole lists, it cost a
    py4j call per job the session had run (charged to ours' driver and JVM), so it must cost a few
    calls however many jobs ran, and still count every job."""
    import py4j.clientserver

    from materializer.tools.bench.measurement import JOB_GROUPS, next_job_id

    context = spark.sparkContext  # type: ignore[attr-defined]
    context.setJobGroup(JOB_GROUPS[0], "the job counter's test")
    try:
        for _ in range(30):
            spark.range(2).collect()  # type: ignore[attr-defined]
        before = next_job_id(spark)  # type: ignore[arg-type]
        sent: list[str] = []
        original = py4j.clientserver.ClientServerConnection.send_command

        def counted(self: Any, command: str) -> Any:
            sent.append(command)
            return original(self, command)

        spark.range(2).collect()  # type: ignore[attr-defined]
        monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted)
        after = next_job_id(spark)  # type: ignore[arg-type]
        monkeypatch.undo()
        deadline = time.monotonic() + 10  # the status tracker hears of a job from the listener bus
        while (after or 0) < (before or 0) + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
            after = next_job_id(spark)  # type: ignore[arg-type]
    finally:
        context.setJobGroup(None, None)  # type: ignore[arg-type]
    assert before is not None and after is not None and after >= before + 1
    assert len(sent) <= 8, f"{len(sent)} py4j commands for one search after {before} jobs"
