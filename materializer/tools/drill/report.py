"""What a drill reports: the events ``materializer drill`` displays as it goes, and the report
(runs, rounds, kills per point and per window, rows lost, duplicated or wrong) with its verdict."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from materializer.events import Event
from materializer.tools.drill.kill import RunRecord
from materializer.tools.drill.maintenance import MaintenanceAction
from materializer.tools.drill.plan import WINDOWS
from materializer.tools.drill.verification import TableCheck, Verification


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
    scratch: list[str] = field(default_factory=list)
    """What the scratch copy leaves out of the configuration (:func:`scratch_notes`)."""
    seconds: float = 0.0
    report_path: str = ""
    stopped_early: bool = False
    """SIGUSR1 cut the kill plan short; the verdict covers the kills made."""
    planned_kills: int = 0
    """Kills planned (failure points + ``--kills``): a drill cut short made fewer."""
    released_sessions: int = 0
    """``--remote``: the Connect sessions (the runs' and their clones') released on the server
    before each round's verification; a killed client never releases its own."""
    plans_done: int = 0
    """Kills of the plan (failure points, then random kills) carried out: landed, missed or
    found unreachable. A drill stopped early is resumed from here (``--resume``)."""
    kill_plan: dict[str, Any] = field(default_factory=dict)
    """What the plan was drawn from (``kills``, ``points``; with ``seed`` and the sources' epoch
    sizes that is the whole plan): a resumed drill draws the same plan and goes on with the rest."""
    maintenance: list[MaintenanceAction] = field(default_factory=list)
    """Scenario ``neighbours``: each maintenance action made beside the runs, in order."""
    maintenance_plan: dict[str, Any] = field(default_factory=dict)
    """Scenario ``neighbours``: what the schedule was drawn from (seed, actions, gaps)."""
    maintenance_stops: list[dict[str, Any]] = field(default_factory=list)
    """Scenario ``neighbours``: runs that stopped with an error instead of being killed or
    finishing, each with the maintenance action that preceded it (any one is a FAIL)."""
    sittings: list[dict[str, Any]] = field(default_factory=list)
    """One entry per process that ran the drill (``started_at``, ``seconds``, ``kills``, ``version``):
    more than one when a drill stopped early was resumed."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DrillReport":
        """A report as :meth:`to_json` wrote it (the figures it adds are computed again)."""
        def only(kind: Any, item: dict[str, Any]) -> dict[str, Any]:
            names = {f.name for f in fields(kind)}
            return {k: v for k, v in item.items() if k in names}

        rounds = []
        for item in data.get("rounds", []):
            tables = [TableCheck(**only(TableCheck, t)) for t in item.get("tables", [])]
            rounds.append(Verification(**{**only(Verification, item), "tables": tables}))
        runs = [RunRecord(**only(RunRecord, r)) for r in data.get("runs", [])]
        maintenance = [MaintenanceAction(**only(MaintenanceAction, m)) for m in data.get("maintenance", [])]
        return cls(**{**only(cls, data), "runs": runs, "rounds": rounds, "maintenance": maintenance})

    @property
    def verdict(self) -> str:
        if self.problems or self.maintenance_stops or any(r.verdict == "FAIL" for r in self.rounds) or not self.rounds:
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
        if self.scenario == "neighbours":
            done = [m for m in self.maintenance if m.outcome == "done"]
            data["maintenance_counts"] = {
                "done": dict(Counter(m.operation for m in done)),
                "failed": dict(Counter(m.operation for m in self.maintenance if m.outcome == "failed")),
                "no table": sum(m.outcome == "no table" for m in self.maintenance),
                "versions": sum(len(m.versions) for m in done),
                "pipeline stops": len(self.maintenance_stops),
            }
        for v, out in zip(self.rounds, data["rounds"]):
            out["verdict"] = v.verdict
            out["problems"] = v.problems
        return data
