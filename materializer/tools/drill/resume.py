"""A drill stopped early, read back from its report to go on (``materializer drill --resume``):
the rest of the same seed's plan, in the same workdir, counted in the same report."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from materializer.tools.drill.plan import DrillError, DrillOptions
from materializer.tools.drill.report import DrillReport


def resumable(options: DrillOptions) -> DrillReport:
    """The report ``--resume`` names, if it is a ``kills`` drill with kills left to make."""
    assert options.resume is not None
    try:
        report = DrillReport.from_json(json.loads(Path(options.resume).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise DrillError(f"--resume {options.resume}: not a drill report this version can read ({exc})") from None
    if report.scenario != "kills":
        raise DrillError(f"--resume {options.resume}: a {report.scenario!r} drill; only a 'kills' drill can be resumed")
    if not report.stopped_early:
        raise DrillError(f"--resume {options.resume}: that drill was not stopped early; it made all the kills it planned")
    if report.verdict == "FAIL":
        raise DrillError(f"--resume {options.resume}: that drill failed; its rounds are kept for the post-mortem, not resumed")
    if not report.sittings:
        # (a report of before sittings were kept: its one sitting, from what it says)
        report.sittings.append(
            {"started_at": report.started_at, "seconds": report.seconds, "kills": sum(report.kills().values()), "version": "unknown"}
        )
    if not report.plans_done:
        # A report written before the count was kept: each plan it carried out landed a kill,
        # was missed, or found its point unreachable (and is named there).
        report.plans_done = sum(report.kills().values()) + len(report.missed) + len(
            [p for p in report.unreachable if p.startswith(("point ", "random kill "))]
        )
    return report


def resumed_options(previous: DrillReport, options: DrillOptions) -> DrillOptions:
    """The plan is the seed's and the options': the earlier sitting's, not this command line's."""
    return replace(
        options, config=Path(previous.config), seed=previous.seed, workdir=Path(previous.workdir),
        kills=int(previous.kill_plan.get("kills", options.kills)),
        points=previous.kill_plan.get("points", options.points),
    )


def resumed_workdir(previous: DrillReport) -> Path:
    """The earlier sitting's workdir, where new rounds go after its last (none after it yet)."""
    workdir = Path(previous.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    last = max((v.round for v in previous.rounds), default=0)
    later = sorted(d.name for d in workdir.glob("round-*") if d.name > f"round-{last:03d}")
    if later:
        raise DrillError(
            f"cannot resume the drill of {previous.started_at} in {workdir}: it ended with round {last}, "
            f"but {', '.join(later)} is there too (another sitting that wrote no report?). Move it away first."
        )
    return workdir
