"""The fault scenarios of the drill beside the kills: a ``zombie`` run that must be fenced, and
``damage`` done to the recovery log and the staging store that every next run must refuse until
``materializer recover`` repairs it. Each takes the :class:`.scenarios.Drill` that runs them."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from materializer.errors import FencedError, RecoveryLogError, StagingError
from materializer.events import Collector
from materializer.tools.drill.damage import DAMAGES, do_damage
from materializer.tools.drill.kill import RUN_EVENTS, Child, RunPhase, RunRecord, child_env
from materializer.tools.drill.plan import DrillError, DrillOptions, Plan
from materializer.tools.drill.report import Damaged, DrillReport

if TYPE_CHECKING:
    import random

    from materializer.config import PipelineConfig
    from materializer.tools.drill.verification import Verification


class DrillRuns(Protocol):
    """What a fault scenario uses of the drill (the Drill of :mod:`.scenarios`, a floor above)."""

    options: DrillOptions
    report: DrillReport
    collector: Collector
    config: PipelineConfig
    known_config: PipelineConfig
    config_path: Path
    round_no: int
    rng: random.Random

    @property
    def root(self) -> Path: ...
    def new_round(self) -> None: ...
    def next_index(self) -> int: ...
    def run(self, plan: Plan, extra_args: tuple[str, ...] = ()) -> RunRecord: ...
    def cli(self, *args: str) -> tuple[int, int, str]: ...
    def drain(self) -> bool: ...
    def verify_round(self) -> Verification: ...


def zombie(drill: DrillRuns, tick: Callable[[], None]) -> None:
    """A run paused (SIGSTOP) right after its first log commit, a new run drained beside it, then
    the paused one resumed: it must be fenced (exit code of FencedError) and the tables stay right."""
    drill.new_round()
    index = drill.next_index()
    log_a = drill.root / "runs" / f"{index:04d}-zombie.log"
    started = time.monotonic()
    zombie = Child(["run", "--config", str(drill.config_path), *RUN_EVENTS], child_env(), log_a)
    phase = RunPhase(len(drill.known_config.bindings))
    pause_at: float | None = None
    delay = drill.rng.random() * 0.5
    for at, typed, line in zombie.items(timeout=drill.options.run_timeout):
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
        drill.report.problems.append("zombie run ended before committing an epoch: the source is too small")
        return
    landed = phase.phase
    tick()
    fresh = drill.run(Plan("drain"))
    tick()
    zombie.signal_group(signal.SIGCONT)
    for _item in zombie.items(timeout=drill.options.run_timeout):
        pass
    code = zombie.finish()
    text = log_a.read_text()
    drill.report.runs.append(
        RunRecord(
            round=drill.round_no,
            index=index,
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
        drill.report.problems.append(f"the new run did not finish (exit {fresh.exit_code}):\n{fresh.error}")
    if code != FencedError.exit_code or "fenced" not in text:
        drill.report.problems.append(
            f"the paused run exited {code} instead of being fenced (exit {FencedError.exit_code}); see {log_a}"
        )
    drill.verify_round()
    tick()


def damage(drill: DrillRuns, tick: Callable[[], None]) -> None:
    """Each damage of :data:`.damage.DAMAGES` done to the epoch a crash point left unapplied: the next
    run must stop with a clear error saying how to recover, and ``materializer recover`` repairs it."""
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    damages = drill.options.damages or list(DAMAGES)
    drill.new_round()
    # Each damage is done to a different epoch of one pipeline: crash where it leaves the
    # damaged thing unapplied, damage it, check the next run refuses, recover, go on.
    setups = {
        # the commit entry of the epoch is durable, nothing applied yet
        "torn-log": ("after-log-commit", RecoveryLogError.exit_code),
        # every table applied the epoch, its entry is then damaged: recover must see that
        "corrupt-log": ("after-ack-before-gc", RecoveryLogError.exit_code),
        "missing-staged": ("after-log-commit", StagingError.exit_code),
        # the first binding applied, the last binding's staged file is then truncated
        "truncated-staged": ("after-apply" if len(drill.known_config.bindings) > 1 else "after-log-commit", StagingError.exit_code),
    }
    log = RecoveryLog(open_store(drill.config.recovery_log), drill.config.pipeline_id)
    staging = open_store(drill.config.staging_root)
    epoch = 1
    for name in damages:
        if name not in setups:
            raise DrillError(f"unknown damage {name!r}; known: {', '.join(DAMAGES)}")
        point, want_code = setups[name]
        epoch += 1
        record = drill.run(Plan("point", point=f"{point}:{epoch}"))
        if record.outcome != "killed":
            drill.report.problems.append(f"{name}: the run did not stop at {point}:{epoch} ({record.outcome}); source too small?")
            break
        what = do_damage(name, log, staging, drill.config)
        drill.collector.emit(Damaged(damage=name, what=what))
        failed = drill.run(Plan("drain"))
        text = (drill.root / "runs" / f"{failed.index:04d}.log").read_text()
        failed.plan = f"after {name}: {what}"
        if failed.exit_code != want_code:
            drill.report.problems.append(
                f"{name} ({what}): the next run exited {failed.exit_code}, expected {want_code} (a clear error)"
            )
            break
        if "materializer recover" not in text:
            drill.report.problems.append(f"{name}: the error does not say how to recover:\n{failed.error}")
        index, code, out = drill.cli("recover")
        drill.report.runs.append(
            RunRecord(drill.round_no, index, f"recover after {name}", "recover", None, code,
                      "finished" if code == 0 else "failed", error="" if code == 0 else out[-2000:])
        )
        if code != 0:
            drill.report.problems.append(f"{name}: `materializer recover` failed (exit {code}):\n{out[-2000:]}")
            break
        tick()
    drill.drain()
    drill.verify_round()
    tick()
