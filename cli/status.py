"""``materializer status``: the log's last epoch against what each table records (materializer.tools.status),
and what each documents binding's folder holds beyond it (its lag)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import typer

from .common import ConfigOption, RemoteOption, output
from .common import fail as _fail
from .common import session as _session
from .common import stop as _stop
from materializer.config import load_config
from materializer.errors import MaterializerError

if TYPE_CHECKING:
    from materializer.tools.status import PipelineStatus


def status(
    config: Path = ConfigOption,
    json_out: bool = typer.Option(False, "--json", help="Print as JSON."),
    remote: Optional[str] = RemoteOption,
) -> None:
    """Show the last committed epoch, what each table records, staged files pending, and the lag."""
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
    output(json_out, asdict(st) | {"agrees": st.agrees}, lambda: _text(st))
    if not st.agrees:
        raise typer.Exit(1)


def _text(st: PipelineStatus) -> Iterator[str]:
    """The status as text (without --json)."""
    yield f"pipeline {st.pipeline_id}: last committed epoch {st.last_epoch} (log sequence {st.last_seq}, {st.log_entries} entries kept)"
    for t in st.tables:
        mark = "ok " if t.agrees else "MISMATCH"
        recorded = "no table" if not t.exists else f"records epoch {t.recorded_epoch or 0} (Delta version {t.delta_version})"
        pending = f"; staged pending: {', '.join(t.staged_pending)}" if t.staged_pending else ""
        yield f"  [{mark}] {t.binding} -> {t.table}: {recorded}; {t.note}{pending}"
        if t.compaction_note:
            yield f"      {t.compaction_note}"
        lag = st.lag.get(t.binding)
        if lag is not None:
            yield f"      lag: {_lag_words(lag)}"
    if st.orphaned:
        yield f"  orphaned staged files (deleted at the next run): {', '.join(st.orphaned)}"


def _lag_words(lag: dict[str, Any]) -> str:
    if "error" in lag:
        return f"unknown: {lag['error']}"
    if not lag["files"]:
        return "none (every file read)"
    age = "" if lag["seconds"] is None else f", the oldest written {lag['seconds']:.0f} s ago"
    return f"{lag['files']} file{'s' if lag['files'] != 1 else ''} ({lag['bytes']} bytes) not read yet{age}"
