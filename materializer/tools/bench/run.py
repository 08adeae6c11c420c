"""The benchmark's run: a warm-up, then per configuration the inputs, every path, the row counts
that prove the paths agree, and the report written after each configuration."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from materializer.tools.bench.inputs import copy_table, generate_collection, produce_topic, seed_table
from materializer.tools.bench.measurement import MemorySampler
from materializer.tools.bench.options import BenchOptions, session
from materializer.tools.bench.paths import BareSteps, OursSteps, PeerSteps, run_bare, run_ours, run_peer, run_recovery, run_replay
from materializer.tools.bench.report import chart, figures, goals, machine, write_json, write_with_chart

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _count(spark: "SparkSession", table: Path) -> int:
    return int(spark.read.format("delta").load(str(table)).count())


def bench_config(
    spark: "SparkSession",
    root: Path,
    table_rows: int,
    epoch_rows: int,
    options: BenchOptions,
    sampler: MemorySampler | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    name = f"t{table_rows}-e{epoch_rows}"
    work = root / name
    work.mkdir(parents=True)
    result: dict[str, Any] = {"name": name, "table_rows": table_rows, "epoch_rows": epoch_rows, "epochs": options.epochs}

    @contextmanager
    def phase(label: str) -> Iterator[None]:
        say(f"[{name}] {label} …")
        t0 = time.monotonic()
        if sampler is not None:
            with sampler.phase(f"{name}/{label}"):
                yield
        else:
            yield
        say(f"[{name}] {label}: {time.monotonic() - t0:.1f}s")

    with phase("generate"):
        collection = generate_collection(
            work / "source",
            table_rows,
            epoch_rows,
            options.epochs,
            (options.insert_ratio, options.update_ratio, options.delete_ratio),
            options.seed,
            options.one_row_epoch,
        )
    result["generate_seconds"] = collection.seconds
    result["input_bytes"] = sum(p.stat().st_size for p in collection.files)
    with phase("seed"):
        seed = work / "seed"
        result["seed_seconds"] = seed_table(spark, seed, table_rows, options.deletion_vectors)
        for approach in ("ours", "bare", "peer"):
            copy_table(seed, work / approach / "table")

    kafka = None
    topic = None
    if options.kafka:
        copy_table(seed, work / "kafka" / "table")
        topic = f"materializer-bench-{root.parent.name}-{name}"
        with phase("kafka: produce"):
            result["kafka_produce_seconds"] = produce_topic(options.kafka, topic, options.kafka_partitions, collection.files)
    if options.interleave:
        # Epoch by epoch, every path in turn, the order turned each epoch: a slow spell of the
        # machine, or what one path leaves in the JVM's heap, falls on all of them alike.
        steppers: list[Any] = [BareSteps(spark, work / "bare", work / "bare" / "table")]
        steppers.append(OursSteps(spark, work / "ours", work / "source", work / "ours" / "table", epoch_rows, options))
        if topic is not None:
            steppers.append(OursSteps(spark, work / "kafka", work / "source", work / "kafka" / "table", epoch_rows, options, topic=topic))
        if options.peer:
            steppers.append(PeerSteps(spark, work / "peer", work / "peer" / "table"))
        result["order"] = []
        for index, path in enumerate(collection.files, start=1):
            turn = (index - 1) % len(steppers)
            result["order"].append([s.name for s in steppers[turn:] + steppers[:turn]])
            for stepper in steppers[turn:] + steppers[:turn]:
                with phase(f"{stepper.name}, epoch {index}"):
                    stepper.step(index, path)
        results = {s.name: s.result() for s in steppers}
        bare, ours = results["bare"], results["ours"]
        kafka, peer = results.get("kafka"), results.get("peer")
    else:
        with phase("bare"):
            bare = run_bare(spark, work / "bare", collection.files, work / "bare" / "table")
        with phase("ours"):
            ours = run_ours(spark, work / "ours", work / "source", work / "ours" / "table", epoch_rows, options)
        if topic is not None:
            with phase("kafka"):
                kafka = run_ours(spark, work / "kafka", work / "source", work / "kafka" / "table", epoch_rows, options, topic=topic)
        peer = None
        if options.peer:
            with phase("peer"):
                peer = run_peer(spark, work / "peer", work / "source", work / "peer" / "table")
    cfg = ours.pop("config")
    if kafka is not None:
        kafka.pop("config")
    replay = None
    if options.replay:
        with phase("replay"):
            replay = run_replay(spark, cfg)
    recovery = None
    if options.recovery:
        with phase("recovery"):
            recovery = run_recovery(work / "recovery", seed, collection.files[0], epoch_rows, options, sampler, f"{name}/")

    # Every approach must leave the table the generator predicts, or the timings compare nothing.
    counts = {"expected": collection.alive}
    counts["ours"] = _count(spark, work / "ours" / "table")
    counts["bare"] = _count(spark, work / "bare" / "table")
    if peer is not None:
        counts["peer"] = _count(spark, work / "peer" / "table")
    if kafka is not None:
        counts["kafka"] = _count(spark, work / "kafka" / "table")
    if recovery is not None:
        recovery["table_rows_after"] = _count(spark, Path(recovery.pop("_table")))
        # The recovery run applies only epoch 1 (kept separate: its expected count is not the final one).
    result["row_counts"] = counts
    result["tables_agree"] = all(v == counts["expected"] for v in counts.values())

    figures(
        result,
        ours=ours,
        bare=bare,
        peer=peer,
        kafka=kafka,
        replay=replay,
        recovery=recovery,
        big=options.epochs,
        kafka_partitions=options.kafka_partitions,
    )
    if sampler is not None:
        result["memory"] = {k.split("/", 1)[1]: v for k, v in sampler.peaks.items() if k.startswith(name + "/")}
    return result


WARMUP_ROWS = 100_000
"""The warm-up's epoch (at most the run's): rows enough for the JIT to see every path's per-row
loops. With 200 the first big epoch cost the path that ran first 4-6 CPU s more than its others;
the one run with 100,000 so far (2026-11-28) still showed every path's first big epoch 2-5 CPU s
above its others, so that is not all the warm-up's to remove."""


def warmup_rows(options: BenchOptions) -> int:
    return min(WARMUP_ROWS, min(options.epoch_rows))


def warmup(spark: "SparkSession", work: Path, options: BenchOptions) -> float:
    """Every path once on a small table; nothing of it is reported but its duration."""
    started = time.monotonic()
    rows = warmup_rows(options)
    collection = generate_collection(work / "source", max(rows, 2_000), rows, 1, (0.5, 0.4, 0.1), options.seed)
    seed_table(spark, work / "seed", max(rows, 2_000), options.deletion_vectors)
    for approach in ("ours", "bare", "peer"):
        copy_table(work / "seed", work / approach / "table")
    run_bare(spark, work / "bare", collection.files, work / "bare" / "table")
    run_ours(spark, work / "ours", work / "source", work / "ours" / "table", rows, options)
    if options.peer:
        run_peer(spark, work / "peer", work / "source", work / "peer" / "table")
    shutil.rmtree(work, ignore_errors=True)
    return time.monotonic() - started


def run_bench(
    options: BenchOptions, spark: "SparkSession | None" = None, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every configuration; write ``report.json`` and ``bench.png`` under a new run folder."""
    say = say or (lambda _msg: None)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    root = Path(options.out).resolve() / stamp
    root.mkdir(parents=True, exist_ok=False)
    sampler = MemorySampler().start()
    started = time.monotonic()
    report: dict[str, Any] = {
        "started_at": stamp,
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "machine": machine(),
        "configs": [],
    }
    try:
        with sampler.phase("session"):
            t0 = time.monotonic()
            spark = spark or session(options)
            report["session_seconds"] = time.monotonic() - t0
        if options.warmup:
            say(f"warm-up (every path once, {warmup_rows(options):,} documents) …")
            with sampler.phase("warmup"):
                report["warmup_seconds"] = warmup(spark, root / "data" / "warmup", options)
            say(f"warm-up: {report['warmup_seconds']:.1f}s")
        for table_rows in options.table_rows:
            for epoch_rows in options.epoch_rows:
                result = bench_config(spark, root / "data", table_rows, epoch_rows, options, sampler, say)
                report["configs"].append(result)
                # Written after every configuration, so a long full run that is cut short keeps its figures.
                write_json(root, report)
                if not options.keep_data:
                    shutil.rmtree(root / "data" / result["name"], ignore_errors=True)
    finally:
        sampler.stop()
    report["seconds"] = time.monotonic() - started
    report["machine"]["load_average_end"] = list(os.getloadavg())
    report["peak_memory"] = {
        kind: max((v[kind] for k, v in sampler.peaks.items() if "recovery-" not in k), default=0)
        for kind in ("python_rss", "jvm_rss")
    }
    report["goals"] = goals(report["configs"])
    write_json(root, report)
    write_with_chart(root, report, "bench.png", chart, say)
    if not options.keep_data:
        shutil.rmtree(root / "data", ignore_errors=True)
    return report
