"""What the benchmark measures and how: CPU seconds of the driver's Python, the Spark JVM and its
Python workers; peak memory per phase; Spark jobs per step; per-epoch phases from the runtime's
events; the spans the core emits."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from materializer import events
from materializer.events import Collector, Event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# --- the bench's own CPU ------------------------------------------------------------------------


class _OwnCpu:
    """CPU seconds this process spends measuring (the samplers' threads, :func:`cpu_seconds`
    itself), taken off the driver's Python figure: they are the bench's work, not the pipeline's,
    and they grow with an epoch's wall time (the memory sampler reads the process tree five times a
    second), so left in they charged the slower configurations more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


OWN_CPU = _OwnCpu()


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
            started = time.thread_time()
            self.sample()
            OWN_CPU.add(time.thread_time() - started)

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

    Read from the scheduler's own counter: exact at once, in three py4j calls. The status
    tracker, the fallback, hears of a job only when the listener bus delivers its start, and
    PySpark reads its lists of a job group's ids one element per py4j call (a search cost more with
    every job the session had run, charged to ours' driver Python and JVM). What a reading costs
    this process is the bench's own (:data:`OWN_CPU`).
    """
    started = time.thread_time()
    try:
        context = spark.sparkContext
        try:
            # An AtomicInteger, which py4j hands over as a number. A bench tool may read Spark's
            # internals.
            return int(context._jsc.sc().dagScheduler().nextJobId())
        except Exception:  # noqa: BLE001 - another Spark: the status tracker
            pass
        tracker = context.statusTracker()
        ids = [i for group in JOB_GROUPS for i in tracker.getJobIdsForGroup(group)]
        candidate = max(ids) + 1 if ids else 0
        # Jobs of other groups (a streaming query's) may be newer: ids are contiguous, so probe on.
        while tracker.getJobInfo(candidate) is not None:
            candidate += 1
        return candidate
    except Exception:  # noqa: BLE001 - no status tracker (Spark Connect)
        return None
    finally:
        OWN_CPU.add(time.thread_time() - started)


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


# --- CPU ------------------------------------------------------------------------------------------


class WorkerCpu:
    """The CPU seconds of Spark's Python workers, the JVM's child processes, exited ones included.

    A worker's seconds cannot be read once it has exited, and its parent does not keep them:
    ``pyspark.daemon`` ignores SIGCHLD, so the kernel reaps the workers it forks and discards
    their times (a bench run showed the workers' sum fall by 1.8 s over an epoch when it was read
    from live processes only). So a thread samples every process under the JVM every
    ``interval`` seconds and keeps each one's last reading: an exited worker counts with what it
    had used at the last sample before it ended (at most ``interval`` of CPU short). The
    sampler's own CPU is not charged to the driver's Python (:data:`OWN_CPU`)."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self.interval = interval
        self._seen: dict[tuple[int, float], float] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="bench-worker-cpu", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            started = time.thread_time()
            self.sample()
            OWN_CPU.add(time.thread_time() - started)
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
    started = time.thread_time()
    if _workers is None:
        _workers = WorkerCpu()
    jvm, workers = _workers.sample()
    times = psutil.Process().cpu_times()
    mine = times.user + times.system
    # Charged from the next reading on: this one's CPU falls after the process's figure was read.
    own = OWN_CPU.seconds
    OWN_CPU.add(time.thread_time() - started)
    return mine - own, jvm, workers


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


def cpu_delta(before: tuple[float, ...], after: tuple[float, ...]) -> dict[str, float]:
    """The CPU seconds between two :func:`cpu_seconds` readings, by process kind."""
    names = ("python_cpu", "jvm_cpu", "worker_cpu")
    return {name: b - a for name, a, b in zip(names, before, after)}


# --- per epoch and per step -----------------------------------------------------------------------


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
            figures = cpu_delta(cpu_at[start], cpu_at[acked])
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
