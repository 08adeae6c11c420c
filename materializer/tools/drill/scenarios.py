"""The drill: rounds on scratch copies of the pipeline, and its scenarios (``kills``,
``neighbours``; ``zombie`` and ``damage`` in :mod:`.faults`), each ending in a verified round."""

from __future__ import annotations

import json
import random
import shutil
import signal
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from materializer import __version__, crash, redact
from materializer.config import load_config, parse_config, unresolve
from materializer.events import Collector
from materializer.tools.drill.damage import DAMAGES
from materializer.tools.drill import faults
from materializer.tools.drill.kill import Child, RunPhase, RunRecord, child_env, kill_live, run_once
from materializer.tools.drill.maintenance import AUTO_COMPACT_MIN_FILES, GAP, Maintainer, check_operations
from materializer.tools.drill.plan import (
    WINDOWS, DrillError, DrillOptions, Plan, epoch_sizes, known_bindings, scratch_config, scratch_notes, unreachable_points,
)
from materializer.tools.drill.report import DrillReport, RoundStarted, RunEnded, RunStarted, Verified, Verifying
from materializer.tools.drill.resume import resumable, resumed_options, resumed_workdir
from materializer.tools.drill.verification import Verification, verify

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Drill:
    def __init__(self, options: DrillOptions, collector: Collector | None = None) -> None:
        self.options = options
        self.collector = collector or Collector()
        self._t0 = time.monotonic()
        previous = resumable(options) if options.resume is not None else None
        if previous is not None:
            options = self.options = resumed_options(previous, options)
        self.source_config = load_config(options.config)
        self.rng = random.Random(options.seed)
        if previous is not None:
            self.workdir = resumed_workdir(previous)
            self._temp = False
        elif options.workdir is None:
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
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.report = previous or DrillReport(
            scenario=options.scenario,
            config=str(options.config),
            workdir=str(self.workdir),
            seed=options.seed,
            started_at=now,
        )
        self.report.stopped_early = False
        self.report.sittings.append({"started_at": now, "version": __version__})
        self._earlier_seconds = self.report.seconds
        self._earlier_kills = sum(self.report.kills().values())
        self.round_no = max((v.round for v in self.report.rounds), default=0)
        self.config_path = Path()
        self.config = self.source_config
        self._spark: "SparkSession | None" = None
        self._spark_lock = threading.Lock()
        self.maintainer: Maintainer | None = None
        """Scenario ``neighbours``: the maintenance run beside the pipeline (:meth:`neighbours`)."""
        self.maintenance_ops = check_operations(options.maintenance) if options.scenario == "neighbours" else []
        if options.maintenance and options.scenario != "neighbours":
            raise DrillError(f"--maintenance is for --scenario neighbours, not {options.scenario}")
        self._live_run: int | None = None
        self._run_ends: dict[int, float] = {}
        self._stops_in_row = 0
        self._index = max((r.index for r in self.report.runs), default=0)
        self._runs_in_round = 0
        self.last_phase: RunPhase | None = None
        """The event times of the last run (for fitting random kills to the pipeline's size)."""
        self.apply_windows: list[float] = []
        self.stop_requested = False
        self._sessions: list[str] = []
        """``--remote``: the Connect session ids of this round's runs, released before it is verified."""
        self._stopped_by = ""
        """The run that failed in this round instead of recovering (its tables are verified as
        far as the pipeline got: rows of the input after the error are not "lost")."""
        # A pipeline with templates: the bindings they make from what the sources hold now.
        self.known_config = known_bindings(self.source_config)
        self.sizes = epoch_sizes(self.known_config, options)
        if previous is not None and list(self.sizes.notes) != previous.epoch_sizes:
            raise DrillError(
                f"cannot resume the drill of {previous.started_at}: its sources changed since "
                f"(then: {'; '.join(previous.epoch_sizes)}; now: {'; '.join(self.sizes.notes)}), so the rest "
                "of its plan is not the plan it began. Start a new drill."
            )
        if previous is not None and self._plan_size() != previous.planned_kills:
            raise DrillError(
                f"cannot resume the drill of {previous.started_at}: it planned {previous.planned_kills} kills, "
                f"these options plan {self._plan_size()}. Give the --kills and --points of the drill that wrote "
                f"{options.resume}."
            )
        self.report.epoch_sizes = list(self.sizes.notes)
        self.report.scratch = scratch_notes(self.source_config)
        if options.scenario == "neighbours" and AUTO_COMPACT_MIN_FILES not in self.source_config.spark.conf:
            self.report.scratch.append(
                f"spark.conf {AUTO_COMPACT_MIN_FILES}: 2 on the scratch copy's runs, so auto compaction (once the "
                "maintainer turns it on) compacts a drill's few small files (Delta's default waits for 50)"
            )

    # --- rounds ---

    def new_round(self) -> None:
        self.round_no += 1
        root = self.workdir / f"round-{self.round_no:03d}"
        root.mkdir(parents=True)
        (root / "runs").mkdir()
        sizes = self.sizes
        extra_conf = {AUTO_COMPACT_MIN_FILES: "2"} if self.options.scenario == "neighbours" else None
        data = scratch_config(
            self.source_config, root, sizes.max_documents, sizes.max_files, sizes.max_records, self.options.remote, extra_conf
        )
        self.config = parse_config(data, "drill scratch config")
        self.config_path = root / "pipeline.yaml"
        # With the references as the user wrote them, never their values (docs: 'Secrets'): the
        # runs resolve them again from the environment they inherit.
        self.config_path.write_text(yaml.safe_dump(unresolve(data), sort_keys=False))
        self._runs_in_round = 0
        self._stopped_by = ""  # (a failed run marks only its own round)
        self.collector.emit(RoundStarted(round=self.round_no, workdir=str(root)))
        if self.maintainer is not None:
            self.maintainer.activate()

    @property
    def root(self) -> Path:
        return self.config_path.parent

    def spark(self) -> "SparkSession":
        # (locked: the neighbours' maintainer may start it from its thread)
        with self._spark_lock:
            if self._spark is None:
                from materializer.spark import config_session

                # The config's master even when it names a Connect server: the drill reads the tables
                # itself; hadoop-aws and the Kafka connector as the pipeline's runs have them.
                self._spark = config_session(
                    self.config, master=self.config.spark.master, remote=self.options.remote, app_name="materializer-drill"
                )
            return self._spark

    def run(self, plan: Plan, extra_args: tuple[str, ...] = ()) -> RunRecord:
        self.next_index()
        self.collector.emit(RunStarted(index=self._index, plan=plan.label))
        if self.options.remote and "--remote" not in extra_args:
            # A session id of the drill's choosing: a killed client never releases its session,
            # so the drill does (release_sessions), or the server keeps every one of them.
            from materializer.spark.connect import with_session_id

            session_id = str(uuid.uuid4())
            self._sessions.append(session_id)
            extra_args = (*extra_args, "--remote", with_session_id(self.options.remote, session_id))
        self._live_run = self._index
        record, phase = run_once(
            self.config_path,
            plan,
            bindings=len(self.known_config.bindings),
            round_no=self.round_no,
            index=self._index,
            log_path=self.root / "runs" / f"{self._index:04d}.log",
            timeout=self.options.run_timeout,
            extra_args=extra_args,
        )
        self._live_run = None
        self._run_ends[record.index] = time.monotonic() - self._t0
        if record.outcome != "failed":
            self._stops_in_row = 0
        self._runs_in_round += 1
        self.last_phase = phase
        self.apply_windows += phase.apply_windows
        self.report.runs.append(record)
        self.collector.emit(RunEnded(record=record))
        return record

    def cli(self, *args: str) -> tuple[int, int, str]:
        """Run another ``materializer`` command (recover) to the end; its number, exit code and output."""
        index = self.next_index()
        log_path = self.root / "runs" / f"{index:04d}-{args[0]}.log"
        child = Child([*args, "--config", str(self.config_path)], child_env(), log_path)
        for _item in child.items():
            pass
        code = child.finish()
        return index, code, log_path.read_text()

    def release_sessions(self) -> None:
        """Release the Connect sessions of the runs so far (``--remote``): a killed client's
        session and its clones would otherwise live on the server until its session timeout,
        holding their state (1,000 kills filled a 1 GB server's heap), and an operation of a killed
        run still running there is interrupted before the tables are read."""
        if not self.options.remote or not self._sessions:
            return
        from materializer.spark.connect import release_sessions, session_ids_of

        ids = [i for session_id in self._sessions for i in session_ids_of(session_id)]
        self._sessions = []
        self.report.released_sessions += release_sessions(self.options.remote, ids)

    def verify_round(self) -> Verification:
        self.release_sessions()
        if self.maintainer is not None:
            self.maintainer.pause()  # the tables are read as the pipeline left them
        self.collector.emit(Verifying(round=self.round_no))
        try:
            result = verify(self.config, self.spark(), self.round_no, self.options.reader, stopped_by=self._stopped_by)
        except Exception as exc:  # noqa: BLE001 - a table that cannot be read is the round's failure
            if self.options.scenario != "neighbours":
                raise
            # (a VACUUM RETAIN 0 HOURS can delete a file a commit names: the read fails)
            result = Verification(round=self.round_no, stopped_by=self._stopped_by)
            result.log_problems.append(f"the round's tables could not be read back: {type(exc).__name__}: {str(exc)[:1500]}")
        self._stopped_by = ""
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
                if self._maintenance_stop(record):
                    continue
                self.report.problems.append(f"run {record.index} ({record.plan}) failed, exit {record.exit_code}:\n{record.error}")
                self._stopped_by = _stopped_by(record)
                return False
        self.report.problems.append("the pipeline did not finish after 3 clean runs")
        return False

    # --- scenario: kills ---

    def plans(self) -> list[Plan]:
        points = self.options.points if self.options.points is not None else list(crash.POINTS)
        for p in points:
            crash.parse(p)  # unknown names are errors, before anything runs
        requested = {p.split(":")[0] for p in points}
        # The points not asked for are not reported; a window the pipeline cannot have always is
        # (it is no point: filtered with them, a one-binding pipeline's report said "never hit").
        # (Updated, not replaced: a resumed drill keeps what its earlier sitting found.)
        self.report.unreachable.update({
            p: why for p, why in unreachable_points(self.known_config).items() if p in requested or p in WINDOWS
        })
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

    def fit(self, plan: Plan, phase: "RunPhase") -> Plan | None:
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
                if self._maintenance_stop(record):
                    continue  # restarted: the pipeline must go on from where it stopped
                self.report.problems.append(
                    f"run {record.index} ({record.plan}) failed with exit {record.exit_code} instead of recovering:\n{record.error}"
                )
                self._stopped_by = _stopped_by(record)
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
        plans = self.plans()
        self.report.planned_kills = len(plans)
        self.report.kill_plan = {"kills": self.options.kills, "points": self.options.points}
        for plan in plans[self.report.plans_done :]:
            if self.stop_requested:
                self.report.stopped_early = True
                break
            if not self.kill_once(plan):
                return
            self.report.plans_done += 1
            tick()
        self.drain()
        self.verify_round()
        tick()

    # --- scenario: neighbours ---

    def neighbours(self, tick: Callable[[], None] = lambda: None) -> None:
        """The ``kills`` plan (failure points, random kills, the drain, each round verified) with
        a maintainer beside it: OPTIMIZE, ZORDER, VACUUM (7 days, and 0 hours) and auto compaction
        turned on, on the round's tables at the seed's random times (:mod:`.maintenance`)."""
        self.report.maintenance_plan = {
            "seed": self.options.seed, "actions": self.maintenance_ops, "gap_seconds": list(GAP),
            "session": "the drill's own JVM (newSession), beside the runs' JVMs",
        }
        self.maintainer = Maintainer(
            self.spark, self.options.seed, self.maintenance_ops,
            lambda: (self.round_no, self.config.bindings), lambda: self._live_run, self._t0,
        )
        self.maintainer.start()
        self.kills(tick)

    def _maintenance_stop(self, record: RunRecord) -> bool:
        """Scenario ``neighbours``: a run that stopped with an error is counted, naming the
        maintenance action before it, and True (restart it) unless it is the third in a row."""
        if self.maintainer is None:
            return False
        ended = self._run_ends.get(record.index, time.monotonic() - self._t0)
        before = [a for a in list(self.maintainer.actions) if a.outcome == "done" and a.at <= ended]
        last = before[-1] if before else None
        named = (
            f"maintenance #{last.index} ({last.operation} on {last.binding} at {last.at:.1f}s, versions {last.versions})"
            if last else "no maintenance action (none was made before it)"
        )
        self.report.maintenance_stops.append({
            "run": record.index, "round": record.round, "exit_code": record.exit_code, "after": last.index if last else None,
            "action": named, "error": record.error,
        })
        self.report.problems.append(f"run {record.index} ({record.plan}) stopped (exit {record.exit_code}) after {named}:\n{record.error}")
        self._stops_in_row += 1
        return self._stops_in_row < 3

    # --- scenarios: zombie, damage (faults.py) ---

    def zombie(self, tick: Callable[[], None] = lambda: None) -> None:
        faults.zombie(self, tick)

    def damage(self, tick: Callable[[], None] = lambda: None) -> None:
        faults.damage(self, tick)

    def next_index(self) -> int:
        """The number of the next run or command of the drill (its log is ``runs/NNNN….log``)."""
        self._index += 1
        return self._index

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
            kill_live()
            if self.maintainer is not None:
                self.maintainer.stop()
                self.report.maintenance = list(self.maintainer.actions)
                self.report.maintenance_plan["schedule"] = [
                    f"#{p.index}: {p.gap:.2f}s, {p.operation}, table pick {p.pick}" for p in self.maintainer.drawn
                ]
                if self.maintainer.crashed:
                    self.report.problems.append(f"the maintainer stopped: {self.maintainer.crashed}")
            self.release_sessions()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            seconds = time.monotonic() - started
            self.report.seconds = round(self._earlier_seconds + seconds, 1)
            self.report.sittings[-1].update(
                seconds=round(seconds, 1), kills=sum(self.report.kills().values()) - self._earlier_kills
            )
            if self._spark is not None:
                self._spark.stop()
        path = self.options.report or self.options.resume or (self.workdir / "drill-report.json")
        self.report.report_path = str(path)
        if self._temp and not self.options.keep and self.report.verdict == "pass":
            # A passing drill in a temp folder leaves only its report; a failing one keeps
            # everything (tables, log, staging, each run's output) for the post-mortem.
            for round_dir in self.workdir.glob("round-*"):
                shutil.rmtree(round_dir, ignore_errors=True)
        path.write_text(redact.text(json.dumps(redact.data(self.report.to_json()), indent=2, default=str)))
        return self.report

    def _plan_size(self) -> int:
        """The kills :meth:`plans` plans: the reachable failure points, then ``--kills``."""
        points = self.options.points if self.options.points is not None else list(crash.POINTS)
        return len([p for p in points if p.split(":")[0] not in unreachable_points(self.known_config)]) + self.options.kills

    def planned(self) -> int:
        """Steps the progress bar counts."""
        if self.options.scenario in ("kills", "neighbours"):
            return self._plan_size() + 1 - self.report.plans_done
        if self.options.scenario == "zombie":
            return 3
        return len(self.options.damages or DAMAGES) + 1


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"drill stopped by signal {signum}")


def _stopped_by(record: RunRecord) -> str:
    """What a round's verification is told of the run that failed in it (Verification.stopped_by)."""
    return f"run {record.index} failed (exit {record.exit_code}) before the sources drained"
