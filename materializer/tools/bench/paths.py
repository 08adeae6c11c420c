"""The three paths the benchmark compares, each on its own copy of the seeded table:

* **ours**: the materializer end to end, in this process (and from a topic with ``--kafka``),
  then a replayed epoch and, in subprocesses, a kill inside the MERGE and the restart that recovers;
* **bare**: the same rows read, deduplicated, staged as Parquet and MERGEd with no exactly-once
  machinery (the floor our apply cannot beat);
* **peer**: Spark Structured Streaming's ``foreachBatch`` MERGE with txn ids.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from materializer.tools.bench.inputs import KEY, SCHEMA_DDL, copy_table, input_schema
from materializer.tools.bench.measurement import (
    MemorySampler,
    OursCollector,
    TimingCollector,
    cpu_delta,
    cpu_seconds,
    epoch_phases,
    job_names,
    next_job_id,
)
from materializer.tools.bench.options import BenchOptions, session_conf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REPO = Path(__file__).resolve().parents[3]  # the checkout: materializer/tools/bench/<this file>


# --- ours -----------------------------------------------------------------------------------------


def pipeline_config(
    folder: Path, source: Path, table: Path, max_documents: int, pipeline_id: str, options: "BenchOptions | None" = None,
    topic: str | None = None,
) -> dict[str, Any]:
    options = options or BenchOptions()
    # One generated file per epoch, as the peer's maxFilesPerTrigger=1.
    source_config: dict[str, Any] = {"format": "documents", "path": str(source), "max_files": 1}
    if topic is not None:
        # The same documents from a topic: max_records = the epoch size, so epochs match the files.
        source_config = {"format": "kafka", "bootstrap_servers": options.kafka, "topic": topic, "max_records": max_documents}
    if options.declared_schema:
        source_config["schema"] = SCHEMA_DDL
    return {
        "pipeline_id": pipeline_id,
        "recovery_log": str(folder / "log"),
        "staging": str(folder / "staging"),
        "transaction": {"max_documents": max_documents, "pipelined": options.pipelined},
        "bindings": [{"name": "docs", "source": source_config, "table": str(table), "key": [KEY]}],
    }


def run_ours(
    spark: "SparkSession", work: Path, source: Path, table: Path, epoch_rows: int, options: "BenchOptions | None" = None,
    topic: str | None = None,
) -> dict[str, Any]:
    from materializer.config import parse_config
    from materializer.runtime import Runtime

    cfg = parse_config(pipeline_config(work, source, table, epoch_rows, "bench-ours", options, topic), "bench")
    collector = OursCollector(spark)
    runtime = Runtime(cfg, spark, collector)
    jobs_before = next_job_id(spark)
    started = time.monotonic()
    summary = runtime.run()
    seconds = time.monotonic() - started
    phases = epoch_phases(collector.events, collector.cpu)
    previous = jobs_before
    for phase in phases:
        end = next((j for e, j in collector.marks if e == phase["epoch"]), None)
        phase["spark_jobs"] = (end - previous) if end is not None and previous is not None else None
        previous = end
    return {"seconds": seconds, "epochs": phases, "last_epoch": summary.last_epoch, "config": cfg, "steps": collector.spans.steps}


class OursSteps:
    """Ours one epoch at a time, for the interleaved bench: each :meth:`step` is a run of its own
    (``max_epochs=1``), so nothing is pipelined, and its Open (the recovery log read, the
    re-acknowledge of the epoch before, already applied) is charged to the epoch it opens for."""

    name = "ours"

    def __init__(
        self, spark: "SparkSession", work: Path, source: Path, table: Path, epoch_rows: int, options: "BenchOptions | None" = None,
        topic: str | None = None,
    ) -> None:
        from materializer.config import parse_config

        if topic is not None:
            self.name = "kafka"
        self.spark = spark
        self.cfg = parse_config(pipeline_config(work, source, table, epoch_rows, f"bench-{self.name}", options, topic), "bench")
        self.collector = OursCollector(spark)  # its span steps add up over the runs
        self.epochs: list[dict[str, Any]] = []
        self.seconds = 0.0

    def step(self, index: int, _path: Path | None = None) -> None:
        from materializer.runtime import Runtime

        collector = self.collector
        first = len(collector.events)
        jobs_before = next_job_id(self.spark)
        started = time.monotonic()
        summary = Runtime(self.cfg, self.spark, collector).run(max_epochs=1)
        self.seconds += time.monotonic() - started
        if summary.last_epoch != index:
            raise RuntimeError(f"bench: ours' run for epoch {index} ended at epoch {summary.last_epoch}")
        (phase,) = epoch_phases(collector.events[first:], collector.cpu[first:])
        end = next((j for e, j in collector.marks if e == index), None)
        phase["spark_jobs"] = end - jobs_before if end is not None and jobs_before is not None else None
        self.epochs.append(phase)

    def result(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "epochs": self.epochs, "last_epoch": len(self.epochs), "config": self.cfg,
                "steps": self.collector.spans.steps}


def run_replay(spark: "SparkSession", cfg: Any) -> dict[str, Any]:
    """A second run of the drained pipeline: Open re-acknowledges the last epoch, already applied."""
    from materializer.runtime import Runtime

    collector = TimingCollector()
    jobs_before = next_job_id(spark)
    started = time.monotonic()
    summary = Runtime(cfg, spark, collector).run()
    seconds = time.monotonic() - started
    jobs_after = next_job_id(spark)
    opened = next(ts for ts, name, _ in collector.events if name == "opened")
    acked = next((ts for ts, name, f in collector.events if name == "acknowledged" and f.get("first")), None)
    statuses = [r.status for r in summary.reapplied.results] if summary.reapplied else []
    return {
        "epoch": summary.opened_at_epoch,
        "statuses": statuses,
        "reapply_seconds": (acked - opened) if acked is not None else None,
        "run_seconds": seconds,
        "spark_jobs": (jobs_after - jobs_before) if jobs_before is not None and jobs_after is not None else None,
        "job_names": job_names(spark, jobs_before, jobs_after),
    }


# --- bare -----------------------------------------------------------------------------------------


def latest_per_key(df: "DataFrame") -> "DataFrame":
    """Last document per key, with the operation flag: what any change-stream consumer must do.

    The same window the materializer's combine uses (each key's greatest ordering, the rows that
    hold it), so the ratios measure the exactly-once machinery and not a faster deduplication.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    op = F.when(F.col("_meta.op") == F.lit("d"), F.lit("d")).otherwise(F.lit("u"))
    rows = df.withColumn("_op", op).drop("_meta")
    columns = rows.columns
    # A delete document has no "updated": give it an ordering (keys are distinct within an
    # epoch's file, so it never competes with an update of the same key).
    order = F.coalesce(F.col("updated"), F.lit(-1))
    latest = rows.withColumn("__order", order).withColumn("__last", F.max("__order").over(Window.partitionBy(KEY)))
    return latest.where(F.col("__order") == F.col("__last")).select(*columns)


def _merge(spark: "SparkSession", table: Path, source: "DataFrame") -> Any:
    from delta.tables import DeltaTable

    columns = [c for c in source.columns if c != "_op"]
    assignments = {f"`{c}`": f"s.`{c}`" for c in columns}
    return (
        DeltaTable.forPath(spark, str(table))
        .alias("t")
        .merge(source.alias("s"), f"t.`{KEY}` = s.`{KEY}`")
        .whenMatchedDelete(condition="s._op = 'd'")
        .whenMatchedUpdate(set=assignments)
        .whenNotMatchedInsert(condition="s._op <> 'd'", values=assignments)
        .execute()
    )


class BareSteps:
    """The bare path one epoch at a time (:meth:`step`): JSON -> last per key -> Parquet (stage),
    then a plain MERGE of the Parquet (merge)."""

    name = "bare"

    def __init__(self, spark: "SparkSession", work: Path, table: Path) -> None:
        self.spark, self.work, self.table = spark, work, table
        self.epochs: list[dict[str, Any]] = []
        self.seconds = 0.0

    def step(self, index: int, path: Path) -> None:
        spark = self.spark
        staged = self.work / "staged" / f"epoch-{index:06d}"
        j0, t0, c0 = next_job_id(spark), time.monotonic(), cpu_seconds()
        latest_per_key(spark.read.schema(input_schema()).json(str(path))).write.mode("errorifexists").parquet(str(staged))
        j1, t1 = next_job_id(spark), time.monotonic()
        _merge(spark, self.table, spark.read.parquet(str(staged)))
        j2, t2, c2 = next_job_id(spark), time.monotonic(), cpu_seconds()
        shutil.rmtree(staged, ignore_errors=True)
        jobs = {"stage_jobs": j1 - j0, "merge_jobs": j2 - j1} if None not in (j0, j1, j2) else {}  # type: ignore[operator]
        self.seconds += t2 - t0
        self.epochs.append({"epoch": index, "stage": t1 - t0, "merge": t2 - t1, "total": t2 - t0, **jobs, **cpu_delta(c0, c2)})

    def result(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "epochs": self.epochs}


def run_bare(spark: "SparkSession", work: Path, files: list[Path], table: Path) -> dict[str, Any]:
    """Every file, one epoch each (:class:`BareSteps`)."""
    bare = BareSteps(spark, work, table)
    for index, path in enumerate(files, start=1):
        bare.step(index, path)
    return bare.result()


# --- peer -----------------------------------------------------------------------------------------


def _peer_batches(table: Path, batches: list[dict[str, Any]], cpu_mark: list[tuple[float, ...]]) -> Any:
    """The peer's ``foreachBatch`` function: Delta's recipe for an idempotent MERGE (the txn confs
    on the batch's session); each batch's wall and CPU (from ``cpu_mark[0]``) appended to ``batches``."""
    from materializer.delta import TXN_APP_ID, TXN_VERSION

    def apply(batch: "DataFrame", batch_id: int) -> None:
        t0 = time.monotonic()
        session = batch.sparkSession
        session.conf.set(TXN_APP_ID, "bench-peer")
        session.conf.set(TXN_VERSION, str(batch_id))
        try:
            _merge(session, table, latest_per_key(batch))
        finally:
            session.conf.unset(TXN_APP_ID)
            session.conf.unset(TXN_VERSION)
        now = cpu_seconds()
        before, cpu_mark[0] = cpu_mark[0], now
        batches.append({"batch_id": batch_id, "foreach_batch": time.monotonic() - t0, **cpu_delta(before, now)})

    return apply


def _peer_query(spark: "SparkSession", work: Path, source: Path, apply: Any) -> Any:
    """The peer's query over ``source`` (file source, one file per batch, ``Trigger.AvailableNow``),
    run to its end; the query, for its progress."""
    query = (
        spark.readStream.schema(input_schema())
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(apply)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"peer query failed: {query.exception()}")
    return query


def _peer_epochs(batches: list[dict[str, Any]], query: Any) -> list[dict[str, Any]]:
    triggers: dict[int, float] = {}
    for progress in query.recentProgress:
        data = progress if isinstance(progress, dict) else json.loads(progress.json)
        if int(data.get("numInputRows", 0)) > 0:
            triggers[int(data["batchId"])] = data["durationMs"].get("triggerExecution", 0) / 1000.0
    return [
        {"epoch": b["batch_id"] + 1, "foreach_batch": b["foreach_batch"], "total": triggers.get(b["batch_id"], b["foreach_batch"]),
         **{k: v for k, v in b.items() if k.endswith("_cpu")}}
        for b in batches
    ]


def run_peer(spark: "SparkSession", work: Path, source: Path, table: Path) -> dict[str, Any]:
    """Structured Streaming: file source, one file per batch, foreachBatch MERGE with txn ids; one
    query over every file. A batch's CPU runs from the previous batch's end (the query's start):
    the trigger's planning is included."""
    batches: list[dict[str, Any]] = []
    cpu_mark = [cpu_seconds()]
    started = time.monotonic()
    query = _peer_query(spark, work, source, _peer_batches(table, batches, cpu_mark))
    return {"seconds": time.monotonic() - started, "epochs": _peer_epochs(batches, query)}


class PeerSteps:
    """The peer one epoch at a time, for the interleaved bench: each :meth:`step` links the
    epoch's file into the peer's own source folder and runs the query (``AvailableNow``, one batch)
    from its checkpoint. A batch's CPU runs from its ``foreachBatch`` start, so the query's start
    and the trigger's planning are left out: a little in the peer's favour, never in ours'."""

    name = "peer"

    def __init__(self, spark: "SparkSession", work: Path, table: Path) -> None:
        self.spark, self.work = spark, work
        self.source = work / "source"
        self.source.mkdir(parents=True, exist_ok=True)
        self.batches: list[dict[str, Any]] = []
        self.cpu_mark: list[tuple[float, ...]] = [cpu_seconds()]
        self.apply = _peer_batches(table, self.batches, self.cpu_mark)
        self.epochs: list[dict[str, Any]] = []
        self.seconds = 0.0

    def step(self, index: int, path: Path) -> None:
        link = self.source / path.name
        try:
            os.link(path, link)  # the same file, its modification time too
        except OSError:
            shutil.copy2(path, link)
        started = time.monotonic()
        seen = len(self.batches)
        apply = self.apply

        def timed(batch: "DataFrame", batch_id: int) -> None:
            self.cpu_mark[0] = cpu_seconds()
            apply(batch, batch_id)

        query = _peer_query(self.spark, self.work, self.source, timed)
        self.seconds += time.monotonic() - started
        if len(self.batches) != seen + 1:
            raise RuntimeError(f"bench: the peer's query for epoch {index} ran {len(self.batches) - seen} batches, not 1")
        self.epochs += _peer_epochs(self.batches[seen:], query)
        if self.epochs[-1]["epoch"] != index:
            raise RuntimeError(f"bench: the peer's batch for epoch {index} was batch {self.epochs[-1]['epoch'] - 1}")

    def result(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "epochs": self.epochs}


# --- recovery -------------------------------------------------------------------------------------


def run_recovery(
    work: Path,
    seed: Path,
    epoch_file: Path,
    epoch_rows: int,
    options: BenchOptions,
    sampler: MemorySampler | None,
    prefix: str = "",
) -> dict[str, Any]:
    """Kill a subprocess run inside the MERGE of epoch 1, then time the restart that recovers it."""
    source = work / "source"
    source.mkdir(parents=True)
    shutil.copy(epoch_file, source / epoch_file.name)
    table = work / "table"
    copy_table(seed, table)
    data = pipeline_config(work, source, table, epoch_rows, "bench-recovery", options)
    data["spark"] = {"master": options.master, "conf": session_conf(options)}
    config = work / "pipeline.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    env = dict(os.environ)
    env.pop("MATERIALIZER_CRASH_AT", None)

    def launch(args: list[str], extra_env: dict[str, str], phase: str) -> tuple[subprocess.CompletedProcess[str], float]:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "materializer_cli", *args],
            cwd=REPO,
            env={**env, **extra_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if sampler is not None:
            with sampler.phase(phase, proc.pid):
                out, err = proc.communicate(timeout=3600)
        else:
            out, err = proc.communicate(timeout=3600)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - t0

    crashed, crash_seconds = launch(
        ["run", "--config", str(config), "--quiet"], {"MATERIALIZER_CRASH_AT": "mid-apply:1"}, f"{prefix}recovery-crashed-run"
    )
    # --max-epochs 0: Open, the first Acknowledge (the recovery), then stop; nothing new is read.
    restart, restart_seconds = launch(
        ["run", "--config", str(config), "--max-epochs", "0", "--json"], {}, f"{prefix}recovery-restart"
    )
    if restart.returncode != 0:
        raise RuntimeError(f"recovery restart failed ({restart.returncode}): {restart.stderr[-2000:]}")
    summary = json.loads(restart.stdout.strip().splitlines()[-1])
    statuses = [r["status"] for r in (summary.get("reapplied") or {}).get("results", [])]
    # Once more: now the epoch is applied, so this restart is a replay in a fresh process, where
    # Delta's snapshot is not cached (the in-process replay above measures a warm one).
    again, again_seconds = launch(
        ["run", "--config", str(config), "--max-epochs", "0", "--json"], {}, f"{prefix}recovery-replay-restart"
    )
    again_summary = json.loads(again.stdout.strip().splitlines()[-1]) if again.returncode == 0 else {}
    return {
        "replay_restart_seconds": again_seconds,
        "replay_restart_run_seconds": again_summary.get("seconds"),
        "replay_restart_statuses": [r["status"] for r in (again_summary.get("reapplied") or {}).get("results", [])],
        "crash_point": "mid-apply:1",
        "crashed_returncode": crashed.returncode,
        "crashed_run_seconds": crash_seconds,
        "restart_seconds": restart_seconds,
        "restart_run_seconds": summary.get("seconds"),
        "restart_statuses": statuses,
        "table_rows_after": None,
        "_table": str(table),
    }
