"""``materializer run``: the pipeline's transaction loop (materializer.runtime), its progress on stderr,
its events and metrics."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import typer

from .common import ConfigOption, MasterOption, RemoteOption, options, output
from .common import fail as _fail
from .common import session as _session
from .common import stop as _stop
from materializer.config import load_config
from materializer.errors import ConfigError, MaterializerError

if TYPE_CHECKING:
    from materializer.config import PipelineConfig
    from materializer.runtime import RunSummary

log = logging.getLogger("materializer")


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
        from materializer.runtime import open_runtime

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
            runtime = open_runtime(cfg, spark, collector)
            summary = runtime.run(follow=follow, max_epochs=max_epochs, should_stop=lambda: stop["requested"])
        finally:
            _stop(spark)
        if metrics is not None and metrics_push:
            _push(metrics, metrics_push)
    except MaterializerError as exc:
        _fail(exc)
        return
    result = summary.to_dict()
    if stream is not None:
        from materializer.events import Finished

        collector.emit(Finished(**result))
        if stream is not sys.stdout:
            stream.close()
        else:
            return  # stdout carries the JSON lines only
    output(json_out, result, lambda: _text(summary, cfg), indent=None)


def _text(summary: RunSummary, cfg: PipelineConfig) -> Iterator[str]:
    """The run's summary as text (without --json)."""
    if summary.reapplied:
        statuses = ", ".join(f"{r.binding} {r.status}" for r in summary.reapplied.results) or "nothing to apply"
        yield f"re-applied epoch {summary.opened_at_epoch} after open: {statuses}"
    if summary.epochs:
        yield (
            f"pipeline {summary.pipeline_id}: committed and applied epochs {summary.epochs[0].epoch}-"
            f"{summary.last_epoch} ({summary.documents} documents) in {summary.seconds:.1f}s"
        )
    else:
        yield f"pipeline {summary.pipeline_id}: nothing new; last epoch {summary.last_epoch}"
    for binding in cfg.bindings:
        yield f"  {binding.name}: {binding.table}"
    if cfg.templates:
        yield f"  and the bindings its {len(cfg.templates)} template(s) made: `materializer status` names each"
