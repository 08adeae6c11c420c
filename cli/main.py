"""The ``materializer`` command. Heavy modules (Spark) are imported inside commands so ``--help`` is instant."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from materializer.config import DEFAULT_CONFIG, load_config
from materializer.errors import MaterializerError

app = typer.Typer(
    name="materializer",
    help="Materialize change streams into Delta tables, exactly once.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Pipeline configuration (YAML).")
MasterOption = typer.Option(None, "--master", help="Spark master, e.g. spark://host:7077 (default: the config's, local[*]).")
RemoteOption = typer.Option(
    None, "--remote", help="Spark Connect server, e.g. sc://host:15002 (default: the config's spark.remote, if any)."
)


def _fail(exc: MaterializerError) -> None:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    raise typer.Exit(exc.exit_code)


def _session(config: Any, master: str | None, remote: str | None = None):  # type: ignore[no-untyped-def]
    from materializer.spark import session_for
    from materializer.storage import is_s3

    uses_s3 = any(is_s3(u) for u in [config.staging] + [b.table for b in config.bindings] + [b.source.path for b in config.bindings])
    # --master picks a classic master over the config's remote; --remote a server over both.
    remote = remote or (None if master else config.spark.remote)
    return session_for(master or config.spark.master, dict(config.spark.conf), remote=remote, s3=uses_s3)


class _Printer:
    """Prints the run's progress events on stderr, one line each."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def event(self, name: str, **fields: Any) -> None:
        if self.quiet:
            return
        if name == "opened":
            msg = f"opened pipeline {fields['pipeline']} at epoch {fields['epoch']} (writer {fields['writer']})"
        elif name == "read":
            msg = f"epoch {fields['epoch']}: read {fields['documents']} documents of {fields['binding']} ({fields['extent']})"
        elif name == "committed":
            msg = f"epoch {fields['epoch']}: committed to the recovery log"
        elif name == "applied":
            extra = f", {fields['rows']} rows" if fields.get("rows") else ""
            msg = f"epoch {fields['epoch']}: {fields['binding']} -> {fields['table']}: {fields['status']}{extra}"
        elif name == "orphans_deleted":
            msg = f"deleted {fields['files']} orphaned staged files"
        else:
            return
        typer.echo(msg, err=True)


@app.command()
def run(
    config: Path = ConfigOption,
    master: Optional[str] = MasterOption,
    remote: Optional[str] = RemoteOption,
    follow: bool = typer.Option(False, "--follow", help="Keep polling the sources for new files."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", help="Stop after this many new epochs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """Run the pipeline until its sources are drained (or forever with --follow)."""
    try:
        cfg = load_config(config)
        from materializer.runtime import Runtime

        spark = _session(cfg, master, remote)
        stop = {"requested": False}

        def request_stop(signum: int, _frame: Any) -> None:
            stop["requested"] = True

        signal.signal(signal.SIGTERM, request_stop)
        runtime = Runtime(cfg, spark, _Printer(quiet or json_out))
        summary = runtime.run(follow=follow, max_epochs=max_epochs, should_stop=lambda: stop["requested"])
    except MaterializerError as exc:
        _fail(exc)
        return
    docs = sum(sum(e.documents.values()) for e in summary.epochs)
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "pipeline_id": summary.pipeline_id,
                    "opened_at_epoch": summary.opened_at_epoch,
                    "last_epoch": summary.last_epoch,
                    "epochs": len(summary.epochs),
                    "documents": docs,
                    "reapplied": summary.reapplied.model_dump() if summary.reapplied else None,
                    "seconds": round(summary.seconds, 3),
                }
            )
        )
        return
    if summary.reapplied:
        statuses = ", ".join(f"{r.binding} {r.status}" for r in summary.reapplied.results) or "nothing to apply"
        typer.echo(f"re-applied epoch {summary.opened_at_epoch} after open: {statuses}")
    if summary.epochs:
        typer.echo(
            f"pipeline {summary.pipeline_id}: committed and applied epochs {summary.epochs[0].epoch}-"
            f"{summary.last_epoch} ({docs} documents) in {summary.seconds:.1f}s"
        )
    else:
        typer.echo(f"pipeline {summary.pipeline_id}: nothing new; last epoch {summary.last_epoch}")
    for binding in cfg.bindings:
        typer.echo(f"  {binding.name}: {binding.table}")


@app.command()
def status(
    config: Path = ConfigOption,
    json_out: bool = typer.Option(False, "--json", help="Print as JSON."),
    remote: Optional[str] = RemoteOption,
) -> None:
    """Show the last committed epoch, what each table records, and staged files pending."""
    try:
        cfg = load_config(config)
        from materializer.status import pipeline_status

        spark = _session(cfg, None, remote)
        st = pipeline_status(cfg, spark)
    except MaterializerError as exc:
        _fail(exc)
        return
    if json_out:
        from dataclasses import asdict

        typer.echo(json.dumps(asdict(st) | {"agrees": st.agrees}, indent=2))
    else:
        typer.echo(f"pipeline {st.pipeline_id}: last committed epoch {st.last_epoch} (log sequence {st.last_seq}, {st.log_entries} entries kept)")
        for t in st.tables:
            mark = "ok " if t.agrees else "MISMATCH"
            recorded = "no table" if not t.exists else f"records epoch {t.recorded_epoch or 0} (Delta version {t.delta_version})"
            pending = f"; staged pending: {', '.join(t.staged_pending)}" if t.staged_pending else ""
            typer.echo(f"  [{mark}] {t.binding} -> {t.table}: {recorded}; {t.note}{pending}")
        if st.orphaned:
            typer.echo(f"  orphaned staged files (deleted at the next run): {', '.join(st.orphaned)}")
    if not st.agrees:
        raise typer.Exit(1)


from cli.bench import bench as _bench  # noqa: E402 - issue #7; imports nothing heavy

app.command(name="bench")(_bench)


from cli.drill import register as _register_drill  # noqa: E402 - after the app exists

_register_drill(app)  # `materializer drill` and `materializer recover`


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    app()


if __name__ == "__main__":
    main()
