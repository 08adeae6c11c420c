"""``materializer recover``: repair a damaged log entry or staged file, or set a stuck epoch aside
(materializer.tools.recover)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer

from .common import output, session, stop
from .common import fail as _fail
from materializer.config import DEFAULT_CONFIG, load_config
from materializer.errors import ConfigError, MaterializerError

if TYPE_CHECKING:
    from materializer.tools.recover import RecoverySummary


def recover(
    config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Pipeline configuration (YAML)."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    skip_epoch: Optional[int] = typer.Option(
        None, "--skip-epoch", help="A stuck epoch (see `status`): set its rows for --binding aside, kept as Parquet."
    ),
    binding: Optional[str] = typer.Option(None, "--binding", help="With --skip-epoch: the binding whose table refuses the epoch."),
    keep_to: Optional[str] = typer.Option(None, "--keep-to", help="With --skip-epoch: where to keep the rows (default: in the staging area)."),
) -> None:
    """Repair a damaged recovery-log entry or staged file: re-stage the epoch from the source, same epoch number.

    With --skip-epoch N --binding B: set a stuck epoch's rows for B aside (kept whole) and commit N without them.
    Stop the pipeline first. Then run `materializer run` to apply what was re-staged.
    """
    try:
        cfg = load_config(config)
        if (skip_epoch is None) != (binding is None):
            raise ConfigError("--skip-epoch and --binding go together: the stuck epoch and the binding whose table refuses it")
        from materializer.tools.recover import recover as do_recover
        from materializer.tools.recover import skip_epoch as do_skip

        spark = session(cfg, None)
        try:
            if skip_epoch is not None and binding is not None:
                summary = do_skip(cfg, spark, skip_epoch, binding, keep_to)
            else:
                summary = do_recover(cfg, spark)
        finally:
            stop(spark)  # as every command that starts Spark (see common.stop)
    except MaterializerError as exc:
        _fail(exc)
        return
    output(json_out, asdict(summary), lambda: _text(summary, config))


def _text(summary: RecoverySummary, config: Path) -> Iterator[str]:
    """What recover did, as text (without --json)."""
    for action in summary.actions:
        yield f"- {action}"
    if summary.recommitted_epoch is not None:
        yield f"pipeline {summary.pipeline_id}: epoch {summary.recommitted_epoch} re-committed; now run `materializer run --config {config}`"
    else:
        yield f"pipeline {summary.pipeline_id}: nothing had to be re-staged"
