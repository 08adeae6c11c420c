"""What every command of the ``materializer`` CLI shares: options, the session, errors and output.

One Spark session builder (:func:`session`, over :func:`materializer.spark.config_session`), one way
to fail (:func:`fail`: the error's message on stderr, its exit code), one way to print a command's
result (:func:`output`: text, or JSON with ``--json``), each with every secret as ``***``
(:mod:`materializer.redact`, docs: 'Secrets'). Command modules import from here, never from
each other or from ``main`` (tests/test_cli_modules.py holds them to it).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterable, NoReturn

import typer

from materializer import redact
from materializer.config import DEFAULT_CONFIG
from materializer.errors import MaterializerError

options: dict[str, Any] = {"verbose": False}
"""The app's global options (``-v``), set by the callback in cli/main.py."""

ConfigOption = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Pipeline configuration (YAML).")
MasterOption = typer.Option(None, "--master", help="Spark master, e.g. spark://host:7077 (default: the config's, local[*]).")
RemoteOption = typer.Option(
    None, "--remote", help="Spark Connect server, e.g. sc://host:15002 (default: the config's spark.remote, if any)."
)


def fail(exc: MaterializerError) -> NoReturn:
    """A user's error: one line on stderr, no traceback, the error's exit code."""
    typer.secho(redact.text(f"error: {exc}"), fg=typer.colors.RED, err=True)
    raise typer.Exit(exc.exit_code)


def echo_json(data: Any, *, indent: int | None = 2) -> None:
    """A command's ``--json`` output on stdout."""
    typer.echo(redact.text(json.dumps(redact.data(data), indent=indent, default=str)))


def output(json_out: bool, data: Any, text: Callable[[], Iterable[str] | None], *, indent: int | None = 2) -> None:
    """A command's result on stdout: ``data`` as JSON with ``--json``, else the lines ``text()`` gives
    (built only then; ``None`` when it printed itself, e.g. a rich table)."""
    if json_out:
        echo_json(data, indent=indent)
        return
    for line in text() or ():
        typer.echo(redact.text(line))


def fetch_report(line: str) -> None:
    """The first run's jar download: one line on stderr, its progress rewritten in place on a terminal."""
    if line.startswith("  ") and "downloaded" in line:
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line.strip() + " " * 10)
            sys.stderr.flush()
        return
    if line.startswith("  fetched") and sys.stderr.isatty():
        sys.stderr.write("\r")
    typer.echo(line.strip() if line.startswith("  ") else line, err=True)


def session(config: Any, master: str | None, remote: str | None = None):  # type: ignore[no-untyped-def]
    """The SparkSession a command runs on (imports Spark only when called)."""
    from materializer.spark import config_session

    return config_session(config, master=master, remote=remote, verbose=options["verbose"], report=fetch_report)


def stop(spark: Any) -> None:
    """Stop the session we started before exiting: its JVM no longer shares our stderr (see
    materializer.spark.jvm), so without this the command could end while the JVM is still
    shutting down (a cluster would list the application as running for a while)."""
    from materializer.spark import stop_session

    stop_session(spark)
