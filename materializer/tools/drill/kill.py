"""Process control: one run of the real ``materializer`` CLI in its own process group, its event
lines followed as they come, a SIGKILL (of the whole group, the JVM included) timed from them, and
the record of how the run ended."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from materializer import crash, events
from materializer.events import Event
from materializer.tools.drill.plan import BETWEEN_BINDINGS, BETWEEN_EPOCHS, OVERLAP, DrillError, Plan

REPO = Path(__file__).resolve().parents[3]  # the checkout: materializer/tools/drill/<this file>
KILLED = -signal.SIGKILL

RUN_EVENTS = ("--all-events",)
"""What the drill adds to ``materializer run``: every typed event as a JSON line on stdout (the
human lines stay on stderr). The drill times its kills from these records, never from the text."""


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


# --- one run of the real CLI -------------------------------------------------------------------


_LIVE: "set[Child]" = set()
"""Runs started and not yet finished: a drill that is interrupted kills their groups."""


class Child:
    """``materializer <args>`` in its own session and process group, its output read line by line.

    Two pipes: stdout carries the run's JSON event records (``--all-events``), stderr the human
    lines and any error. Both go to the run's log file; ``lines`` gets ``(time seen, event, line)``,
    ``event`` the typed event of a record (None for any other line).
    """

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        # The run's scratch files in a folder of its own, removed when it ends: Spark's (its copies of
        # the session's jars, its block manager's files), spark-submit's and the JVM's temporary
        # files, Python's. Spark removes its own only at a clean exit: a drill's SIGKILLs would
        # leave 12-22 MB per kill in /tmp (0.7 GB with S3's jars).
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{log_path.stem}-scratch-", dir=_scratch_base(env, log_path)))
        submit_opts = f"{env.get('SPARK_SUBMIT_OPTS', '')} {shlex.quote(f'-Djava.io.tmpdir={self.scratch}')}".strip()
        env = {**env, "SPARK_LOCAL_DIRS": str(self.scratch), "SPARK_SUBMIT_OPTS": submit_opts, "TMPDIR": str(self.scratch)}
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
        shutil.rmtree(self.scratch, ignore_errors=True)
        return code


def _scratch_base(env: dict[str, str], log_path: Path) -> Path:
    """Where a run's scratch folder goes: the first of the user's ``SPARK_LOCAL_DIRS`` (a scratch
    disk they chose), else beside the run's log in the drill's workdir."""
    chosen = env.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    base = Path(chosen) if chosen else log_path.parent
    base.mkdir(parents=True, exist_ok=True)
    return base


def kill_live() -> None:
    """SIGKILL the process group of every run started and not yet finished (a drill that ends,
    however it ends, leaves no run or JVM behind)."""
    for child in list(_LIVE):
        child.signal_group(signal.SIGKILL)
        shutil.rmtree(child.scratch, ignore_errors=True)


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


class RunPhase:
    """Follows a run's event lines to say where the run stands (for where a kill landed)."""

    def __init__(self, bindings: int) -> None:
        self.bindings = bindings
        self.phase = "startup"
        self.applied_in_epoch: Counter[int] = Counter()
        self.committed: list[int] = []
        """Epochs this run committed to the recovery log."""
        self.pending: int | None = None
        """The epoch whose tables are applied next or now: the last this run committed, or the
        one Open found committed (the run's first Acknowledge re-applies it)."""
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
        return self.pending is not None and self.applied_in_epoch[self.pending] < self.bindings

    @property
    def window(self) -> str:
        """The window between steps the run stands in now (for a kill), or ''."""
        if self.pending is None:
            return ""
        if not self.applying:
            return BETWEEN_EPOCHS  # every table of the last epoch applied, the next not committed
        if self.applied_in_epoch[self.pending] > 0:
            return BETWEEN_BINDINGS
        return OVERLAP if self.reading_next else ""

    def saw(self, event: str, at: float) -> None:
        self.counts[event] += 1
        self.times.setdefault(event, []).append(at)

    def feed(self, at: float, event: Event | None) -> str | None:
        """Update from one of the run's events; returns its kind if it is one kills are timed from."""
        if isinstance(event, events.Opened):
            self.phase = "re-apply"
            # A restarted run's windows begin here, not at its first commit: its re-apply of the
            # epoch Open found (tables applied one by one, the next epoch's read beside them) is
            # where half of a restarted run's kills land.
            self.pending = event.epoch or None
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
            self.pending = event.epoch
            self.commit_times[event.epoch] = at
            self.phase = "apply"
            return "committed"
        if type(event) is events.Applied:  # a table's apply (a dead-letter table's is not counted)
            self.applied_in_epoch[event.epoch] += 1
            if self.applied_in_epoch[event.epoch] == self.bindings:
                # Measured whether or not the next epoch's read began meanwhile: it begins during
                # the apply and ends before a MERGE does, so the phase alone would never measure it.
                if event.epoch in self.commit_times:
                    self.apply_windows.append(at - self.commit_times[event.epoch])
                if self.phase == "apply":
                    self.phase = "after-apply"
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
) -> tuple[RunRecord, RunPhase]:
    """Run the pipeline once under ``plan``; return how it ended and where a kill landed."""
    started = time.monotonic()
    child = Child(
        ["run", "--config", str(config_path), *RUN_EVENTS, *extra_args], child_env(plan.point if plan.kind == "point" else None), log_path
    )
    phase = RunPhase(bindings)
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
