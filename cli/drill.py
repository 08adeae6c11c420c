"""``materializer drill``: kill, restart and verify on a scratch copy (materializer.tools.drill)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from .common import fail as _fail
from materializer.config import DEFAULT_CONFIG
from materializer.errors import ConfigError, MaterializerError


def drill(
    config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Pipeline configuration (YAML); only its sources are read."),
    scenario: str = typer.Option(
        "kills", "--scenario",
        help="kills (crash points + random kills), zombie, damage, or neighbours (the kills with OPTIMIZE, ZORDER, VACUUM and auto compaction run beside them at random).",
    ),
    kills: int = typer.Option(3, "--kills", "-n", help="Random SIGKILLs of the whole run (JVM included), after the failure points."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random kill schedule (same seed, same schedule)."),
    points: Optional[List[str]] = typer.Option(
        None, "--points", help="Failure points to kill at, once each (repeat the option; default: all the config can reach; 'none': skip them)."
    ),
    damages: Optional[List[str]] = typer.Option(None, "--damage", help="damage scenario: torn-log, corrupt-log, missing-staged, truncated-staged (default: all)."),
    maintenance: Optional[List[str]] = typer.Option(
        None, "--maintenance",
        help="neighbours scenario: the maintenance to run, repeat the option: optimize, zorder, vacuum, vacuum-0 (RETAIN 0 HOURS), auto-compact (default: all).",
    ),
    max_documents: Optional[int] = typer.Option(None, "--max-documents", help="Override transaction.max_documents (cdcv2, kafka): more, smaller epochs."),
    max_files: Optional[int] = typer.Option(None, "--max-files", help="Override source.max_files of documents bindings (epochs are whole files)."),
    max_records: Optional[int] = typer.Option(None, "--max-records", help="Override source.max_records of kafka bindings (documents and debezium payloads)."),
    min_epochs: int = typer.Option(5, "--min-epochs", help="Unless a --max-* is given: epoch sizes chosen from the sources so a round has at least this many epochs."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Empty folder for the scratch log, staging and tables (default: a temp folder)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Where to write the JSON report (default: WORKDIR/drill-report.json)."),
    run_timeout: float = typer.Option(900.0, "--run-timeout", help="Seconds after which one run counts as hung."),
    keep: bool = typer.Option(False, "--keep", help="Keep the temp work folder even when the drill passes."),
    remote: Optional[str] = typer.Option(
        None, "--remote", help="Spark Connect server (sc://host:port): every run goes there, a kill ends the client only and the server's operation runs on."
    ),
    reader: str = typer.Option("spark", "--reader", help="How the tables are read for the comparison: spark, or deltalake (delta-rs, independent of the writer)."),
    resume: Optional[Path] = typer.Option(
        None, "--resume",
        help="The report of a kills drill stopped early (SIGUSR1): make the rest of its planned kills in its workdir, same seed and sources, and write one report of all of them (to that report unless --report).",
    ),
) -> None:
    """Kill the pipeline over and over on a scratch copy, restart it, and prove nothing was lost or duplicated.

    The configuration's own recovery log, staging and tables are never touched: the drill runs its
    sources into a scratch copy under --workdir. Exit 0: pass; 1: a discrepancy; 3: some table has no
    oracle yet ("not verified").
    """
    from materializer.extras import require

    require("rich", purpose="`materializer drill`'s progress display")
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from materializer.events import Collector, Event
    from materializer.tools.drill import (
        MAINTENANCE, SCENARIOS, Damaged, Drill, DrillOptions, RunEnded, RunStarted, Verifying, check_operations,
    )

    if reader not in ("spark", "deltalake"):
        _fail(ConfigError("--reader must be spark or deltalake"))
    if scenario not in SCENARIOS:
        _fail(ConfigError(f"--scenario must be one of {', '.join(SCENARIOS)}"))
    if maintenance and scenario != "neighbours":
        _fail(ConfigError(f"--maintenance is for --scenario neighbours (this drill is {scenario}); nothing was run"))
    if maintenance:
        try:
            check_operations(maintenance)
        except MaterializerError:
            _fail(ConfigError(f"--maintenance must be one or more of {', '.join(MAINTENANCE)} (got {', '.join(maintenance)}); nothing was run"))
    console = Console(stderr=True)
    options = DrillOptions(
        config=config,
        workdir=workdir,
        scenario=scenario,
        kills=kills,
        seed=seed,
        points=[] if points == ["none"] else (points or None),
        damages=damages or None,
        maintenance=maintenance or None,
        max_documents=max_documents,
        max_files=max_files,
        max_records=max_records,
        min_epochs=min_epochs,
        run_timeout=run_timeout,
        keep=keep,
        reader=reader,
        remote=remote,
        report=report,
        resume=resume,
    )
    try:
        progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=console, transient=False,
        )

        class Printer(Collector):
            def emit(self, event: Event) -> None:
                if isinstance(event, RunStarted):
                    progress.update(task, description=f"run {event.index}: {event.plan}")
                elif isinstance(event, RunEnded):
                    r = event.record
                    where = f" ({r.landed})" if r.landed and r.kind == "random" else ""
                    progress.console.print(f"  run {r.index}: {r.plan} -> {r.outcome}{where}, exit {r.exit_code}, {r.seconds:.0f}s")
                elif isinstance(event, Verifying):
                    progress.update(task, description=f"verifying round {event.round}")
                elif isinstance(event, Damaged):
                    progress.console.print(f"  damage {event.damage}: {event.what}")

        the_drill = Drill(options, None)
        if resume is not None:
            done = the_drill.report
            console.print(
                f"resuming the drill of {done.started_at} (seed {done.seed}): {done.plans_done} of {done.planned_kills} "
                f"planned kills made in {len(done.sittings) - 1} sitting(s), {len(done.rounds)} rounds; round {len(done.rounds) + 1} on"
            )
        for note in the_drill.report.epoch_sizes:
            console.print(f"epochs: {note}")
        for note in the_drill.report.scratch:
            console.print(f"scratch: {note}")
        with progress:
            task = progress.add_task("starting", total=the_drill.planned())
            the_drill.collector = Printer()
            result = the_drill.execute(lambda: progress.advance(task))
    except MaterializerError as exc:
        _fail(exc)
        return
    _print_report(result, Console())
    raise typer.Exit(result.exit_code)


def _print_report(result: Any, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"drill '{result.scenario}' of {result.config} (seed {result.seed})")
    table.add_column("kill / step")
    table.add_column("count", justify="right")
    for name, count in sorted(result.kills().items()):
        table.add_row(name, str(count))
    others = [r for r in result.runs if r.kind in ("zombie", "recover")]
    for r in others:
        table.add_row(r.plan, f"{r.outcome} (exit {r.exit_code})")
    data = result.to_json()
    table.add_row("restarts", str(data["restarts"]), end_section=not result.stopped_early)
    if result.stopped_early:
        # Said where the counts are: a reader of the table alone must not take it for the full plan.
        table.add_row("[yellow]stopped early (SIGUSR1)[/]", f"{data['kills_total']} of {result.planned_kills} planned kills", end_section=True)
    for window, count in data["windows"].items():
        shown = count if isinstance(count, str) else ("[yellow]never hit[/]" if count == 0 else str(count))
        table.add_row(f"kills {window}", shown if not isinstance(count, str) else f"not reachable: {count}")
    table.add_row("rows lost / duplicated / wrong", f"{data['rows']['lost']} / {data['rows']['duplicated']} / {data['rows']['wrong']}")
    for v in result.rounds:
        if v.stopped_by:
            # Its tables hold what was applied before the error: missing rows there are no loss.
            table.add_row(f"[yellow]round {v.round}: rows lost / wrong not counted[/]", v.stopped_by)
    if result.released_sessions:
        table.add_row("Connect sessions released (killed clients')", str(result.released_sessions))
    if len(result.sittings) > 1:
        parts = ", ".join(f"{s.get('kills', '?')} kills from {s['started_at']}" for s in result.sittings)
        table.add_row("sittings (resumed)", f"{len(result.sittings)}: {parts}")
    if result.scenario == "neighbours":
        counts = data["maintenance_counts"]
        made = ", ".join(f"{op} {n}" for op, n in sorted(counts["done"].items())) or "none"
        table.add_row("maintenance made (Delta versions)", f"{made} ({counts['versions']})")
        if counts["failed"]:
            table.add_row("maintenance that failed itself", ", ".join(f"{op} {n}" for op, n in sorted(counts["failed"].items())))
        stops = counts["pipeline stops"]
        table.add_row("pipeline stops after maintenance", f"[red]{stops}[/]" if stops else "0")
    table.add_row("time", f"{result.seconds:.0f}s")
    color = {"pass": "green", "FAIL": "red"}.get(result.verdict, "yellow")
    table.add_row("verdict", f"[bold {color}]{result.verdict}[/]")
    console.print(table)
    for v in result.rounds:
        for t in v.tables:
            state = "not verified: " + t.reason if not t.verified else ("ok" if not t.problems else "; ".join(t.problems))
            console.print(
                f"round {v.round} {t.binding}: {t.actual_rows} rows (oracle {t.expected_rows}), records epoch "
                f"{t.recorded_epoch} of log's {v.last_epoch}, {t.history_epochs} tagged commits: {state}"
            )
        for p in v.log_problems:
            console.print(f"round {v.round}: [red]{p}[/]")
        if v.orphans:
            console.print(f"round {v.round}: [red]orphaned staged files: {', '.join(v.orphans[:10])}[/]")
    waited = sum(m.outcome == "no table" for m in result.maintenance)
    if waited:
        console.print(f"maintenance: {waited} action(s) found no table yet (before the round's first epoch created it)")
    for m in (m for m in result.maintenance if m.outcome != "no table"):
        versions = f"versions {', '.join(map(str, m.versions))}" if m.versions else "no version"
        during = f"during run {m.run}" if m.run else "between runs"
        error = f": {m.error}" if m.error else ""
        console.print(
            f"maintenance #{m.index} at {m.at:.1f}s ({m.utc}, round {m.round}, {during}): {m.operation} on {m.binding} "
            f"-> {m.outcome}, {versions}{error}"
        )
    for p in result.problems:
        console.print(f"[red]problem:[/] {p}")
    for point, why in result.unreachable.items():
        console.print(f"{point}: not reachable with this configuration: {why}")
    for missed in result.missed:
        console.print(f"[yellow]kill not landed:[/] {missed}")
    console.print(f"report: {result.report_path}")
