"""The ``materializer`` command: the Typer app and its commands, one module each.

Command modules import only :mod:`materializer_cli.common` (never this module or each other), and
their heavy modules (Spark) inside the command, so ``--help`` is instant.
"""

from __future__ import annotations

import logging
import sys

import typer

from .backfill import backfill
from .bench import bench
from .common import options
from .drill import drill
from .recover import recover
from .run import run
from .schema import schema
from .status import status
from .validate import validate

app = typer.Typer(
    name="materializer",
    help="Materialize change streams into Delta tables, exactly once.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


# In the order `materializer --help` lists them.
for command in (run, status, validate, schema, bench, drill, recover, backfill):
    app.command()(command)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from materializer import redact

    # Every log line and traceback of this process with its secrets as *** (docs: 'Secrets').
    redact.install()
    import warnings

    # pyspark's import-time advice about pandas 3 concerns its pandas API, which we do not use.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    try:
        app()
    finally:
        if "pyspark" in sys.modules:  # a command that started Spark: its JVM ends before we do
            from materializer.spark import end_jvm

            end_jvm()


if __name__ == "__main__":
    main()
