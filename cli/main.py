"""The ``materializer`` command. Heavy modules (Spark) are imported inside commands so ``--help`` is instant."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from .common import echo_json, fail, options, session, stop
from materializer.config import DEFAULT_CONFIG, load_config
from materializer.errors import ConfigError, MaterializerError

# The names other modules of cli/ used before cli/common.py existed.
_fail, _session, _stop = fail, session, stop

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


log = logging.getLogger("materializer")


def _version(value: bool) -> None:
    if value:
        from materializer import __version__

        typer.echo(f"materializer {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Spark's and Ivy's own output (start-up, jar fetching)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    options["verbose"] = verbose


def _log_to_stderr(quiet: bool) -> None:
    """Progress lines go through the ``materializer`` logger; the CLI shows them on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG if options["verbose"] else logging.WARNING if quiet else logging.INFO)


def _metrics(pipeline_id: str, port: int | None, host: str, textfile: Path | None, push: str | None) -> Any:
    if port is None and textfile is None and push is None:
        return None
    from materializer.metrics import PrometheusCollector

    metrics = PrometheusCollector(pipeline_id)
    if port is not None:
        try:
            bound_host, bound_port, _server = metrics.serve(port, host)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port} ({exc}); choose another port") from exc
        log.warning("metrics: http://%s:%d/metrics", bound_host, bound_port)
    if textfile is not None:
        metrics.textfile(str(textfile))
    return metrics


def _push(metrics: Any, gateway: str) -> None:
    try:
        metrics.push(gateway)
    except OSError as exc:
        # The run itself succeeded: say the push failed, without failing the run.
        log.warning("metrics: the push to %s failed (%s); the run's epochs are committed and applied", gateway, exc)


@app.command()
def run(
    config: Path = ConfigOption,
    master: Optional[str] = MasterOption,
    remote: Optional[str] = RemoteOption,
    follow: bool = typer.Option(False, "--follow", help="Keep polling the sources for new files."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", help="Stop after this many new epochs."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    events: Optional[str] = typer.Option(
        None, "--events", help="'jsonl': one JSON line per epoch (progress records) and the summary, on stdout."
    ),
    events_file: Optional[Path] = typer.Option(None, "--events-file", help="Append the JSON lines to this file instead of stdout."),
    all_events: bool = typer.Option(
        False, "--all-events", help="With --events/--events-file: a JSON line for every event (read, committed, applied, spans…), not only the records."
    ),
    metrics_port: Optional[int] = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics on this port while running (0: any free port)."
    ),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address the metrics endpoint binds (default loopback only)."),
    metrics_file: Optional[Path] = typer.Option(
        None, "--metrics-file", help="Write Prometheus metrics to this file after each epoch (node-exporter textfile format)."
    ),
    metrics_push: Optional[str] = typer.Option(None, "--metrics-push", help="Push metrics to this Pushgateway URL when the run ends."),
) -> None:
    """Run the pipeline until its sources are drained (or forever with --follow)."""
    if events not in (None, "jsonl"):
        _fail(ConfigError(f"--events {events!r}: the only format is 'jsonl'"))
    if events_file is not None or all_events:
        events = "jsonl"
    stream = None
    try:
        cfg = load_config(config)
        from materializer.progress import JsonLinesCollector, Tee, TextCollector
        from materializer.runtime import Runtime

        _log_to_stderr(quiet or json_out)
        sinks: list[Any] = [TextCollector(log, quiet=quiet or json_out)]
        if events == "jsonl":
            stream = open(events_file, "a") if events_file is not None else sys.stdout
            sinks.append(JsonLinesCollector(stream, kinds=None if all_events else JsonLinesCollector.RECORDS))
        metrics = _metrics(cfg.pipeline_id, metrics_port, metrics_host, metrics_file, metrics_push)
        if metrics is not None:
            sinks.append(metrics)
        collector = Tee(*sinks)
        spark = _session(cfg, master, remote)
        stop = {"requested": False}

        def request_stop(signum: int, _frame: Any) -> None:
            stop["requested"] = True

        signal.signal(signal.SIGTERM, request_stop)
        try:
            runtime = Runtime(cfg, spark, collector)
            summary = runtime.run(follow=follow, max_epochs=max_epochs, should_stop=lambda: stop["requested"])
        finally:
            _stop(spark)
        if metrics is not None and metrics_push:
            _push(metrics, metrics_push)
    except MaterializerError as exc:
        _fail(exc)
        return
    docs = sum(sum(e.documents.values()) for e in summary.epochs)
    result = {
        "pipeline_id": summary.pipeline_id,
        "opened_at_epoch": summary.opened_at_epoch,
        "last_epoch": summary.last_epoch,
        "epochs": len(summary.epochs),
        "documents": docs,
        "reapplied": summary.reapplied.model_dump() if summary.reapplied else None,
        "seconds": round(summary.seconds, 3),
    }
    if stream is not None:
        from materializer.events import Finished

        collector.emit(Finished(**result))
        if stream is not sys.stdout:
            stream.close()
        else:
            return  # stdout carries the JSON lines only
    if json_out:
        echo_json(result, indent=None)
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
        from materializer.tools.status import pipeline_status

        # Path tables are read by delta-rs; Spark starts only for a table that needs it (a catalog name).
        started: list[Any] = []

        def start_spark() -> Any:
            started.append(_session(cfg, None, remote))
            return started[0]

        try:
            st = pipeline_status(cfg, start_spark)
        finally:
            for spark in started:
                _stop(spark)
    except MaterializerError as exc:
        _fail(exc)
        return
    if json_out:
        from dataclasses import asdict

        echo_json(asdict(st) | {"agrees": st.agrees})
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


@app.command()
def schema() -> None:
    """Print the JSON Schema of the pipeline YAML (for editors and CI checks)."""
    echo_json(config_schema())


def config_schema() -> dict[str, Any]:
    """pydantic's JSON Schema of PipelineConfig, with the draft it follows."""
    from materializer.config import PipelineConfig

    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **PipelineConfig.model_json_schema()}


from .bench import bench as _bench  # noqa: E402 - issue #7; imports nothing heavy

app.command(name="bench")(_bench)


from .drill import register as _register_drill  # noqa: E402 - after the app exists

_register_drill(app)  # `materializer drill` and `materializer recover`
from .backfill import register as _register_backfill  # noqa: E402 - after the app exists

_register_backfill(app)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import warnings

    # pyspark's import-time advice about pandas 3 concerns its pandas API, which we do not use.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    app()


if __name__ == "__main__":
    main()
