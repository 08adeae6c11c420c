"""`materializer backfill`: read one binding's source again into its table (materializer.backfill)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer

from .common import fail as _fail
from .common import output
from .common import session as _session
from .common import stop as _stop
from materializer.config import DEFAULT_CONFIG, load_config
from materializer.errors import MaterializerError

if TYPE_CHECKING:
    from materializer.backfill import BackfillSummary


def backfill(
    config: Path = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="Pipeline configuration (YAML)."),
    binding: str = typer.Option(..., "--binding", help="The binding whose source is read again."),
    position: Optional[str] = typer.Option(
        None, "--from", help="Where to read from: a documents file name (it and later files), or a position as JSON. Default: the start."
    ),
    truncate: bool = typer.Option(False, "--truncate", help="Delete every row of the binding's table first (in the same epoch)."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", help="Stop after this many epochs (then `materializer run` goes on)."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Read a binding's source again from the start (or --from) into its table, exactly once; other bindings go on as they were.

    Stop the pipeline first. An interrupted backfill is continued by `materializer run`.
    """
    try:
        cfg = load_config(config)
        from materializer.backfill import backfill as do_backfill

        spark = _session(cfg, None)
        try:
            summary = do_backfill(cfg, spark, binding, position=position, truncate=truncate, max_epochs=max_epochs)
        finally:
            _stop(spark)
    except MaterializerError as exc:
        _fail(exc)
        return
    output(json_out, asdict(summary), lambda: _text(summary))


def _text(summary: BackfillSummary) -> Iterator[str]:
    """What the backfill did, as text (without --json)."""
    where = f"from {json.dumps(summary.position)}" if summary.position else "from the start"
    yield (
        f"binding {summary.binding}: source set back {where} in epoch {summary.reset_epoch}"
        + (" (table truncated)" if summary.truncated else "")
        + f"; read again in epochs {summary.epochs or 'none yet'}; the log is at epoch {summary.last_epoch}"
    )
