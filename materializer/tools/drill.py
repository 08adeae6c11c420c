"""Recovery drills: kill the real ``materializer run`` over and over, then prove nothing was lost.

A drill never touches the pipeline it is given. It copies the configuration into a scratch folder
(``--workdir``, a temp folder by default) with the recovery log, the staging store and every table
rewritten to live there; the sources are only read (their files are immutable). Then:

``kills`` (the default scenario)
    runs ``python -m materializer_cli run --config <scratch>`` in its own process group, once per planned
    kill: first one kill at each named failure point (``MATERIALIZER_CRASH_AT``, so successive
    restarts chain through the points on one pipeline), then ``--kills`` random SIGKILLs of the
    whole group (the JVM included), most of them timed after an epoch's log commit so they land
    while the MERGE runs. It restarts until a run exits 0 (sources drained). If the sources drain
    before the plan is done, the round is verified and a fresh round starts.
``zombie``
    two runs of one pipeline at once: A is paused (SIGSTOP) right after committing an epoch, B
    opens (fencing A), runs to the end; A is resumed (SIGCONT) and must stop with FencedError
    (exit 4) having applied nothing more.
``damage``
    damages the recovery log (a torn entry, a corrupted one) and the staging store (a staged file
    deleted, one truncated) right before their apply; each must stop the next run with its error
    (exit 5 / 6, never a silent skip), then ``materializer recover`` must repair it, and the final
    tables must equal the oracle.

Every round is verified the same way (:func:`verify`): each table against the oracle (rows lost,
duplicated or wrong, by key), each epoch at most once in each table's Delta history, the epoch the
table records against the recovery log's, no orphaned staged file, and a log that reads back whole.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

import yaml

from materializer import crash, events
from materializer.tools import oracle
from materializer.config import PipelineConfig, load_config, parse_config
from materializer.errors import FencedError, MaterializerError, RecoveryLogError, StagingError
from materializer.events import Collector, Event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[2]  # the checkout: materializer/tools/<this file>
SCENARIOS = ("kills", "zombie", "damage")
DAMAGES = ("torn-log", "corrupt-log", "missing-staged", "truncated-staged")
KILLED = -signal.SIGKILL

BETWEEN_BINDINGS = "between two bindings' applies"
"""A kill with some of an epoch's tables applied and others not (``after-apply`` and random kills)."""
OVERLAP = "apply N while reading N+1"
"""A kill while epoch N's tables are applied and epoch N+1 is already being read."""
BETWEEN_EPOCHS = "between epochs"
"""A kill after an epoch's last apply and before the next epoch's log commit."""
WINDOWS = (BETWEEN_BINDINGS, OVERLAP, BETWEEN_EPOCHS)

RUN_EVENTS = ("--all-events",)
"""What the drill adds to ``materializer run``: every typed event as a JSON line on stdout (the
human lines stay on stderr). The drill times its kills from these records, never from the text."""


class DrillError(MaterializerError):
    """The drill itself could not run (bad work folder, a run that never ends)."""

    exit_code = 2


# --- plans and records -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How one run of the pipeline is to die."""

    kind: str
    """``point`` (MATERIALIZER_CRASH_AT), ``random`` (SIGKILL of the group by the drill), ``drain``."""
    point: str | None = None
    """``point``: the failure point (optionally ``point:epoch``)."""
    trigger: str = ""
    """``random``: the event the delay counts from: ``opened``, ``read`` or ``committed``."""
    occurrence: int = 1
    """``random``: which occurrence of the trigger event in the run."""
    delay: float = 0.0
    """``random``: seconds after the trigger; ``committed`` delays fall in the apply (MERGE) window."""

    @property
    def label(self) -> str:
        if self.kind == "point":
            return f"point {self.point}"
        if self.kind == "random":
            return f"random kill {self.delay:.2f}s after {self.trigger} #{self.occurrence}"
        return "drain"


@dataclass
class RunRecord:
    round: int
    index: int
    plan: str
    kind: str
    point: str | None
    exit_code: int | None
    outcome: str
    """killed (by its crash point or the drill), finished (exit 0), failed (an error exit), hung."""
    landed: str = ""
    """Where a kill landed: startup, re-apply, read/stage/commit, apply, after-apply."""
    window: str = ""
    """The window between steps a kill fell in (one of :data:`WINDOWS`), if any."""
    seconds: float = 0.0
    committed: list[int] = field(default_factory=list)
    """Epochs this run committed to the recovery log."""
    error: str = ""
    """The last lines of output of a failed run."""
    events: dict[str, int] = field(default_factory=dict)
    """How often the run printed each event the drill times kills from (opened, read, committed, applied)."""


# --- the drill's own events (for `materializer drill`'s display) -------------------------------


@dataclass(frozen=True)
class RoundStarted(Event):
    kind: ClassVar[str] = "round"
    round: int
    workdir: str


@dataclass(frozen=True)
class RunStarted(Event):
    kind: ClassVar[str] = "run"
    index: int
    plan: str


@dataclass(frozen=True)
class RunEnded(Event):
    kind: ClassVar[str] = "ran"
    record: "RunRecord"


@dataclass(frozen=True)
class Verifying(Event):
    kind: ClassVar[str] = "verifying"
    round: int


@dataclass(frozen=True)
class Verified(Event):
    kind: ClassVar[str] = "verified"
    verification: "Verification"


@dataclass(frozen=True)
class Damaged(Event):
    kind: ClassVar[str] = "damaged"
    damage: str
    what: str


@dataclass
class TableCheck:
    binding: str
    table: str
    verified: bool
    reason: str = ""
    expected_rows: int = 0
    actual_rows: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    lost: list[dict[str, Any]] = field(default_factory=list)
    duplicated: list[dict[str, Any]] = field(default_factory=list)
    wrong: list[dict[str, Any]] = field(default_factory=list)
    recorded_epoch: int | None = None
    """The txnVersion Delta records for the pipeline."""
    expected_epoch: int | None = None
    """The last epoch with input for this binding (oracle), when known."""
    history_epochs: int = 0
    epochs_applied_twice: list[int] = field(default_factory=list)
    epochs_missing: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class Verification:
    round: int
    last_epoch: int = 0
    """The recovery log's last committed epoch."""
    log_entries: int = 0
    log_problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    tables: list[TableCheck] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        out = list(self.log_problems)
        if self.orphans:
            out.append(f"{len(self.orphans)} orphaned file(s) in the staging store: {', '.join(self.orphans[:5])}")
        for t in self.tables:
            out += [f"{t.binding}: {p}" for p in t.problems]
        return out

    @property
    def verdict(self) -> str:
        if self.problems:
            return "FAIL"
        if any(not t.verified for t in self.tables):
            return "not verified"
        return "pass"


@dataclass
class DrillReport:
    scenario: str
    config: str
    workdir: str
    seed: int
    started_at: str
    runs: list[RunRecord] = field(default_factory=list)
    rounds: list[Verification] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Failures of the drill's own expectations (a run that should have been fenced, …)."""
    unreachable: dict[str, str] = field(default_factory=dict)
    """Failure points (and random kills) this configuration cannot reach, and why."""
    missed: list[str] = field(default_factory=list)
    """Planned kills that did not land (the run drained first, even fitted to a fresh pipeline):
    timing, not a fault of the pipeline; the verdict is about the tables."""
    epoch_sizes: list[str] = field(default_factory=list)
    """What the drill counted in the sources and set on the scratch copy (:func:`epoch_sizes`)."""
    seconds: float = 0.0
    report_path: str = ""
    stopped_early: bool = False
    """SIGUSR1 cut the kill plan short; the verdict covers the kills made."""

    @property
    def verdict(self) -> str:
        if self.problems or any(r.verdict == "FAIL" for r in self.rounds) or not self.rounds:
            return "FAIL"
        if any(r.verdict == "not verified" for r in self.rounds):
            return "not verified"
        return "pass"

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "FAIL": 1}.get(self.verdict, 3)

    def kills(self) -> Counter[str]:
        """Kills per failure point, and random kills per place they landed."""
        out: Counter[str] = Counter()
        for r in self.runs:
            if r.outcome != "killed":
                continue
            out[r.point if r.kind == "point" and r.point else f"random ({r.landed or 'unknown'})"] += 1
        return out

    def windows(self) -> dict[str, int | str]:
        """Kills per window between steps; a window this configuration cannot reach says why, and
        a window no kill fell in reads 0 (never hit: the verdict says nothing about it)."""
        hit = Counter(r.window for r in self.runs if r.outcome == "killed" and r.window)
        return {w: self.unreachable.get(w, hit[w]) for w in WINDOWS}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict
        data["windows"] = self.windows()
        data["kills"] = dict(self.kills())
        data["kills_total"] = sum(self.kills().values())
        data["restarts"] = max(0, len(self.runs) - len(self.rounds))
        data["rows"] = {
            "lost": sum(t.counts.get("lost", 0) for v in self.rounds for t in v.tables),
            "duplicated": sum(t.counts.get("duplicated", 0) for v in self.rounds for t in v.tables),
            "wrong": sum(t.counts.get("wrong", 0) for v in self.rounds for t in v.tables),
        }
        for v, out in zip(self.rounds, data["rounds"]):
            out["verdict"] = v.verdict
            out["problems"] = v.problems
        return data


@dataclass
class DrillOptions:
    config: Path
    workdir: Path | None = None
    """Scratch folder (must be empty or absent); None: a temp folder, deleted after a passing drill."""
    scenario: str = "kills"
    kills: int = 3
    """Random kills (scenario ``kills``)."""
    seed: int = 0
    points: list[str] | None = None
    """Failure points to kill at once each (None: every point the configuration can reach)."""
    damages: list[str] | None = None
    """Scenario ``damage``: which damages (None: all)."""
    max_documents: int | None = None
    """Override ``transaction.max_documents`` (cdcv2, kafka: more, smaller epochs give the kills more to hit)."""
    max_files: int | None = None
    """Override ``source.max_files`` of documents bindings (their epochs are whole files)."""
    max_records: int | None = None
    """Override ``source.max_records`` of kafka bindings (documents and debezium payloads)."""
    min_epochs: int = 5
    """Unless an override above is given: epoch sizes chosen so a round has at least this many
    epochs (:func:`epoch_sizes`), so kills fall between epochs and not only inside the one."""
    run_timeout: float = 900.0
    """A single run taking longer than this is a hang: the drill kills it and fails."""
    reader: str = "spark"
    """How the verification reads the tables' rows: ``spark`` or ``deltalake`` (delta-rs)."""
    remote: str | None = None
    """A Spark Connect server (``sc://host:port``): every run is ``materializer run --remote``, so a
    kill ends the client only and the server's operation runs on; the drill verifies through it too."""
    keep: bool = False
    report: Path | None = None


# --- the scratch copy of the pipeline ----------------------------------------------------------


def _absolute(path: str) -> str:
    if "://" in path or path.startswith(("dbfs:", "/")):
        return path
    return os.path.abspath(path)


def scratch_config(
    config: PipelineConfig, root: Path, max_documents: int | None = None, max_files: int | None = None,
    max_records: int | None = None, remote: str | None = None,
) -> dict[str, Any]:
    """The configuration with its log, staging and tables moved under ``root``; sources unchanged."""
    # Only what the file set: a dump of every default would name other formats' settings (a
    # documents source with kafka's `starting`), which the configuration refuses.
    data = config.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["recovery_log"] = str(root / "log")
    data["staging"] = str(root / "staging")
    for binding in data["bindings"]:
        binding["table"] = str(root / "tables" / binding["name"])
        if binding["source"].get("path") is not None:
            binding["source"]["path"] = _absolute(binding["source"]["path"])
    if max_documents:
        data.setdefault("transaction", {})["max_documents"] = max_documents
    if max_files:
        for binding in data["bindings"]:
            if binding["source"]["format"] == "documents":
                binding["source"]["max_files"] = max_files
    if remote:
        # Every command of the round (run, recover) then runs on the server: a kill ends the client.
        data.setdefault("spark", {})["remote"] = remote
    if max_records:
        for binding in data["bindings"]:
            if binding["source"]["format"] == "kafka" and binding["source"].get("payload", "documents") != "cdcv2":
                binding["source"]["max_records"] = max_records
    return data


@dataclass(frozen=True)
class EpochSizes:
    """What the drill sets on its scratch copy so a round has several epochs."""

    max_documents: int | None = None
    max_files: int | None = None
    max_records: int | None = None
    notes: tuple[str, ...] = ()
    """One line per choice, said in the report: what was counted and what was set."""


def _documents_files(binding: Any) -> int:
    from materializer.sources.documents import is_document_file
    from materializer.storage import open_store

    return sum(1 for f in open_store(binding.source.path).list() if is_document_file(f.path))


def _cdcv2_statements(binding: Any) -> int:
    from materializer.storage import open_store

    store = open_store(binding.source.path)
    return sum(store.get(f.path).count(b"\n") for f in store.list() if not f.path.rsplit("/", 1)[-1].startswith((".", "_")))


def _kafka_records(binding: Any) -> int:
    from materializer.sources.kafka import Offsets

    source = binding.source
    offsets = Offsets(source.bootstrap_servers, dict(source.client_options), f"binding {binding.name}")
    return sum(high - low for low, high in offsets.watermarks(source.topic_names).values())


def epoch_sizes(config: PipelineConfig, options: "DrillOptions") -> EpochSizes:
    """Epoch sizes that give a round at least ``options.min_epochs`` epochs, from what the sources
    hold now (files of a documents folder, statements of a CDC v2 folder, records of the topics);
    an override the user gave is kept as given. A source that cannot be counted keeps its sizes,
    and the note says so."""
    aim = max(1, options.min_epochs)
    notes: list[str] = []
    given = {k: v for k, v in (("max_files", options.max_files), ("max_documents", options.max_documents), ("max_records", options.max_records)) if v}
    if given:
        notes.append("epoch sizes as given: " + ", ".join(f"{k} {v}" for k, v in given.items()))
        return EpochSizes(options.max_documents, options.max_files, options.max_records, tuple(notes))
    max_files: int | None = None
    max_documents: int | None = None
    max_records: int | None = None
    for binding in config.bindings:
        source = binding.source
        try:
            if source.format == "documents":
                files = _documents_files(binding)
                if files and -(-files // source.max_files) < aim:
                    fit = max(1, files // aim)
                    max_files = fit if max_files is None else min(max_files, fit)
                notes.append(f"{binding.name}: {files} document files, {source.max_files} an epoch")
            elif source.format == "cdcv2" or (source.format == "kafka" and source.payload == "cdcv2"):
                statements = _cdcv2_statements(binding) if source.format == "cdcv2" else _kafka_records(binding)
                if statements and -(-statements // config.transaction.max_documents) < aim:
                    fit = max(1, statements // aim)
                    max_documents = fit if max_documents is None else min(max_documents, fit)
                notes.append(f"{binding.name}: {statements} CDC v2 statements")
            elif source.format == "kafka":
                records = _kafka_records(binding)
                per_epoch = source.max_records or config.transaction.max_documents
                if records and -(-records // per_epoch) < aim:
                    fit = max(1, records // aim)
                    max_records = fit if max_records is None else min(max_records, fit)
                notes.append(f"{binding.name}: {records} records in its topics")
        except Exception as exc:  # noqa: BLE001 - a source the drill cannot count keeps its sizes
            notes.append(f"{binding.name}: not counted ({str(exc).splitlines()[0][:200]}); its epoch sizes are kept")
    current = {
        "max_files": [b.source.max_files for b in config.bindings if b.source.format == "documents"],
        "max_documents": [config.transaction.max_documents],
        "max_records": [b.source.max_records or config.transaction.max_documents for b in config.bindings if b.source.format == "kafka"],
    }
    chosen = [
        f"{k} {v}" for k, v in (("max_files", max_files), ("max_documents", max_documents), ("max_records", max_records))
        if v and any(v != c for c in current[k])
    ]
    notes.append(
        (f"set {', '.join(chosen)} so a round has at least {aim} epochs" if chosen else f"the configured sizes kept (as small as the sources allow, or already {aim} epochs or more)")
        + " (--max-files / --max-documents / --max-records to choose)"
    )
    return EpochSizes(max_documents, max_files, max_records, tuple(notes))


def unreachable_points(config: PipelineConfig) -> dict[str, str]:
    out = {}
    if not any(b.needs_loads for b in config.bindings):
        out["mid-load"] = "no binding loads current rows (standard mode with a non-lastWriteWins reduction)"
    if len(config.bindings) < 2:
        out["after-apply"] = "fires between two bindings' applies; the pipeline has one binding"
        out[BETWEEN_BINDINGS] = "the pipeline has one binding"
    return out


# --- one run of the real CLI -------------------------------------------------------------------


_LIVE: "set[_Child]" = set()
"""Runs started and not yet finished: a drill that is interrupted kills their groups."""


class _Child:
    """``materializer <args>`` in its own session and process group, its output read line by line.

    Two pipes: stdout carries the run's JSON event records (``--all-events``), stderr the human
    lines and any error. Both go to the run's log file; ``lines`` gets ``(time seen, event, line)``,
    ``event`` the typed event of a record (None for any other line).
    """

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.lines: "queue.Queue[tuple[float, Event | None, str] | None]" = queue.Queue()
        self.output: list[str] = []
        """The run's lines that are not event records (its human text, its errors)."""
        self._log_lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "materializer_cli", *args],
            cwd=os.getcwd(),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own group: killpg reaches the JVM too, and only ours
        )
        _LIVE.add(self)
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True) for stream in (self.proc.stdout, self.proc.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in stream:
                with self._log_lock:
                    log.write(line)
                    log.flush()  # readable while the run is still going (or paused)
                line = line.rstrip("\n")
                self.lines.put((time.monotonic(), read_event(line), line))
        self.lines.put(None)

    def items(self, timeout: float | None = None) -> "Iterator[tuple[float, Event | None, str]]":
        """The lines as they come, until both pipes end (``queue.Empty`` after ``timeout`` of silence)."""
        ended = 0
        while ended < len(self._readers):
            item = self.lines.get(timeout=timeout)
            if item is None:
                ended += 1
                continue
            yield item

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self) -> int:
        code = self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        _LIVE.discard(self)
        # A run killed by SIGKILL may leave its JVM behind if the kill raced its start: end the
        # group we started (only it: its id is the child's pid).
        self.signal_group(signal.SIGKILL)
        return code


def read_event(line: str) -> Event | None:
    """The typed event of one line of a run's ``--all-events`` output; None for any other line
    (a human line, a kind this version does not know, a record torn by a kill)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        record = json.loads(text)
        return events.from_record(record) if isinstance(record, dict) else None
    except ValueError:
        return None


def child_env(crash_at: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(crash.ENV, None)
    if crash_at:
        env[crash.ENV] = crash_at
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Phase:
    """Follows a run's event lines to say where the run stands (for where a kill landed)."""

    def __init__(self, bindings: int) -> None:
        self.bindings = bindings
        self.phase = "startup"
        self.applied_in_epoch: Counter[int] = Counter()
        self.committed: list[int] = []
        self.commit_times: dict[int, float] = {}
        self.apply_windows: list[float] = []
        self.counts: Counter[str] = Counter()
        self.times: dict[str, list[float]] = {}
        """When each event line was seen, per event name: what a random kill can be timed from."""
        self.ended: float | None = None
        """When the run's output ended."""
        self.reading_next = False
        """Since the last log commit, the next epoch's read began (it overlaps the apply)."""

    @property
    def applying(self) -> bool:
        """The last epoch committed to the log has tables not applied yet."""
        return bool(self.committed) and self.applied_in_epoch[self.committed[-1]] < self.bindings

    @property
    def window(self) -> str:
        """The window between steps the run stands in now (for a kill), or ''."""
        if not self.committed:
            return ""
        if not self.applying:
            return BETWEEN_EPOCHS  # every table of the last epoch applied, the next not committed
        if self.applied_in_epoch[self.committed[-1]] > 0:
            return BETWEEN_BINDINGS
        return OVERLAP if self.reading_next else ""

    def saw(self, event: str, at: float) -> None:
        self.counts[event] += 1
        self.times.setdefault(event, []).append(at)

    def feed(self, at: float, event: Event | None) -> str | None:
        """Update from one of the run's events; returns its kind if it is one kills are timed from."""
        if isinstance(event, events.Opened):
            self.phase = "re-apply"
            return "opened"
        if isinstance(event, events.SpanStarted) and event.name in ("read", "prestage") and self.applying:
            self.reading_next = True
            return None
        if isinstance(event, events.Read):
            self.reading_next = self.reading_next or self.applying
            self.phase = "read/stage/commit"
            return "read"
        if isinstance(event, events.Committed):
            self.reading_next = False
            self.committed.append(event.epoch)
            self.commit_times[event.epoch] = at
            self.phase = "apply"
            return "committed"
        if type(event) is events.Applied:  # a table's apply (a dead-letter table's is not counted)
            self.applied_in_epoch[event.epoch] += 1
            if self.applied_in_epoch[event.epoch] >= self.bindings and self.phase == "apply":
                self.phase = "after-apply"
                if event.epoch in self.commit_times:
                    self.apply_windows.append(at - self.commit_times[event.epoch])
            return "applied"
        return None


def run_once(
    config_path: Path,
    plan: Plan,
    *,
    bindings: int,
    round_no: int,
    index: int,
    log_path: Path,
    timeout: float,
    extra_args: tuple[str, ...] = (),
    on_line: Callable[[str], None] | None = None,
) -> tuple[RunRecord, _Phase]:
    """Run the pipeline once under ``plan``; return how it ended and where a kill landed."""
    started = time.monotonic()
    child = _Child(
        ["run", "--config", str(config_path), *RUN_EVENTS, *extra_args], child_env(plan.point if plan.kind == "point" else None), log_path
    )
    phase = _Phase(bindings)
    kill_at: float | None = None
    killed_by_drill = False
    landed = window = ""
    deadline = started + timeout
    ended = 0
    while True:
        now = time.monotonic()
        if kill_at is not None and now >= kill_at and not killed_by_drill:
            landed, window = phase.phase, phase.window
            child.signal_group(signal.SIGKILL)
            killed_by_drill = True
        if now > deadline and not killed_by_drill:
            child.signal_group(signal.SIGKILL)
            child.finish()
            raise DrillError(f"run {index} ({plan.label}) did not end within {timeout:.0f}s; see {log_path}")
        wait = 0.05 if kill_at is None else max(0.001, min(0.05, kill_at - now))
        try:
            item = child.lines.get(timeout=wait)
        except queue.Empty:
            continue
        if item is None:
            ended += 1
            if ended == 2:  # stdout and stderr
                break
            continue
        at, typed, line = item
        if typed is None:
            child.output.append(line)
        event = phase.feed(at, typed)
        if on_line is not None:
            on_line(line)
        if event is not None:
            phase.saw(event, at)
            if plan.kind == "random" and kill_at is None and event == plan.trigger and phase.counts[event] == plan.occurrence:
                kill_at = at + plan.delay
    phase.ended = time.monotonic()
    code = child.finish()
    if killed_by_drill:
        outcome = "killed"
    elif code == KILLED and plan.kind == "point":
        # Where the run's last events left it: the point died right there.
        outcome, landed, window = "killed", plan.point or "", phase.window
    elif code == 0:
        outcome = "finished"
    else:
        outcome = "failed"
    tail = "\n".join(l for l in child.output if not l.startswith((" ", "\t", ":: ")))[-2000:]
    record = RunRecord(
        round=round_no,
        index=index,
        plan=plan.label,
        kind=plan.kind,
        point=plan.point,
        exit_code=code,
        outcome=outcome,
        landed=landed,
        window=window if outcome == "killed" else "",
        seconds=round(time.monotonic() - started, 2),
        committed=list(phase.committed),
        error=tail if outcome == "failed" else "",
        events=dict(phase.counts),
    )
    return record, phase


# --- verification ------------------------------------------------------------------------------


def verify(config: PipelineConfig, spark: "SparkSession", round_no: int = 1, reader: str = "spark") -> Verification:
    """Tables against the oracle, Delta history against the log, staging empty, log whole.

    ``reader``: how the tables' rows are read, ``spark`` (Delta's own reader) or ``deltalake``
    (delta-rs, no JVM: a reader independent of the one that wrote them; path tables only)."""
    from materializer.delta import history, table_state
    from materializer.tables import TableRef
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    result = Verification(round=round_no)
    log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
    last_commit = None
    try:
        entries = log.entries()
    except RecoveryLogError as exc:
        result.log_problems.append(f"recovery log does not read back: {exc}")
        entries = []
    result.log_entries = len(entries)
    previous = None
    for entry in entries:
        if entry.kind != "commit":
            continue
        if previous is not None:
            recovered = entry.writer.startswith("recover-") and entry.epoch == previous.epoch
            if entry.epoch != previous.epoch + 1 and not recovered:
                result.log_problems.append(
                    f"log sequence {entry.seq} commits epoch {entry.epoch} right after epoch {previous.epoch}"
                )
        previous = last_commit = entry
    seqs = [e.seq for e in entries]
    if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        result.log_problems.append(f"log sequence numbers have a gap: {seqs}")
    result.last_epoch = last_commit.epoch if last_commit else 0

    # Orphans are what no run will ever delete: files of the staging area that the next Open
    # keeps although no committed entry needs them (applied epochs' staged files, files outside
    # the areas Open cleans). What a run killed or fenced after the last Open left in staged/,
    # spool/ or _tmp/ (or as a temp file in the log) is the next Open's to delete, not a leak.
    from materializer.staging import StagingArea, dataset_of

    area = StagingArea.of(config)
    pending = last_commit.driver_checkpoint if last_commit is not None else None
    _cleaned, kept = area.open_cleans(pending)
    needed = set()
    if pending is not None:
        for name, staged in pending.staged.items():
            binding = next((b for b in config.bindings if b.name == name), None)
            recorded = table_state(spark, TableRef(binding.table), config.pipeline_id).txn_version if binding else None
            if staged is not None and (recorded or 0) < pending.epoch:
                needed.add(staged.uri)  # committed, not yet applied: the next run applies it
    result.orphans = [p for p in kept if dataset_of(p) not in needed]
    result.orphans += area.outside_areas()

    expectations = oracle.expected_all(config)
    known = [e.epochs for e in expectations.values() if e.verified and e.epochs is not None]
    if len(known) == len(config.bindings) and max(known, default=0) != result.last_epoch:
        result.log_problems.append(
            f"the recovery log ends at epoch {result.last_epoch}; the sources make {max(known, default=0)} epochs"
        )
    for binding in config.bindings:
        exp = expectations[binding.name]
        ref = TableRef(binding.table)
        state = table_state(spark, ref, config.pipeline_id)
        rows: list[dict[str, Any]] = []
        if state.exists and reader == "deltalake" and ref.is_path:
            rows = _rows_by_delta_rs(ref.location)
        elif state.exists:
            df = spark.read.format("delta").load(ref.location) if ref.is_path else spark.table(ref.location)
            # A drill table is small; the oracle is plain Python, so the rows come to the driver.
            rows = [r.asDict(recursive=True) for r in df.collect()]
        cmp = oracle.compare(exp, rows, binding.key)
        check = TableCheck(
            binding=binding.name,
            table=str(ref),
            verified=exp.verified,
            reason=exp.reason,
            expected_rows=cmp.expected_rows,
            actual_rows=cmp.actual_rows,
            counts=dict(cmp.counts),
            lost=cmp.lost,
            duplicated=cmp.duplicated,
            wrong=cmp.wrong,
            recorded_epoch=state.txn_version,
            expected_epoch=exp.epochs if exp.verified else None,
        )
        for kind in ("lost", "duplicated", "wrong"):
            if cmp.counts[kind]:
                keys = ", ".join(json.dumps(d["key"]) for d in getattr(cmp, kind)[:10])
                check.problems.append(f"{cmp.counts[kind]} row(s) {kind} (keys {keys})")
        tagged = [
            h["tag"]["epoch"]
            for h in history(spark, ref)
            if h["tag"] and h["tag"].get("pipeline") == config.pipeline_id and h["tag"].get("binding") == binding.name
        ]
        check.history_epochs = len(tagged)
        check.epochs_applied_twice = sorted(e for e, n in Counter(tagged).items() if n > 1)
        if check.epochs_applied_twice:
            check.problems.append(f"Delta history holds epochs {check.epochs_applied_twice} more than once")
        recorded = state.txn_version or 0
        if tagged and max(tagged) != recorded:
            check.problems.append(f"history's last epoch {max(tagged)} differs from the txn version {recorded}")
        if recorded > result.last_epoch:
            check.problems.append(f"table records epoch {recorded}, beyond the log's last epoch {result.last_epoch}")
        if exp.verified and exp.epochs is not None:
            check.epochs_missing = sorted(set(range(1, exp.epochs + 1)) - set(tagged))
            if check.epochs_missing:
                check.problems.append(f"Delta history lacks epochs {check.epochs_missing[:20]}")
            if recorded != exp.epochs:
                check.problems.append(f"table records epoch {recorded}; its source's input ends at epoch {exp.epochs}")
        elif last_commit and last_commit.driver_checkpoint and binding.name in last_commit.driver_checkpoint.staged:
            if recorded != result.last_epoch:
                check.problems.append(f"table records epoch {recorded}; the log's last epoch is {result.last_epoch}")
        result.tables.append(check)
    return result


def _rows_by_delta_rs(location: str) -> list[dict[str, Any]]:
    """A path table's rows read by delta-rs (deltalake), not by the Spark that wrote them, through
    its QueryBuilder, which applies deletion vectors (``to_pyarrow_table`` refuses such a table)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder  # a core dependency (status reads the Delta log with it)

    path = location[len("file:") :] if location.startswith("file:") else location
    reader = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t")
    return pa.table(reader.read_all()).to_pylist()


# --- the drill ---------------------------------------------------------------------------------


class Drill:
    def __init__(self, options: DrillOptions, collector: Collector | None = None) -> None:
        self.options = options
        self.collector = collector or Collector()
        self.source_config = load_config(options.config)
        self.rng = random.Random(options.seed)
        if options.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="materializer-drill-"))
            self._temp = True
        else:
            self.workdir = options.workdir.absolute()
            self._temp = False
            if self.workdir.exists() and any(self.workdir.iterdir()):
                raise DrillError(
                    f"--workdir {self.workdir} is not empty: a drill starts from a fresh copy of the pipeline. "
                    "Give an empty or new folder."
                )
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.report = DrillReport(
            scenario=options.scenario,
            config=str(options.config),
            workdir=str(self.workdir),
            seed=options.seed,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        self.round_no = 0
        self.config_path = Path()
        self.config = self.source_config
        self._spark: "SparkSession | None" = None
        self._index = 0
        self._runs_in_round = 0
        self.last_phase: _Phase | None = None
        """The event times of the last run (for fitting random kills to the pipeline's size)."""
        self.apply_windows: list[float] = []
        self.stop_requested = False
        self.sizes = epoch_sizes(self.source_config, options)
        self.report.epoch_sizes = list(self.sizes.notes)

    # --- rounds ---

    def new_round(self) -> None:
        self.round_no += 1
        root = self.workdir / f"round-{self.round_no:03d}"
        root.mkdir(parents=True)
        (root / "runs").mkdir()
        sizes = self.sizes
        data = scratch_config(self.source_config, root, sizes.max_documents, sizes.max_files, sizes.max_records, self.options.remote)
        self.config = parse_config(data, "drill scratch config")
        self.config_path = root / "pipeline.yaml"
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=False))
        self._runs_in_round = 0
        self.collector.emit(RoundStarted(round=self.round_no, workdir=str(root)))

    @property
    def root(self) -> Path:
        return self.config_path.parent

    def spark(self) -> "SparkSession":
        if self._spark is None:
            from materializer.spark import config_session

            # The config's master even when it names a Connect server: the drill reads the tables
            # itself; hadoop-aws and the Kafka connector as the pipeline's runs have them.
            self._spark = config_session(
                self.config, master=self.config.spark.master, remote=self.options.remote, app_name="materializer-drill"
            )
        return self._spark

    def run(self, plan: Plan, extra_args: tuple[str, ...] = ()) -> RunRecord:
        self._index += 1
        self.collector.emit(RunStarted(index=self._index, plan=plan.label))
        record, phase = run_once(
            self.config_path,
            plan,
            bindings=len(self.config.bindings),
            round_no=self.round_no,
            index=self._index,
            log_path=self.root / "runs" / f"{self._index:04d}.log",
            timeout=self.options.run_timeout,
            extra_args=extra_args,
        )
        self._runs_in_round += 1
        self.last_phase = phase
        self.apply_windows += phase.apply_windows
        self.report.runs.append(record)
        self.collector.emit(RunEnded(record=record))
        return record

    def cli(self, *args: str) -> tuple[int, str]:
        """Run another ``materializer`` command (recover) to the end; its exit code and output."""
        self._index += 1
        log_path = self.root / "runs" / f"{self._index:04d}-{args[0]}.log"
        child = _Child([*args, "--config", str(self.config_path)], child_env(), log_path)
        for _item in child.items():
            pass
        code = child.finish()
        return code, log_path.read_text()

    def verify_round(self) -> Verification:
        self.collector.emit(Verifying(round=self.round_no))
        result = verify(self.config, self.spark(), self.round_no, self.options.reader)
        self.report.rounds.append(result)
        self.collector.emit(Verified(verification=result))
        return result

    def drain(self) -> bool:
        """Run without kills until a run exits 0; False if the pipeline cannot finish."""
        for _attempt in range(3):
            record = self.run(Plan("drain"))
            if record.outcome == "finished":
                return True
            if record.outcome == "failed":
                self.report.problems.append(f"run {record.index} ({record.plan}) failed, exit {record.exit_code}:\n{record.error}")
                return False
        self.report.problems.append("the pipeline did not finish after 3 clean runs")
        return False

    # --- scenario: kills ---

    def plans(self) -> list[Plan]:
        points = self.options.points if self.options.points is not None else list(crash.POINTS)
        for p in points:
            crash.parse(p)  # unknown names are errors, before anything runs
        requested = {p.split(":")[0] for p in points}
        self.report.unreachable = {p: why for p, why in unreachable_points(self.source_config).items() if p in requested}
        plans = [Plan("point", point=p) for p in points if p.split(":")[0] not in self.report.unreachable]
        for _ in range(self.options.kills):
            roll = self.rng.random()
            if roll < 0.6:
                # After a log commit the apply (its MERGE) starts at once: a delay within the window
                # apply takes lands most of these kills inside the Spark job.
                plans.append(Plan("random", trigger="committed", occurrence=self.rng.choice((1, 1, 2)), delay=self.rng.random()))
            elif roll < 0.8:
                plans.append(Plan("random", trigger="read", occurrence=self.rng.choice((1, 2)), delay=self.rng.random() * 1.5))
            else:
                plans.append(Plan("random", trigger="opened", occurrence=1, delay=self.rng.random() * 4.0))
        return plans

    def _scale(self, plan: Plan) -> Plan:
        # Stretch "committed" delays to the apply time measured so far on this machine.
        if plan.kind == "random" and plan.trigger == "committed" and self.apply_windows:
            window = statistics.median(self.apply_windows)
            return Plan("random", trigger=plan.trigger, occurrence=plan.occurrence, delay=plan.delay * window)
        return plan

    def fit(self, plan: Plan, phase: "_Phase") -> Plan | None:
        """``plan`` re-aimed at what a fresh pipeline's run showed, or None if it has nothing to aim at.

        A small pipeline (all its documents in one epoch, say) never commits a second epoch, so a
        kill planned after ``committed #2`` cannot land however often it is tried: aim at an
        occurrence the run had, and (for delays counted in seconds) within the time the run
        lasted after it.
        """
        times = phase.times.get(plan.trigger, [])
        if not times:
            return None
        occurrence = min(plan.occurrence, len(times))
        delay = plan.delay
        if plan.trigger != "committed" and phase.ended is not None:
            # "committed" delays are fractions of the apply window (see _scale); others are seconds.
            window = max(0.0, phase.ended - times[occurrence - 1])
            if delay >= 0.8 * window:
                delay = self.rng.random() * 0.8 * window
        return Plan(plan.kind, point=plan.point, trigger=plan.trigger, occurrence=occurrence, delay=delay)

    def kill_once(self, plan: Plan) -> bool:
        """Run under ``plan`` until its kill lands, restarting on fresh rounds when the sources
        drain first; False if a run failed (the drill stops there)."""
        aimed = plan
        fitted = False
        while True:
            fresh = self._runs_in_round == 0
            record = self.run(self._scale(aimed))
            if record.outcome == "killed":
                return True
            if record.outcome == "failed":
                self.report.problems.append(
                    f"run {record.index} ({record.plan}) failed with exit {record.exit_code} instead of recovering:\n{record.error}"
                )
                self.verify_round()
                return False
            # Drained before the kill: verify this round and go again on a fresh copy.
            self.verify_round()
            self.new_round()
            if not fresh:
                continue  # a fresh pipeline has the most left to do: try there
            if plan.kind != "random":
                self.report.unreachable[plan.label] = "a fresh pipeline ran to the end without reaching it"
                return True
            if fitted:
                self.report.missed.append(f"{aimed.label}: the run drained first, twice on a fresh pipeline")
                return True
            assert self.last_phase is not None
            refit = self.fit(plan, self.last_phase)
            if refit is None:
                self.report.unreachable[plan.label] = f"a fresh pipeline's run prints no {plan.trigger!r} event"
                return True
            aimed, fitted = refit, True

    def kills(self, tick: Callable[[], None] = lambda: None) -> None:
        self.new_round()
        for plan in self.plans():
            if self.stop_requested:
                self.report.stopped_early = True
                break
            if not self.kill_once(plan):
                return
            tick()
        self.drain()
        self.verify_round()
        tick()

    # --- scenario: zombie ---

    def zombie(self, tick: Callable[[], None] = lambda: None) -> None:
        self.new_round()
        self._index += 1
        log_a = self.root / "runs" / f"{self._index:04d}-zombie.log"
        started = time.monotonic()
        zombie = _Child(["run", "--config", str(self.config_path), *RUN_EVENTS], child_env(), log_a)
        phase = _Phase(len(self.config.bindings))
        pause_at: float | None = None
        delay = self.rng.random() * 0.5
        for at, typed, line in zombie.items(timeout=self.options.run_timeout):
            if typed is None:
                zombie.output.append(line)
            if phase.feed(at, typed) == "committed" and pause_at is None:
                pause_at = at + delay
                while time.monotonic() < pause_at:
                    time.sleep(0.005)
                # Pause the whole group (Python and JVM) right after its first log commit,
                # possibly inside that epoch's MERGE.
                zombie.signal_group(signal.SIGSTOP)
                break
        if pause_at is None:
            zombie.finish()
            self.report.problems.append("zombie run ended before committing an epoch: the source is too small")
            return
        landed = phase.phase
        tick()
        fresh = self.run(Plan("drain"))
        tick()
        zombie.signal_group(signal.SIGCONT)
        for _item in zombie.items(timeout=self.options.run_timeout):
            pass
        code = zombie.finish()
        text = log_a.read_text()
        self.report.runs.append(
            RunRecord(
                round=self.round_no,
                index=self._index,
                plan=f"zombie: paused {delay:.2f}s after its first commit, resumed after the new run ended",
                kind="zombie",
                point=None,
                exit_code=code,
                outcome="fenced" if code == FencedError.exit_code else ("finished" if code == 0 else "failed"),
                landed=landed,
                seconds=round(time.monotonic() - started, 2),
                committed=phase.committed,
                error="\n".join(l for l in text.splitlines() if l.startswith("error:"))[-2000:],
            )
        )
        if fresh.outcome != "finished":
            self.report.problems.append(f"the new run did not finish (exit {fresh.exit_code}):\n{fresh.error}")
        if code != FencedError.exit_code or "fenced" not in text:
            self.report.problems.append(
                f"the paused run exited {code} instead of being fenced (exit {FencedError.exit_code}); see {log_a}"
            )
        self.verify_round()
        tick()

    # --- scenario: damage ---

    def damage(self, tick: Callable[[], None] = lambda: None) -> None:
        from materializer.recovery_log import RecoveryLog
        from materializer.storage import open_store

        damages = self.options.damages or list(DAMAGES)
        self.new_round()
        # Each damage is done to a different epoch of one pipeline: crash where it leaves the
        # damaged thing unapplied, damage it, check the next run refuses, recover, go on.
        setups = {
            # the commit entry of the epoch is durable, nothing applied yet
            "torn-log": ("after-log-commit", RecoveryLogError.exit_code),
            # every table applied the epoch, its entry is then damaged: recover must see that
            "corrupt-log": ("after-ack-before-gc", RecoveryLogError.exit_code),
            "missing-staged": ("after-log-commit", StagingError.exit_code),
            # the first binding applied, the last binding's staged file is then truncated
            "truncated-staged": ("after-apply" if len(self.config.bindings) > 1 else "after-log-commit", StagingError.exit_code),
        }
        log = RecoveryLog(open_store(self.config.recovery_log), self.config.pipeline_id)
        staging = open_store(self.config.staging_root)
        epoch = 1
        for name in damages:
            if name not in setups:
                raise DrillError(f"unknown damage {name!r}; known: {', '.join(DAMAGES)}")
            point, want_code = setups[name]
            epoch += 1
            record = self.run(Plan("point", point=f"{point}:{epoch}"))
            if record.outcome != "killed":
                self.report.problems.append(f"{name}: the run did not stop at {point}:{epoch} ({record.outcome}); source too small?")
                break
            what = _damage(name, log, staging, self.config)
            self.collector.emit(Damaged(damage=name, what=what))
            failed = self.run(Plan("drain"))
            text = (self.root / "runs" / f"{failed.index:04d}.log").read_text()
            failed.plan = f"after {name}: {what}"
            if failed.exit_code != want_code:
                self.report.problems.append(
                    f"{name} ({what}): the next run exited {failed.exit_code}, expected {want_code} (a clear error)"
                )
                break
            if "materializer recover" not in text:
                self.report.problems.append(f"{name}: the error does not say how to recover:\n{failed.error}")
            code, out = self.cli("recover")
            self.report.runs.append(
                RunRecord(self.round_no, self._index, f"recover after {name}", "recover", None, code,
                          "finished" if code == 0 else "failed", error="" if code == 0 else out[-2000:])
            )
            if code != 0:
                self.report.problems.append(f"{name}: `materializer recover` failed (exit {code}):\n{out[-2000:]}")
                break
            tick()
        self.drain()
        self.verify_round()
        tick()

    # --- all ---

    def execute(self, tick: Callable[[], None] = lambda: None) -> DrillReport:
        started = time.monotonic()
        previous = None
        if threading.current_thread() is threading.main_thread():
            # A drill stopped by SIGTERM (a CI timeout) must not leave its runs and JVMs behind.
            previous = signal.signal(signal.SIGTERM, _interrupt)
            # SIGUSR1: stop killing after the current run, then drain and verify as usual
            # (a long drill cut short still ends with a verdict on the kills it made).
            signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "stop_requested", True))
        try:
            getattr(self, self.options.scenario)(tick)
        finally:
            for child in list(_LIVE):
                child.signal_group(signal.SIGKILL)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.report.seconds = round(time.monotonic() - started, 1)
            if self._spark is not None:
                self._spark.stop()
        path = self.options.report or (self.workdir / "drill-report.json")
        self.report.report_path = str(path)
        if self._temp and not self.options.keep and self.report.verdict == "pass":
            # A passing drill in a temp folder leaves only its report; a failing one keeps
            # everything (tables, log, staging, each run's output) for the post-mortem.
            for round_dir in self.workdir.glob("round-*"):
                shutil.rmtree(round_dir, ignore_errors=True)
        path.write_text(json.dumps(self.report.to_json(), indent=2, default=str))
        return self.report

    def planned(self) -> int:
        """Steps the progress bar counts."""
        if self.options.scenario == "kills":
            points = self.options.points if self.options.points is not None else list(crash.POINTS)
            reachable = [p for p in points if p.split(":")[0] not in unreachable_points(self.source_config)]
            return len(reachable) + self.options.kills + 1
        if self.options.scenario == "zombie":
            return 3
        return len(self.options.damages or DAMAGES) + 1


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"drill stopped by signal {signum}")


# --- damage helpers ----------------------------------------------------------------------------


def _damage(name: str, log: Any, staging: Any, config: PipelineConfig) -> str:
    """Do one damage to the pipeline's state; returns what was done."""
    from materializer.recovery_log import entry_path
    from materializer.staging import is_data_file

    state = log.read()
    entry = state.last_commit
    assert entry is not None and entry.driver_checkpoint is not None
    path = Path(log.store.spark_path(entry_path(entry.seq)))
    if name == "torn-log":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return f"tore log entry {path.name} (epoch {entry.epoch}) to {len(data) // 2} of {len(data)} bytes"
    if name == "corrupt-log":
        data = path.read_text()
        # Change one digit of the body: still valid JSON, so only the checksum can tell.
        changed = re.sub(r'"rows": (\d+)', lambda m: f'"rows": {int(m.group(1)) + 1}', data, count=1)
        path.write_text(changed)
        return f"changed a row count in log entry {path.name} (epoch {entry.epoch})"
    # In the configuration's order (the entry's own order is alphabetical): the first binding's
    # file is unapplied after `after-log-commit`, the last binding's after `after-apply`.
    in_order = [entry.driver_checkpoint.staged.get(b.name) for b in config.bindings]
    staged = [s for s in in_order if s is not None]
    if name == "missing-staged":
        target = staged[0]
        staging.delete_prefix(target.uri)
        return f"deleted staged dataset {target.uri} (epoch {entry.epoch})"
    if name == "truncated-staged":
        target = staged[-1]
        files = [f for f in staging.list(target.uri) if is_data_file(f.path)]
        victim = Path(staging.spark_path(files[0].path))
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])
        return f"truncated staged file {files[0].path} (epoch {entry.epoch}) to {len(data) // 2} of {len(data)} bytes"
    raise DrillError(f"unknown damage {name!r}")
