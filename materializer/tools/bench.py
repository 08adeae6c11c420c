"""``materializer bench``: throughput and overhead against a bare MERGE and against Structured Streaming.

For each configuration (a table of ``table_rows`` keys, epochs of ``epoch_rows`` documents) the
benchmark generates a synthetic collection as JSON Lines files, one file per epoch, followed by
one file holding a single document (the fixed cost of a one-row epoch), and applies the same
files three ways, each to its own copy of the same seeded table:

* **ours**: the materializer end to end, in this process (``Runtime(config, spark).run()``), with
  ``source.max_files = 1`` so each file is one epoch. A collector timestamps the runtime's
  events, which splits each epoch into *read* (listing, the Spark job that checks every document),
  *stage* (Spark parse, combine, Parquet write, recovery-log commit) and *apply* (txn check,
  staged-file check, MERGE, garbage collection), and records per epoch the CPU seconds of this
  Python process (the driver) and of the Spark JVM (psutil). The spans the core emits
  (``materializer.events.Span``: prestage, StartCommit, MERGE…) say where the time went inside
  those phases, with the Spark jobs each ran (the report's ``steps``).
* **bare**: what a user without exactly-once machinery would do with the same rows: read the
  JSON file with a fixed schema, keep the last document per key, write Parquet (*stage*), then a
  plain ``MERGE`` of that Parquet (*merge*; no txn ids, no checks). The bare MERGE is the floor
  our apply phase cannot beat.
* **peer**: Spark Structured Streaming, file source on the same folder with
  ``maxFilesPerTrigger=1`` (one file per micro-batch, so batches match our epochs),
  ``Trigger.AvailableNow``, and a ``foreachBatch`` that deduplicates and MERGEs with
  ``txnAppId``/``txnVersion`` = query id/batch id, the pattern Delta's documentation recommends.

With ``--kafka BOOTSTRAP`` (issue 17), **ours from Kafka**: the same files' documents produced, in
file order and keyed by id, to a fresh topic (not timed), then the materializer reading the topic
(``format: kafka``, ``max_records`` = the epoch size, so epochs hold the same documents as the
files) into its own copy of the seeded table: records per second from topic to table beside the
same data from files.

Then, on our table: the cost of a replayed, already-applied epoch (a second run of the drained
pipeline: Open re-acknowledges the last epoch, which Delta already records); and, in
subprocesses, the recovery after a kill (``MATERIALIZER_CRASH_AT=mid-apply:1``) and the time of
the restart that recovers. A sampler thread records the peak RSS of this Python process (the
driver) and of the Spark JVM, per phase.

Per-epoch figures are medians over the big epochs (the one-row epoch excluded), because the
machine this runs on may be shared and a single slow epoch should not decide a ratio.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import yaml

from materializer import events
from materializer.events import Collector, Event

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REPO = Path(__file__).resolve().parents[2]  # the checkout: materializer/tools/<this file>
KEY = "id"
# The userMetadata of the seed commit: deliberately not the materializer's {"materializer": …} tag,
# so status/history never mistake the seed for a pipeline epoch.
SEED_TAG = "bench-seed"

QUICK_TABLE_ROWS = [100_000]
QUICK_EPOCH_ROWS = [10_000]
FULL_TABLE_ROWS = [1_000_000, 10_000_000]
FULL_EPOCH_ROWS = [10_000, 100_000, 1_000_000]


# --- options and report ---------------------------------------------------------------------------


@dataclass
class BenchOptions:
    table_rows: list[int] = field(default_factory=lambda: list(QUICK_TABLE_ROWS))
    epoch_rows: list[int] = field(default_factory=lambda: list(QUICK_EPOCH_ROWS))
    epochs: int = 3
    """Big epochs per configuration (one one-row epoch is added after them)."""
    insert_ratio: float = 0.5
    update_ratio: float = 0.4
    delete_ratio: float = 0.1
    out: Path = Path(".bench")
    seed: int = 7
    peer: bool = True
    replay: bool = True
    recovery: bool = True
    """Kill-and-restart in subprocesses (two extra JVM start-ups per configuration)."""
    master: str = "local[*]"
    driver_memory: str = "2g"
    shuffle_partitions: int | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    """Extra Spark settings for every path (e.g. ``spark.sql.adaptive.enabled=false``)."""
    one_row_epoch: bool = True
    """Follow the big epochs with a one-document epoch (the fixed cost of an epoch)."""
    warmup: bool = True
    """Run every path once on a tiny table first, so JIT and class loading are not charged to the first path."""
    keep_data: bool = False
    """Keep the generated inputs and tables under the run folder (they are deleted by default)."""
    declared_schema: bool = True
    """Ours reads with the documents' schema declared (``source.schema``), as bare and peer are
    given it; False makes ours infer each epoch's types (one more Spark pass per epoch)."""
    pipelined: bool = True
    """Ours applies epoch N while reading N+1 (``transaction.pipelined``)."""
    kafka: str | None = None
    """Bootstrap servers of a Kafka broker: also measure ours reading the same documents from a topic."""
    kafka_partitions: int = 2
    """Partitions of the benchmark's topic."""
    deletion_vectors: bool = True
    """The seeded table has deletion vectors, as a table the materializer creates has by default
    (every approach gets a copy of it); False: the seed of the runs before issue #18."""
    mode: str = "custom"

    def __post_init__(self) -> None:
        total = self.insert_ratio + self.update_ratio + self.delete_ratio
        if any(r < 0 for r in (self.insert_ratio, self.update_ratio, self.delete_ratio)) or abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"insert/update/delete ratios must be non-negative and sum to 1, got "
                f"{self.insert_ratio}/{self.update_ratio}/{self.delete_ratio}"
            )
        if self.epochs < 1:
            raise ValueError("epochs must be at least 1")

    @classmethod
    def quick(cls, **overrides: Any) -> "BenchOptions":
        return cls(mode="quick", **{"table_rows": list(QUICK_TABLE_ROWS), "epoch_rows": list(QUICK_EPOCH_ROWS), **overrides})

    @classmethod
    def full(cls, **overrides: Any) -> "BenchOptions":
        return cls(mode="full", **{"table_rows": list(FULL_TABLE_ROWS), "epoch_rows": list(FULL_EPOCH_ROWS), **overrides})


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


# --- memory ---------------------------------------------------------------------------------------


class MemorySampler:
    """Samples the RSS of this process (the driver) and of its java children (the Spark JVM).

    Peaks are kept per phase label; a phase may also watch an extra process tree (a subprocess run).
    """

    def __init__(self, interval: float = 0.2) -> None:
        from materializer.extras import require

        psutil = require("psutil", purpose="the benchmark's memory sampler")

        self._psutil = psutil
        self._me = psutil.Process()
        self.interval = interval
        self.peaks: dict[str, dict[str, int]] = {}
        self._phase: str | None = None
        self._extra: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _tree_rss(self, root: Any) -> tuple[int, int]:
        """(python RSS, java RSS) of ``root`` and its descendants."""
        python_rss, java_rss = 0, 0
        try:
            procs = [root] + root.children(recursive=True)
        except self._psutil.Error:
            return 0, 0
        for proc in procs:
            try:
                name = proc.name().lower()
                rss = proc.memory_info().rss
            except self._psutil.Error:
                continue
            if "java" in name:
                java_rss += rss
            elif "python" in name or proc.pid == root.pid:
                python_rss += rss
        return python_rss, java_rss

    def sample(self) -> None:
        with self._lock:
            phase, extra = self._phase, self._extra
        if phase is None:
            return
        root = extra if extra is not None else self._me
        python_rss, java_rss = self._tree_rss(root)
        peak = self.peaks.setdefault(phase, {"python_rss": 0, "jvm_rss": 0})
        peak["python_rss"] = max(peak["python_rss"], python_rss)
        peak["jvm_rss"] = max(peak["jvm_rss"], java_rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    @contextmanager
    def phase(self, name: str, pid: int | None = None) -> Iterator[None]:
        with self._lock:
            previous = (self._phase, self._extra)
            self._phase = name
            self._extra = self._psutil.Process(pid) if pid is not None else None
        self.sample()
        try:
            yield
        finally:
            self.sample()
            with self._lock:
                self._phase, self._extra = previous

    def watch(self, name: str, pid: int) -> None:
        """Point the current phase at another process tree (a subprocess started inside the phase)."""
        with self._lock:
            self._phase = name
            try:
                self._extra = self._psutil.Process(pid)
            except self._psutil.Error:
                self._extra = None


# --- Spark job accounting -------------------------------------------------------------------------


# Job groups the measured code runs under: the driver's MERGE group, the peer's, and none (None).
JOB_GROUPS: tuple[str | None, ...] = (
    None,
    "materializer-bench-ours-apply",
    "materializer-bench-ours-load",
    "materializer-bench-recovery-apply",
)


def next_job_id(spark: "SparkSession") -> int | None:
    """The id the next Spark job will get: differences count the jobs a step ran.

    Job ids are global and sequential, so the highest id the status tracker knows (over the job
    groups the measured code uses) plus one is the next one.
    """
    try:
        tracker = spark.sparkContext.statusTracker()
        ids = [i for group in JOB_GROUPS for i in tracker.getJobIdsForGroup(group)]
        candidate = max(ids) + 1 if ids else 0
        # Jobs of other groups (a streaming query's) may be newer: ids are contiguous, so probe on.
        while tracker.getJobInfo(candidate) is not None:
            candidate += 1
        return candidate
    except Exception:  # noqa: BLE001 - no status tracker (Spark Connect)
        return None


def job_names(spark: "SparkSession", start: int | None, end: int | None) -> list[str]:
    """First-stage names (Spark's call sites, e.g. ``json at …``) of jobs ``start``…``end - 1``."""
    if start is None or end is None:
        return []
    tracker = spark.sparkContext.statusTracker()
    names = []
    for job_id in range(start, end):
        info = tracker.getJobInfo(job_id)
        if info is None or not info.stageIds:
            names.append("?")
            continue
        stage = tracker.getStageInfo(min(info.stageIds))
        names.append(stage.name.split(" at ")[0] if stage is not None else "?")
    return names


# --- data -----------------------------------------------------------------------------------------


def input_schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField(KEY, T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("amount", T.DoubleType()),
            T.StructField("qty", T.LongType()),
            T.StructField("updated", T.LongType()),
            T.StructField("_meta", T.StructType([T.StructField("op", T.StringType())])),
        ]
    )


def seed_table(spark: "SparkSession", path: Path, rows: int, deletion_vectors: bool = True) -> float:
    """Write the initial table with a plain Delta write (not the materializer), tagged as the seed."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    # Files of about 1M rows: MERGEs with random keys rewrite every file they touch, as they would
    # on a real table of this size with unclustered keys.
    partitions = max(1, rows // 1_000_000)
    df = spark.range(0, rows, numPartitions=partitions).select(
        F.col("id").alias(KEY),
        F.concat(F.lit("seed-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 10_000 / 100.0).alias("amount"),
        (F.col("id") % 97).alias("qty"),
        F.lit(0).cast("long").alias("updated"),
    )
    meta = json.dumps({SEED_TAG: {"rows": rows}})
    (
        df.write.format("delta")
        .mode("errorifexists")
        .option("userMetadata", meta)
        .option("delta.enableDeletionVectors", str(deletion_vectors).lower())
        .save(str(path))
    )
    return time.monotonic() - started


@dataclass
class Collection:
    files: list[Path]
    big_epochs: int
    alive: int
    """Keys the table must hold after every file is applied."""
    documents: int
    seconds: float


def generate_collection(
    folder: Path,
    table_rows: int,
    epoch_rows: int,
    epochs: int,
    ratios: tuple[float, float, float],
    seed: int,
    one_row: bool = True,
) -> Collection:
    """``epochs`` files of ``epoch_rows`` documents, then (``one_row``) one file of one update.

    Keys are distinct within a file (so the bare and peer MERGEs see one source row per key), updates
    and deletes pick live keys, inserts take fresh ones. Files get increasing mtimes because the
    streaming file source orders files by modification time.
    """
    import numpy as np

    started = time.monotonic()
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    alive = np.zeros(table_rows + epochs * epoch_rows + 1, dtype=bool)
    alive[:table_rows] = True
    next_id = table_rows
    files: list[Path] = []
    documents = 0
    insert_ratio, _update_ratio, delete_ratio = ratios
    plan = [epoch_rows] * epochs + ([1] if one_row else [])
    base_mtime = time.time() - 3600
    for index, size in enumerate(plan, start=1):
        if size == 1:
            n_ins, n_del = 0, 0
        else:
            n_ins = int(round(size * insert_ratio))
            n_del = int(round(size * delete_ratio))
        n_upd = size - n_ins - n_del
        live = np.flatnonzero(alive)
        picked = rng.choice(live, size=n_upd + n_del, replace=False) if n_upd + n_del else np.array([], dtype=np.int64)
        updates, deletes = picked[:n_upd], picked[n_upd:]
        inserts = np.arange(next_id, next_id + n_ins, dtype=np.int64)
        next_id += n_ins
        alive[inserts] = True
        alive[deletes] = False
        lines = [
            '{"id":%d,"name":"e%d-%d","amount":%.2f,"qty":%d,"updated":%d}\n' % (k, index, k, (k % 10_000) / 7.0, k % 89, index)
            for k in np.concatenate([inserts, updates]).tolist()
        ]
        lines += ['{"id":%d,"_meta":{"op":"d"}}\n' % k for k in deletes.tolist()]
        order = rng.permutation(len(lines))
        path = folder / f"epoch-{index:06d}.jsonl"
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(lines[i] for i in order.tolist())
        os.utime(path, (base_mtime + index, base_mtime + index))
        files.append(path)
        documents += size
    return Collection(files=files, big_epochs=epochs, alive=int(alive.sum()), documents=documents, seconds=time.monotonic() - started)


def _copy_table(seed: Path, target: Path) -> None:
    # A Delta table's log references its files relatively: a folder copy is the same table.
    shutil.copytree(seed, target)


def _count(spark: "SparkSession", table: Path) -> int:
    return int(spark.read.format("delta").load(str(table)).count())


# --- ours -----------------------------------------------------------------------------------------


class WorkerCpu:
    """The CPU seconds of Spark's Python workers, the JVM's child processes, exited ones included.

    A worker's seconds cannot be read once it has exited, and its parent does not keep them:
    ``pyspark.daemon`` ignores SIGCHLD, so the kernel reaps the workers it forks and discards
    their times (a bench run showed the workers' sum fall by 1.8 s over an epoch when it was read
    from live processes only). So a thread samples every process under the JVM every
    ``interval`` seconds and keeps each one's last reading: an exited worker counts with what it
    had used at the last sample before it ended (at most ``interval`` of CPU short). The
    sampler's own CPU is not charged to the driver's Python (:attr:`own`)."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self.interval = interval
        self._seen: dict[tuple[int, float], float] = {}
        self._lock = threading.Lock()
        self.own = 0.0
        """CPU seconds the sampling thread has used (taken off the driver's figure)."""
        self._thread = threading.Thread(target=self._loop, name="bench-worker-cpu", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            started = time.thread_time()
            self.sample()
            with self._lock:
                self.own += time.thread_time() - started
            time.sleep(self.interval)

    def sample(self) -> tuple[float, float]:
        """(the JVM's CPU seconds, the workers' so far) after reading every process now."""
        psutil = self._psutil
        jvm = 0.0
        readings: dict[tuple[int, float], float] = {}
        for child in self._me.children():
            try:
                if "java" not in child.name().lower():
                    continue
                t = child.cpu_times()
                jvm += t.user + t.system
                for worker in child.children(recursive=True):
                    try:
                        w = worker.cpu_times()
                        readings[(worker.pid, worker.create_time())] = w.user + w.system + w.children_user + w.children_system
                    except psutil.Error:
                        continue
            except psutil.Error:
                continue
        with self._lock:
            for key, seconds in readings.items():
                self._seen[key] = max(seconds, self._seen.get(key, 0.0))
            return jvm, sum(self._seen.values())


_workers: WorkerCpu | None = None


def cpu_seconds() -> tuple[float, float, float]:
    """(this Python process's CPU seconds, its java children's: the Spark JVM, and the JVM's own
    children's: Spark's Python workers, which run ``mapInArrow``), user + system.

    CPU time is what #12's goal is stated in: it stays steady on a shared machine when wall time
    does not, and it shows work done in the driver's Python apart from work done by Spark. The
    workers are counted too, alive or exited (:class:`WorkerCpu`): left out, a route that moves
    work from the JVM to them would look free (issue #25).
    """
    import psutil

    global _workers
    if _workers is None:
        _workers = WorkerCpu()
    jvm, workers = _workers.sample()
    times = psutil.Process().cpu_times()
    return times.user + times.system - _workers.own, jvm, workers


class TimingCollector(Collector):
    """Timestamps the runtime's events (monotonic seconds) and the CPU seconds spent so far.

    Spans are left to :class:`SpanSteps`: sampling CPU at each of them would charge the bench's
    own psutil calls to the epochs.
    """

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.cpu: list[tuple[float, ...]] = []
        """Per event: (Python CPU seconds, JVM CPU seconds, Python workers' CPU seconds) so far."""

    def emit(self, event: Event) -> None:
        if isinstance(event, (events.SpanStarted, events.Span)):
            return
        self.events.append((time.monotonic(), event.kind, event.fields()))
        self.cpu.append(cpu_seconds())


SCHEMA_DDL = "id BIGINT, name STRING, amount DOUBLE, qty BIGINT, updated BIGINT"
"""The generated documents' fields: :func:`input_schema` without ``_meta``."""


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


def epoch_phases(
    events: list[tuple[float, str, dict[str, Any]]], cpu: list[tuple[float, ...]] | None = None
) -> list[dict[str, Any]]:
    """Per epoch: read, stage, apply, and total, the epoch's share of the run's time.

    The runtime applies epoch N in the background while it reads N+1, so the phases overlap:

    * read: from when the runtime could start reading (the previous epoch committed, or for a run
      that does not pipeline, acknowledged) to the batch read (listing, the Spark check job); with
      a declared schema the documents are checked by the staging job and the read event is sent
      once that job is verified, so read then includes prestage and StartCommit;
    * stage: from the batch read to its recovery-log commit (prestage, waiting for the previous
      epoch's Acknowledged, loads, Parquet, log commit);
    * apply: from the log commit to Acknowledged (txn check, MERGE, GC);
    * total: from the previous epoch's Acknowledged to this one's (from Open for the first epoch,
      which has nothing to overlap with): what each epoch adds to the run, i.e. its throughput.

    With ``cpu`` (per event, the CPU seconds so far), each epoch also gets ``python_cpu`` and
    ``jvm_cpu`` (and ``worker_cpu``, Spark's Python workers, when ``cpu`` has them): the CPU
    seconds of the same interval as ``total``.
    """
    opened: float | None = None
    read_at: dict[int, float] = {}
    documents: dict[int, int] = {}
    committed_at: dict[int, float] = {}
    acked_at: dict[int, float] = {}
    cpu_at: dict[float, tuple[float, ...]] = {}
    for index, (ts, name, fields) in enumerate(events):
        if cpu is not None and index < len(cpu):
            cpu_at[ts] = cpu[index]
        if name == "opened" and opened is None:
            opened = ts
        elif name == "read":
            epoch = int(fields["epoch"])
            read_at[epoch] = ts
            documents[epoch] = documents.get(epoch, 0) + int(fields["documents"])
        elif name == "committed":
            committed_at[int(fields["epoch"])] = ts
        elif name == "acknowledged" and not fields.get("first"):
            acked_at[int(fields["epoch"])] = ts
    if opened is None:
        return []
    out: list[dict[str, Any]] = []
    for epoch in sorted(e for e in committed_at if e in acked_at and e in read_at):
        read, committed, acked = read_at[epoch], committed_at[epoch], acked_at[epoch]
        starts = [t for t in (opened, committed_at.get(epoch - 1), acked_at.get(epoch - 1)) if t is not None and t <= read]
        previous_ack = acked_at.get(epoch - 1)
        start = previous_ack if previous_ack is not None else opened
        figures: dict[str, Any] = {}
        if start in cpu_at and acked in cpu_at:
            figures = _cpu_delta(cpu_at[start], cpu_at[acked])
        out.append(
            {
                **figures,
                "epoch": epoch,
                "documents": documents[epoch],
                "read": read - max(starts),
                "stage": committed - read,
                "apply": acked - committed,
                "total": acked - (previous_ack if previous_ack is not None else opened),
            }
        )
    return out


def _cpu_delta(before: tuple[float, ...], after: tuple[float, ...]) -> dict[str, float]:
    """The CPU seconds between two :func:`cpu_seconds` readings, by process kind."""
    names = ("python_cpu", "jvm_cpu", "worker_cpu")
    return {name: b - a for name, a, b in zip(names, before, after)}


SPAN_STEPS = {
    "check_tables": "open: log/table consistency check (table_state, Delta log snapshots)",
    "read": "read: source batch (listing; the Spark job that checks every document and derives the schema, unless the checks are deferred)",
    "prestage": "stage: prestage while the previous epoch applies (parse, checks with a declared schema, combine, Parquet)",
    "start_commit": "stage: StartCommit (type check; Parquet write unless prestaged)",
    "verify": "stage: verify the checks the staging job tallied (no Spark job unless one failed)",
    "log_commit": "stage: recovery-log commit",
    "table_state": "apply: table_state (Delta log snapshot + txn)",
    "read_staged": "apply: staged-file check (listing) and Parquet read",
    "merge": "apply: MERGE (with target schema lookups)",
}
"""The report's label of each span the core emits (``materializer.events.Span``); another name is
reported as itself."""


class SpanSteps(Collector):
    """Where an epoch's time goes, from the spans the core emits: calls, seconds and Spark jobs per step.

    The seconds are the core's own (``Span.seconds``). The Spark jobs are counted here, from the
    status tracker's next job id at the span's start and end events (both sent on the thread that
    runs the step); with pipelining, jobs the other thread ran meanwhile are counted too.
    """

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark
        self.steps: dict[str, dict[str, Any]] = {}
        self._started: dict[tuple[str, int | None, str | None, int], int | None] = {}

    def emit(self, event: Event) -> None:
        if isinstance(event, events.SpanStarted):
            self._started[(event.name, event.epoch, event.binding, threading.get_ident())] = next_job_id(self.spark)
        elif isinstance(event, events.Span):
            jobs0 = self._started.pop((event.name, event.epoch, event.binding, threading.get_ident()), None)
            jobs1 = next_job_id(self.spark)
            jobs = jobs1 - jobs0 if jobs0 is not None and jobs1 is not None else 0
            label = SPAN_STEPS.get(event.name, event.name)
            step = self.steps.setdefault(label, {"calls": 0, "seconds": 0.0, "spark_jobs": 0, "per_call": []})
            step["calls"] += 1
            step["seconds"] += event.seconds
            step["spark_jobs"] += jobs
            # Per call, in order: e.g. table_state and merge of each binding alternate.
            step["per_call"].append([round(event.seconds, 4), jobs])


class OursCollector(TimingCollector):
    """The bench's collector for a run of ours: event times and CPU, span steps, and the job
    counter at each Acknowledged (so jobs can be attributed to epochs)."""

    def __init__(self, spark: "SparkSession") -> None:
        super().__init__()
        self.spark = spark
        self.spans = SpanSteps(spark)
        self.marks: list[tuple[int, int | None]] = []

    def emit(self, event: Event) -> None:
        super().emit(event)
        self.spans.emit(event)
        if isinstance(event, events.Acknowledged):
            self.marks.append((event.epoch, next_job_id(self.spark)))


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


def produce_topic(bootstrap: str, topic: str, partitions: int, files: list[Path]) -> float:
    """The files' documents to a new topic, in file order, keyed by id (so a key's documents stay in
    one partition, in order). Setup, not measured; returns its seconds."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20, "batch.size": 1 << 20})
    for path in files:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                key = json.loads(line)[KEY]
                while True:
                    try:
                        producer.produce(topic, key=str(key).encode(), value=line.rstrip("\n").encode())
                        break
                    except BufferError:
                        producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"bench: could not produce every document to {topic}")
    return time.monotonic() - started


# --- bare -----------------------------------------------------------------------------------------


def _latest_per_key(df: "DataFrame") -> "DataFrame":
    """Last document per key, with the operation flag: what any change-stream consumer must do.

    The same hash aggregate (``max_by``) the materializer's combine uses, so the ratios measure
    the exactly-once machinery and not a faster deduplication.
    """
    from pyspark.sql import functions as F

    op = F.when(F.col("_meta.op") == F.lit("d"), F.lit("d")).otherwise(F.lit("u"))
    rows = df.withColumn("_op", op).drop("_meta")
    values = [c for c in rows.columns if c != KEY]
    # A delete document has no "updated": max_by skips NULL orderings, so give it one (keys are
    # distinct within an epoch's file, so it never competes with an update of the same key).
    order = F.coalesce(F.col("updated"), F.lit(-1))
    latest = rows.groupBy(KEY).agg(F.max_by(F.struct(*values), order).alias("__last"))
    return latest.select(KEY, *[F.col(f"__last.`{c}`").alias(c) for c in values])


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


def run_bare(spark: "SparkSession", work: Path, files: list[Path], table: Path) -> dict[str, Any]:
    """Per file: JSON -> last per key -> Parquet (stage), then a plain MERGE of the Parquet (merge)."""
    schema = input_schema()
    epochs = []
    started = time.monotonic()
    for index, path in enumerate(files, start=1):
        staged = work / "staged" / f"epoch-{index:06d}"
        j0, t0, c0 = next_job_id(spark), time.monotonic(), cpu_seconds()
        _latest_per_key(spark.read.schema(schema).json(str(path))).write.mode("errorifexists").parquet(str(staged))
        j1, t1 = next_job_id(spark), time.monotonic()
        _merge(spark, table, spark.read.parquet(str(staged)))
        j2, t2, c2 = next_job_id(spark), time.monotonic(), cpu_seconds()
        shutil.rmtree(staged, ignore_errors=True)
        jobs = {"stage_jobs": j1 - j0, "merge_jobs": j2 - j1} if None not in (j0, j1, j2) else {}  # type: ignore[operator]
        cpu = _cpu_delta(c0, c2)
        epochs.append({"epoch": index, "stage": t1 - t0, "merge": t2 - t1, "total": t2 - t0, **jobs, **cpu})
    return {"seconds": time.monotonic() - started, "epochs": epochs}


# --- peer -----------------------------------------------------------------------------------------


def run_peer(spark: "SparkSession", work: Path, source: Path, table: Path) -> dict[str, Any]:
    """Structured Streaming: file source, one file per batch, foreachBatch MERGE with txn ids."""
    from materializer.delta import TXN_APP_ID, TXN_VERSION

    app_id = "bench-peer"
    batches: list[dict[str, Any]] = []

    def apply(batch: "DataFrame", batch_id: int) -> None:
        t0 = time.monotonic()
        session = batch.sparkSession
        # Delta's recipe for idempotent foreachBatch MERGE: the txn confs on the batch's session.
        session.conf.set(TXN_APP_ID, app_id)
        session.conf.set(TXN_VERSION, str(batch_id))
        try:
            _merge(session, table, _latest_per_key(batch))
        finally:
            session.conf.unset(TXN_APP_ID)
            session.conf.unset(TXN_VERSION)
        # CPU from the previous batch's end (the query's start): the trigger's planning included.
        now = cpu_seconds()
        before, cpu_mark[0] = cpu_mark[0], now
        batches.append({"batch_id": batch_id, "foreach_batch": time.monotonic() - t0, **_cpu_delta(before, now)})

    cpu_mark = [cpu_seconds()]
    started = time.monotonic()
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
    seconds = time.monotonic() - started
    triggers: dict[int, float] = {}
    for progress in query.recentProgress:
        data = progress if isinstance(progress, dict) else json.loads(progress.json)
        if int(data.get("numInputRows", 0)) > 0:
            triggers[int(data["batchId"])] = data["durationMs"].get("triggerExecution", 0) / 1000.0
    epochs = []
    for batch in batches:
        total = triggers.get(batch["batch_id"], batch["foreach_batch"])
        epochs.append({"epoch": batch["batch_id"] + 1, "foreach_batch": batch["foreach_batch"], "total": total,
                       **{k: v for k, v in batch.items() if k.endswith("_cpu")}})
    if query.exception() is not None:
        raise RuntimeError(f"peer query failed: {query.exception()}")
    return {"seconds": seconds, "epochs": epochs}


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
    _copy_table(seed, table)
    data = pipeline_config(work, source, table, epoch_rows, "bench-recovery", options)
    data["spark"] = {"master": options.master, "conf": _session_conf(options)}
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


# --- orchestration --------------------------------------------------------------------------------


def _session_conf(options: BenchOptions) -> dict[str, str]:
    conf = {"spark.driver.memory": options.driver_memory}
    if options.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(options.shuffle_partitions)
    conf.update(options.spark_conf)
    return conf


def session(options: BenchOptions) -> "SparkSession":
    """The one builder (materializer.spark.session_for) with the bench's own master and settings:
    there is no pipeline config to take them from (config_session), and never a Connect server (the
    bench samples the memory and CPU of its own JVM, a child of this process)."""
    from materializer.spark import session_for

    return session_for(options.master, _session_conf(options), app_name="materializer-bench", kafka=bool(options.kafka))


def _summary(epochs: list[dict[str, Any]], big: int, keys: tuple[str, ...]) -> dict[str, Any]:
    big_epochs = [e for e in epochs if e["epoch"] <= big]
    one_row = [e for e in epochs if e["epoch"] == big + 1]
    out: dict[str, Any] = {f"median_{k}_seconds": _median([e[k] for e in big_epochs if k in e]) for k in keys}
    out["one_row_seconds"] = one_row[0]["total"] if one_row else None
    return out


def _cpu(epochs: list[dict[str, Any]], big: int) -> dict[str, Any]:
    """CPU seconds per big epoch, Python and JVM (the approach's process and its JVM): their sum
    over the big epochs divided by their count, not a median, so the figure is what the run cost.
    Ours pipelines: the interval of its epoch N also holds the reading and staging of N+1, so the
    first big epoch's holds two stagings and the last's only its apply (and the one-row epoch's
    staging). Its epochs' CPU differs by design (34, 19 and 9 s in one run); a median of three
    picks the middle interval, one staging and one apply, and leaves out what only the first
    epoch pays (its JVM CPU is higher than two stagings and an apply by about 5 s here; the bare
    path's first epoch pays about 3 s more than its others too)."""
    big_epochs = [e for e in epochs if e["epoch"] <= big]

    def mean(key: str) -> float | None:
        values = [e[key] for e in big_epochs if key in e]
        return sum(values) / len(values) if values else None

    out = {"python_cpu_seconds_per_epoch": mean("python_cpu"), "jvm_cpu_seconds_per_epoch": mean("jvm_cpu")}
    if any("worker_cpu" in e for e in big_epochs):
        out["worker_cpu_seconds_per_epoch"] = mean("worker_cpu")
    return out


def _cpu_total(block: dict[str, Any] | None) -> float | None:
    """Every process's CPU per epoch: the driver's Python, the JVM and Spark's Python workers."""
    if not block or block.get("python_cpu_seconds_per_epoch") is None or block.get("jvm_cpu_seconds_per_epoch") is None:
        return None
    workers = block.get("worker_cpu_seconds_per_epoch") or 0.0
    return float(block["python_cpu_seconds_per_epoch"]) + float(block["jvm_cpu_seconds_per_epoch"]) + float(workers)


def _wall_per_epoch(epochs: list[dict[str, Any]], big: int) -> float | None:
    """Open to the last big epoch's Acknowledged, per big epoch (the pipeline's start-up included)."""
    totals = [e["total"] for e in epochs if e["epoch"] <= big]
    return sum(totals) / len(totals) if len(totals) == big else None


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
            _copy_table(seed, work / approach / "table")

    with phase("bare"):
        bare = run_bare(spark, work / "bare", collection.files, work / "bare" / "table")
    with phase("ours"):
        ours = run_ours(spark, work / "ours", work / "source", work / "ours" / "table", epoch_rows, options)
    cfg = ours.pop("config")
    kafka = None
    if options.kafka:
        _copy_table(seed, work / "kafka" / "table")
        topic = f"materializer-bench-{root.parent.name}-{name}"
        with phase("kafka: produce"):
            result["kafka_produce_seconds"] = produce_topic(options.kafka, topic, options.kafka_partitions, collection.files)
        with phase("kafka"):
            kafka = run_ours(spark, work / "kafka", work / "source", work / "kafka" / "table", epoch_rows, options, topic=topic)
        kafka.pop("config")
    peer = None
    if options.peer:
        with phase("peer"):
            peer = run_peer(spark, work / "peer", work / "source", work / "peer" / "table")
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

    big = options.epochs
    result["ours"] = {
        "seconds": ours["seconds"],
        "epochs": ours["epochs"],
        **_summary(ours["epochs"], big, ("read", "stage", "apply", "total")),
        **_cpu(ours["epochs"], big),
        "steps": {k: {**v, "seconds_per_epoch": v["seconds"] / max(1, len(ours["epochs"]))} for k, v in ours["steps"].items()},
        "median_spark_jobs": _median([e["spark_jobs"] for e in ours["epochs"] if e["epoch"] <= big and e.get("spark_jobs") is not None]),
        "wall_seconds_per_epoch": _wall_per_epoch(ours["epochs"], big),
    }
    result["bare"] = {
        "seconds": bare["seconds"],
        "epochs": bare["epochs"],
        **_summary(bare["epochs"], big, ("stage", "merge", "total")),
        **_cpu(bare["epochs"], big),
        "median_merge_spark_jobs": _median([e["merge_jobs"] for e in bare["epochs"] if e["epoch"] <= big and "merge_jobs" in e]),
    }
    if peer is not None:
        result["peer"] = {
            "seconds": peer["seconds"], "epochs": peer["epochs"], **_summary(peer["epochs"], big, ("foreach_batch", "total")),
            **_cpu(peer["epochs"], big),
        }
    if kafka is not None:
        result["kafka"] = {
            "seconds": kafka["seconds"],
            "epochs": kafka["epochs"],
            "partitions": options.kafka_partitions,
            **_summary(kafka["epochs"], big, ("read", "stage", "apply", "total")),
            "wall_seconds_per_epoch": _wall_per_epoch(kafka["epochs"], big),
        }
    if replay is not None:
        result["replay"] = replay
    if recovery is not None:
        result["recovery"] = recovery

    o, b = result["ours"], result["bare"]
    p = result.get("peer")
    big_rows = epoch_rows
    for block in [o, b] + ([p] if p else []) + ([result["kafka"]] if "kafka" in result else []):
        median_total = block.get("median_total_seconds")
        block["rows_per_second"] = big_rows / median_total if median_total else None
    result["ratios"] = {
        # ours end to end vs the same rows read, deduplicated, staged and MERGEd without the machinery
        "ours_over_bare": _ratio(o["median_total_seconds"], b["median_total_seconds"]),
        # our apply phase vs the bare MERGE of staged rows: the floor our apply cannot beat
        "ours_apply_over_bare_merge": _ratio(o["median_apply_seconds"], b["median_merge_seconds"]),
        # ours end to end vs the bare MERGE alone
        "ours_over_bare_merge": _ratio(o["median_total_seconds"], b["median_merge_seconds"]),
        "ours_over_peer": _ratio(o["median_total_seconds"], p["median_total_seconds"]) if p else None,
        # CPU seconds (Python + JVM + Python workers) per epoch: steadier than wall time on a shared machine
        "cpu_ours_over_bare": _ratio(_cpu_total(o), _cpu_total(b)),
        "cpu_ours_over_peer": _ratio(_cpu_total(o), _cpu_total(p)) if p else None,
        "one_row_ours_over_peer": _ratio(o["one_row_seconds"], p["one_row_seconds"]) if p else None,
        # the same documents from a topic vs from files, both ours end to end
        "kafka_over_files": _ratio(result["kafka"]["median_total_seconds"], o["median_total_seconds"]) if "kafka" in result else None,
    }
    if sampler is not None:
        result["memory"] = {k.split("/", 1)[1]: v for k, v in sampler.peaks.items() if k.startswith(name + "/")}
    return result


def warmup(spark: "SparkSession", work: Path, options: BenchOptions) -> float:
    """Every path once on a tiny table; nothing of it is reported but its duration."""
    started = time.monotonic()
    collection = generate_collection(work / "source", 2_000, 200, 1, (0.5, 0.4, 0.1), options.seed)
    seed_table(spark, work / "seed", 2_000, options.deletion_vectors)
    for approach in ("ours", "bare", "peer"):
        _copy_table(work / "seed", work / approach / "table")
    run_bare(spark, work / "bare", collection.files, work / "bare" / "table")
    run_ours(spark, work / "ours", work / "source", work / "ours" / "table", 200, options)
    if options.peer:
        run_peer(spark, work / "peer", work / "source", work / "peer" / "table")
    shutil.rmtree(work, ignore_errors=True)
    return time.monotonic() - started


def machine() -> dict[str, Any]:
    from materializer.extras import require

    psutil = require("psutil", purpose="the benchmark's machine description")

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "load_average": list(os.getloadavg()),
    }
    try:
        import pyspark

        info["pyspark"] = pyspark.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        info["delta_spark"] = version("delta-spark")
    except Exception:  # noqa: BLE001
        pass
    cpu = Path("/proc/cpuinfo")
    if cpu.exists():
        for line in cpu.read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    return info


def goals(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the largest epochs measured (reported, never asserted)."""
    out: list[dict[str, Any]] = []
    if not configs:
        return out
    largest = max(c["epoch_rows"] for c in configs)
    at_largest = [c for c in configs if c["epoch_rows"] == largest]
    for c in at_largest:
        ratio = c["ratios"]["ours_over_bare"]
        out.append(
            {
                "goal": "machinery overhead over the bare path <= 15% (target stated at 1M-row epochs)",
                "config": c["name"],
                "value": None if ratio is None else ratio - 1,
                "met": None if ratio is None else ratio - 1 <= 0.15,
            }
        )
        if c["ratios"]["ours_over_peer"] is not None:
            ratio = c["ratios"]["ours_over_peer"]
            out.append({"goal": "throughput >= the peer's (ours/peer time <= 1)", "config": c["name"], "value": ratio, "met": ratio <= 1.0})
    for c in configs:
        if "replay" in c and c["replay"]["reapply_seconds"] is not None:
            value = c["replay"]["reapply_seconds"]
            out.append({"goal": "replayed epoch < 1 s", "config": c["name"], "value": value, "met": value < 1.0})
    return out


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
            say("warm-up (every path once on a 2k-row table) …")
            with sampler.phase("warmup"):
                report["warmup_seconds"] = warmup(spark, root / "data" / "warmup", options)
            say(f"warm-up: {report['warmup_seconds']:.1f}s")
        for table_rows in options.table_rows:
            for epoch_rows in options.epoch_rows:
                result = bench_config(spark, root / "data", table_rows, epoch_rows, options, sampler, say)
                report["configs"].append(result)
                # Written after every configuration, so a long full run that is cut short keeps its figures.
                _write(root, report)
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
    _write(root, report)
    report["paths"] = {"json": str(root / "report.json"), "chart": str(root / "bench.png")}
    try:
        chart(report, root / "bench.png")
    except Exception as exc:  # noqa: BLE001 - the figures matter more than the picture
        say(f"chart not written: {exc}")
        report["paths"]["chart"] = None
    _write(root, report)
    if not options.keep_data:
        shutil.rmtree(root / "data", ignore_errors=True)
    return report


def _write(root: Path, report: dict[str, Any]) -> None:
    tmp = root / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(root / "report.json")


# --- presentation ---------------------------------------------------------------------------------


FIXED_COSTS = ("replay (ours, warm)", "replay (fresh process)", "1-row epoch (ours)", "1-row batch (peer)", "restart after kill")


def fixed_costs(c: dict[str, Any]) -> list[float | None]:
    """The right panel's figures for one configuration, in FIXED_COSTS order; None: not measured
    (e.g. ``--no-recovery``, no peer), which the chart must not draw as a value."""
    values = [
        (c.get("replay") or {}).get("reapply_seconds"),
        (c.get("recovery") or {}).get("replay_restart_seconds"),
        c["ours"].get("one_row_seconds"),
        (c.get("peer") or {}).get("one_row_seconds"),
        (c.get("recovery") or {}).get("restart_seconds"),
    ]
    return [float(v) if isinstance(v, (int, float)) else None for v in values]


def chart(report: dict[str, Any], path: Path) -> None:
    from materializer.extras import require

    require("matplotlib", purpose="the benchmark's chart")
    fig = chart_figure(report)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_figure(report: dict[str, Any]) -> Any:
    """The bench's figure (matplotlib), before it is saved."""
    from materializer.extras import require

    matplotlib = require("matplotlib", purpose="the benchmark's chart")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configs"]
    names = [c["name"] for c in configs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(9, 3 * len(names) + 4), 4.5))
    x = list(range(len(names)))
    width = 0.27
    # Left: median epoch time, ours split into its phases, bare into stage + merge, peer whole.
    # Ours as one bar: its phases overlap (epoch N is applied while N+1 is read), so they do not stack.
    ours = [c["ours"].get("median_total_seconds") or 0 for c in configs]
    apply = [c["ours"].get("median_apply_seconds") or 0 for c in configs]
    left.bar([i - width for i in x], ours, width, color="#4292c6", label="ours: epoch (pipelined)")
    left.bar([i - width for i in x], apply, width * 0.4, color="#08519c", label="ours: of which apply")
    stage = [c["bare"].get("median_stage_seconds") or 0 for c in configs]
    merge = [c["bare"].get("median_merge_seconds") or 0 for c in configs]
    left.bar(x, stage, width, color="#fdae6b", label="bare: stage")
    left.bar(x, merge, width, bottom=stage, color="#e6550d", label="bare: MERGE")
    if any("peer" in c for c in configs):
        peer = [c.get("peer", {}).get("median_total_seconds") or 0 for c in configs]
        left.bar([i + width for i in x], peer, width, color="#31a354", label="peer: foreachBatch")
    left.set_xticks(x, names, rotation=15)
    left.set_ylabel("median seconds per epoch")
    left.set_title("Epoch time")
    left.legend(fontsize=7)
    # Right: fixed costs: replay, one-row epoch, recovery restart.
    labels = list(FIXED_COSTS)
    step = 0.8 / len(configs)
    for i, c in enumerate(configs):
        values = fixed_costs(c)
        # Only what was measured is drawn; a figure not measured is said so, never drawn as a bar
        # (a log axis has no zero: a placeholder value would look like a real, tiny cost).
        measured = [(j, v) for j, v in enumerate(values) if v is not None and v > 0]
        bars = right.bar([j + i * step for j, _ in measured], [v for _, v in measured], step, label=c["name"])
        colour = bars.patches[0].get_facecolor() if bars.patches else None
        for j, v in enumerate(values):
            if v is None:
                right.text(j + i * step, 0.02, "not measured", transform=right.get_xaxis_transform(), rotation=90,
                           ha="center", va="bottom", fontsize=6, color=colour or "grey")
    right.set_xticks(range(len(labels)), labels, rotation=15, fontsize=8)
    # Log scale: a replay (tenths of a second) and a restart (a JVM start and a MERGE) on one axis.
    right.set_yscale("log")
    right.set_ylabel("seconds (log)")
    right.set_title("Fixed costs")
    right.legend(fontsize=7)
    fig.suptitle(f"materializer bench ({report['options']['mode']}), {report['machine'].get('cpus')} CPUs")
    fig.tight_layout()
    return fig


def _per_million(value: float | None, documents: int) -> float | None:
    return None if value is None or not documents else value * 1_000_000 / documents


def _fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "n":
        return f"{value:.0f}"
    if unit == "rows/s":
        return f"{value:,.0f}"
    return f"{value:.2f}"


def summary_table(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The summary: one row per figure, one column per configuration (medians over big epochs)."""
    configs = report["configs"]
    figures: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("epoch documents", lambda c: f"{c['epoch_rows']:,}"),
        ("table rows (seeded)", lambda c: f"{c['table_rows']:,}"),
        ("ours: s/epoch end to end", lambda c: _fmt(c["ours"]["median_total_seconds"])),
        ("  read (list, Spark checks; overlaps apply)", lambda c: _fmt(c["ours"]["median_read_seconds"])),
        ("  Python (driver) CPU s/epoch", lambda c: _fmt(c["ours"].get("python_cpu_seconds_per_epoch"))),
        ("  Python CPU s per 1M documents", lambda c: _fmt(_per_million(c["ours"].get("python_cpu_seconds_per_epoch"), c["epoch_rows"]))),
        ("  JVM CPU s/epoch", lambda c: _fmt(c["ours"].get("jvm_cpu_seconds_per_epoch"))),
        ("  Python workers' CPU s/epoch", lambda c: _fmt(c["ours"].get("worker_cpu_seconds_per_epoch"))),
        ("  stage (parse, wait, Parquet, log)", lambda c: _fmt(c["ours"]["median_stage_seconds"])),
        ("  apply (checks, MERGE, GC)", lambda c: _fmt(c["ours"]["median_apply_seconds"])),
        ("  wall: Open to last big epoch / epochs", lambda c: _fmt(c["ours"].get("wall_seconds_per_epoch"))),
        ("  Spark jobs/epoch", lambda c: _fmt(c["ours"].get("median_spark_jobs"), "n")),
        ("bare: s/epoch (stage + MERGE)", lambda c: _fmt(c["bare"]["median_total_seconds"])),
        ("  bare MERGE alone", lambda c: _fmt(c["bare"]["median_merge_seconds"])),
        ("  Spark jobs/MERGE", lambda c: _fmt(c["bare"].get("median_merge_spark_jobs"), "n")),
        ("  bare CPU s/epoch: Python / JVM / workers", lambda c: _cpu_parts(c["bare"])),
        ("peer: s/batch (trigger)", lambda c: _fmt((c.get("peer") or {}).get("median_total_seconds"))),
        ("  peer CPU s/batch: Python / JVM / workers", lambda c: _cpu_parts(c.get("peer") or {})),
        ("ours rows/s", lambda c: _fmt(c["ours"]["rows_per_second"], "rows/s")),
        ("bare rows/s", lambda c: _fmt(c["bare"]["rows_per_second"], "rows/s")),
        ("peer rows/s", lambda c: _fmt((c.get("peer") or {}).get("rows_per_second"), "rows/s")),
        ("ours from Kafka: s/epoch end to end", lambda c: _fmt((c.get("kafka") or {}).get("median_total_seconds"))),
        ("  read (offsets, Spark reads + checks)", lambda c: _fmt((c.get("kafka") or {}).get("median_read_seconds"))),
        ("ours from Kafka rows/s", lambda c: _fmt((c.get("kafka") or {}).get("rows_per_second"), "rows/s")),
        ("Kafka / files (ours)", lambda c: _fmt(c["ratios"].get("kafka_over_files"), "x")),
        ("ours / bare", lambda c: _fmt(c["ratios"]["ours_over_bare"], "x")),
        ("ours apply / bare MERGE", lambda c: _fmt(c["ratios"]["ours_apply_over_bare_merge"], "x")),
        ("ours / bare MERGE", lambda c: _fmt(c["ratios"]["ours_over_bare_merge"], "x")),
        ("ours / peer", lambda c: _fmt(c["ratios"]["ours_over_peer"], "x")),
        ("ours / bare, CPU s (Python + JVM + workers)", lambda c: _fmt(c["ratios"].get("cpu_ours_over_bare"), "x")),
        ("ours / peer, CPU s (Python + JVM + workers)", lambda c: _fmt(c["ratios"].get("cpu_ours_over_peer"), "x")),
        ("replayed epoch: re-ack s (whole run, jobs)", lambda c: _replay(c)),
        ("replay in a fresh process: restart s (in-run s)", lambda c: _recovery(c, "replay_restart")),
        ("one-row epoch: ours s", lambda c: _fmt(c["ours"]["one_row_seconds"])),
        ("one-row epoch: bare s", lambda c: _fmt(c["bare"]["one_row_seconds"])),
        ("one-row batch: peer s", lambda c: _fmt((c.get("peer") or {}).get("one_row_seconds"))),
        ("kill mid-apply: restart s (in-run s)", lambda c: _recovery(c, "restart")),
        ("peak driver RSS MB", lambda c: _memory(c, "python_rss")),
        ("peak JVM RSS MB", lambda c: _memory(c, "jvm_rss")),
        ("tables agree", lambda c: "yes" if c.get("tables_agree") else "NO"),
    ]
    header = ["figure"] + [c["name"] for c in configs]
    rows = [[label] + [get(c) for c in configs] for label, get in figures]
    return header, rows


def _cpu_parts(block: dict[str, Any]) -> str:
    keys = ("python_cpu_seconds_per_epoch", "jvm_cpu_seconds_per_epoch", "worker_cpu_seconds_per_epoch")
    return " / ".join(_fmt(block.get(k)) for k in keys)


def _replay(c: dict[str, Any]) -> str:
    replay = c.get("replay")
    if not replay:
        return "-"
    jobs = replay.get("spark_jobs")
    return f"{_fmt(replay.get('reapply_seconds'))} (run {_fmt(replay.get('run_seconds'))}, {'?' if jobs is None else jobs} jobs)"


def _recovery(c: dict[str, Any], which: str) -> str:
    recovery = c.get("recovery")
    if not recovery:
        return "-"
    return f"{_fmt(recovery.get(f'{which}_seconds'))} ({_fmt(recovery.get(f'{which}_run_seconds'))})"


def _memory(c: dict[str, Any], kind: str) -> str:
    # In-process phases only: the recovery subprocesses have their own driver and JVM.
    values = [v[kind] for k, v in (c.get("memory") or {}).items() if not k.startswith("recovery-")]
    return f"{max(values) / 2**20:.0f}" if values else "-"
