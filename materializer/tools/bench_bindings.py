"""``materializer bench --bindings N``: the cost of an epoch as the bindings grow (issue 32).

For each N (default 1, 16 and 64) the bench writes N small document collections (``documents``
source, one JSON Lines file per epoch of ``rows`` documents, ``source.max_files: 1``, so each
epoch takes one file of every binding), then runs the materializer end to end in this process
(``Runtime(config, spark).run()``) twice on fresh state: with the bindings side by side
(``transaction.parallel_bindings`` = ``parallel``, ``auto`` when not given) and, when that is more
than one thread, one after another (``parallel_bindings: 1``, the order before issue 32). Per run: the wall seconds and CPU seconds (this Python process, the
Spark JVM and its Python workers: :func:`materializer.tools.bench.cpu_seconds`) of each epoch,
from one Acknowledged to the next (the first epoch includes Open and the tables' creation, so the
figure reported is the median of the later epochs), and the Spark jobs of the whole run.

With ``peer`` it also times the floor under those epochs: the same files, one hand-written Delta
MERGE per table per epoch, one table at a time and ``parallel`` at a time (:func:`run_peer`).

The goal it checks: an epoch of 64 bindings of 100 rows costs at most 8 times an epoch of one.
On a shared machine wall time is noisy: the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from materializer import events
from materializer.events import Collector, Event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GOAL_BINDINGS = 64
GOAL_RATIO = 8.0
"""An epoch of GOAL_BINDINGS small bindings costs at most GOAL_RATIO times an epoch of one."""
FLEET = 200
"""The fleet the per-table figure is carried to: a database's tables, one binding each."""


@dataclass
class BindingsOptions:
    bindings: list[int] = field(default_factory=lambda: [1, 16, 64])
    """The numbers of bindings to measure."""
    rows: int = 100
    """Documents per binding per epoch."""
    epochs: int = 3
    parallel: int | None = None
    """``transaction.parallel_bindings`` of the side-by-side runs (None: the configuration's default)."""
    sequential: bool = True
    """Also run each N with ``parallel_bindings: 1``."""
    peer: bool = False
    """Also time the floor: the same epochs as one hand-written MERGE per table (:func:`run_peer`)."""
    pipelined: bool = True
    out: Path = Path(".bench-bindings")
    master: str = "local[*]"
    conf: dict[str, str] = field(default_factory=dict)
    keep_data: bool = False


class EpochClock(Collector):
    """Wall and CPU seconds at the run's start and at each Acknowledged."""

    def __init__(self) -> None:
        from materializer.tools.bench import cpu_seconds

        self._cpu = cpu_seconds
        self.marks: list[tuple[int, float, tuple[float, float, float]]] = [(0, time.monotonic(), cpu_seconds())]

    def emit(self, event: Event) -> None:
        if isinstance(event, events.Acknowledged):
            self.marks.append((event.epoch, time.monotonic(), self._cpu()))

    def epochs(self) -> list[dict[str, Any]]:
        out = []
        for (_e0, t0, c0), (epoch, t1, c1) in zip(self.marks, self.marks[1:]):
            python, jvm, workers = (b - a for a, b in zip(c0, c1))
            out.append({
                "epoch": epoch, "wall": round(t1 - t0, 3), "cpu_python": round(python, 3), "cpu_jvm": round(jvm, 3),
                "cpu_workers": round(workers, 3), "cpu": round(python + jvm + workers, 3),
            })
        return out


def write_collections(root: Path, bindings: int, epochs: int, rows: int) -> list[Path]:
    """``bindings`` folders of ``epochs`` files of ``rows`` documents (ids repeat across epochs: updates)."""
    folders = []
    for b in range(bindings):
        folder = root / f"src-{b:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for e in range(epochs):
            with open(folder / f"part-{e:04d}.jsonl", "w") as handle:
                for i in range(rows):
                    key = (e * rows // 2 + i) % (rows * 2)  # half updates, half inserts after the first epoch
                    handle.write(json.dumps({"id": key, "name": f"n{b}-{e}-{i}", "amount": float(i), "epoch": e}) + "\n")
        folders.append(folder)
    return folders


def pipeline_config(work: Path, sources: list[Path], parallel: int | None, pipelined: bool, epochs: int) -> Any:
    from materializer.config import PipelineConfig

    transaction: dict[str, Any] = {"pipelined": pipelined}
    if parallel is not None:
        transaction["parallel_bindings"] = parallel
    return PipelineConfig.model_validate({
        "pipeline_id": "bench-bindings",
        "recovery_log": str(work / "log"),
        "staging": str(work / "staging"),
        "transaction": transaction,
        "bindings": [
            {
                "name": f"b{index:03d}",
                "source": {
                    "format": "documents", "path": str(src), "max_files": 1,
                    "schema": "id BIGINT, name STRING, amount DOUBLE, epoch BIGINT",
                },
                "table": str(work / "tables" / f"b{index:03d}"),
                "key": ["id"],
            }
            for index, src in enumerate(sources)
        ],
    })


def run_one(
    spark: "SparkSession", root: Path, sources: list[Path], parallel: int | None, options: BindingsOptions, label: str = "parallel"
) -> dict[str, Any]:
    """One run of the pipeline over ``sources``: ``label`` "parallel" is the configured thread count
    (``parallel``; None: ``auto``), "sequential" the run one binding at a time beside it."""
    from materializer.runtime import Runtime
    from materializer.side_by_side import workers_for
    from materializer.spark import is_connect
    from materializer.tools.bench import next_job_id

    work = root / f"run-{len(sources)}-{label}"
    shutil.rmtree(work, ignore_errors=True)
    config = pipeline_config(work, sources, parallel, options.pipelined, options.epochs)
    clock = EpochClock()
    jobs0 = next_job_id(spark)
    began = time.monotonic()
    summary = Runtime(config, spark, clock).run()
    wall = time.monotonic() - began
    jobs1 = next_job_id(spark)
    epochs = clock.epochs()
    later = epochs[1:] or epochs
    if not options.keep_data:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "bindings": len(sources),
        "mode": label,
        "parallel_bindings": workers_for(config.transaction.parallel_bindings, connect=is_connect(spark)),
        "last_epoch": summary.last_epoch,
        "run_wall": round(wall, 3),
        "spark_jobs": (jobs1 - jobs0) if jobs0 is not None and jobs1 is not None else None,
        "epoch_wall": round(statistics.median(e["wall"] for e in later), 3),
        "epoch_cpu": round(statistics.median(e["cpu"] for e in later), 3),
        "epochs": epochs,
    }


def run_bench_bindings(options: BindingsOptions, say: Callable[[str], None] = print, spark: "SparkSession | None" = None) -> dict[str, Any]:
    from materializer.side_by_side import workers_for
    from materializer.spark import is_connect, session_for

    if spark is None:
        spark = session_for(options.master, {"spark.driver.memory": "2g", **options.conf}, app_name="materializer-bench")
    root = options.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    # A warm-up (JIT, Delta's classes): one binding, not reported.
    say("warm-up: 1 binding")
    run_one(spark, root / "warmup", write_collections(root / "warmup" / "src", 1, 2, options.rows), options.parallel, options)
    # transaction.parallel_bindings' default (auto) resolved as the runs will: one run per thread count.
    side_by_side = workers_for(options.parallel or "auto", connect=is_connect(spark))
    for n in options.bindings:
        sources = write_collections(root / f"src-{n}", n, options.epochs, options.rows)
        modes = [("parallel", side_by_side)] + ([("sequential", 1)] if options.sequential and n > 1 and side_by_side > 1 else [])
        for label, parallel in modes:
            result = run_one(spark, root, sources, parallel, options, label)
            runs.append(result)
            say(
                f"{n} bindings, {result['mode']} (parallel_bindings {result['parallel_bindings']}): epoch "
                f"{result['epoch_wall']:.1f} s wall, {result['epoch_cpu']:.1f} s CPU; run {result['run_wall']:.1f} s, "
                f"{result['spark_jobs']} Spark jobs"
            )
        if options.peer:
            for threads in sorted({1, side_by_side}) if options.sequential else [side_by_side]:
                result = run_peer(spark, root, sources, threads, options)
                runs.append(result)
                say(f"{n} tables, peer ({threads} thread(s)): epoch {result['epoch_wall']:.1f} s wall, {result['epoch_cpu']:.1f} s CPU")
        if not options.keep_data:
            shutil.rmtree(root / f"src-{n}", ignore_errors=True)
    report = {"options": {k: str(v) if isinstance(v, Path) else v for k, v in options.__dict__.items()}, "runs": runs, "goal": goal(runs), "per_table": per_table(runs)}
    (root / "bindings-report.json").write_text(json.dumps(report, indent=2))
    return report


def run_peer(spark: "SparkSession", root: Path, sources: list[Path], threads: int, options: BindingsOptions) -> dict[str, Any]:
    """The floor under an epoch of N bindings: the same files, each epoch one hand-written Delta
    MERGE per table (the file read with the schema, keys kept as the source has them: ids are
    distinct within a file), ``threads`` tables at a time. No staging, no recovery log, no txn
    ids, no checks: what any pipeline that MERGEs each table costs at least."""
    from concurrent.futures import ThreadPoolExecutor

    from materializer.tools.bench import cpu_seconds

    work = root / f"peer-{len(sources)}-{threads}"
    shutil.rmtree(work, ignore_errors=True)
    schema = "id BIGINT, name STRING, amount DOUBLE, epoch BIGINT"
    tables = [work / f"t{i:03d}" for i in range(len(sources))]
    for table in tables:
        spark.sql(f"CREATE TABLE delta.`{table}` ({schema}) USING delta TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")

    def merge(index: int, epoch: int) -> None:
        rows = spark.read.schema(schema).json(str(sources[index] / f"part-{epoch:04d}.jsonl"))
        view = f"peer_{index}_{epoch}"
        rows.createOrReplaceTempView(view)
        spark.sql(
            f"MERGE INTO delta.`{tables[index]}` t USING {view} s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ).collect()
        spark.catalog.dropTempView(view)

    marks = [(time.monotonic(), cpu_seconds())]
    for epoch in range(options.epochs):
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i, e=epoch: merge(i, e), range(len(sources))))
        marks.append((time.monotonic(), cpu_seconds()))
    epochs = []
    for (t0, c0), (t1, c1) in zip(marks, marks[1:]):
        epochs.append({"wall": round(t1 - t0, 3), "cpu": round(sum(b - a for a, b in zip(c0, c1)), 3)})
    later = epochs[1:] or epochs
    if not options.keep_data:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "bindings": len(sources), "mode": "peer", "parallel_bindings": threads, "last_epoch": options.epochs,
        "run_wall": round(marks[-1][0] - marks[0][0], 3), "spark_jobs": None,
        "epoch_wall": round(statistics.median(e["wall"] for e in later), 3),
        "epoch_cpu": round(statistics.median(e["cpu"] for e in later), 3),
        "epochs": epochs,
    }


def goal(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Epoch of GOAL_BINDINGS bindings (side by side) over the epoch of one, wall and CPU."""
    one = next((r for r in runs if r["bindings"] == 1 and r["mode"] != "peer"), None)
    many = next((r for r in runs if r["bindings"] == GOAL_BINDINGS and r["mode"] == "parallel"), None)
    if one is None or many is None:
        return {"measured": False}
    wall = many["epoch_wall"] / one["epoch_wall"] if one["epoch_wall"] else None
    cpu = many["epoch_cpu"] / one["epoch_cpu"] if one["epoch_cpu"] else None
    return {"measured": True, "wall_ratio": wall, "cpu_ratio": cpu, "goal": GOAL_RATIO, "met": wall is not None and wall <= GOAL_RATIO}


def per_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What each binding beyond the first adds to an epoch (ours, side by side; the fewest and the
    most bindings measured), and an epoch of :data:`FLEET` tables carried on at that rate."""
    ours = sorted((r for r in runs if r["mode"] == "parallel"), key=lambda r: r["bindings"])
    if len(ours) < 2 or ours[0]["bindings"] == ours[-1]["bindings"]:
        return {"measured": False}
    few, many = ours[0], ours[-1]
    added = many["bindings"] - few["bindings"]
    wall = (many["epoch_wall"] - few["epoch_wall"]) / added
    cpu = (many["epoch_cpu"] - few["epoch_cpu"]) / added
    fleet = few["epoch_wall"] + wall * (FLEET - few["bindings"])
    return {
        "measured": True, "from": few["bindings"], "to": many["bindings"], "wall": round(wall, 3), "cpu": round(cpu, 3),
        "fleet": FLEET, "fleet_epoch_wall": round(fleet, 1),
    }


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"{'bindings':>8} {'mode':>10} {'par':>4} {'epoch wall s':>12} {'epoch CPU s':>11} {'jobs/run':>8}"]
    for r in report["runs"]:
        lines.append(
            f"{r['bindings']:>8} {r['mode']:>10} {r['parallel_bindings']:>4} {r['epoch_wall']:>12.2f} {r['epoch_cpu']:>11.2f} "
            f"{r['spark_jobs'] if r['spark_jobs'] is not None else '?':>8}"
        )
    g = report["goal"]
    peer_one = next((r for r in report["runs"] if r["bindings"] == 1 and r["mode"] == "peer"), None)
    peer_many = sorted((r for r in report["runs"] if r["bindings"] == GOAL_BINDINGS and r["mode"] == "peer"), key=lambda r: r["epoch_wall"])
    if peer_one and peer_many and peer_one["epoch_wall"]:
        lines.append(
            f"floor: the peer's epoch of {GOAL_BINDINGS} tables is x{peer_many[0]['epoch_wall'] / peer_one['epoch_wall']:.1f} its "
            f"epoch of 1 (wall, {peer_many[0]['parallel_bindings']} thread(s))"
        )
    each = report.get("per_table", {})
    if each.get("measured"):
        lines.append(
            f"each binding beyond {each['from']} (to {each['to']}): {each['wall']:.2f} s wall, {each['cpu']:.2f} s CPU per epoch; "
            f"an epoch of {each['fleet']} bindings at that rate: about {each['fleet_epoch_wall']:.0f} s"
        )
    if g.get("measured"):
        lines.append(
            f"goal: epoch of {GOAL_BINDINGS} bindings <= {GOAL_RATIO:g} x epoch of 1: wall x{g['wall_ratio']:.1f}, "
            f"CPU x{g['cpu_ratio']:.1f} ({'met' if g['met'] else 'not met'})"
        )
    return lines
