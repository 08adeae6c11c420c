"""``materializer validate``: the pipeline YAML checked as a run checks it, without Spark or storage."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import typer

from .common import ConfigOption, output
from .common import fail as _fail
from materializer.config import load_config
from materializer.errors import MaterializerError


def validate(
    config: Path = ConfigOption,
    json_out: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """Check the pipeline YAML as a run would, without starting Spark or opening a store (for CI)."""
    try:
        cfg = load_config(config)
    except MaterializerError as exc:
        _fail(exc)
        return
    found = summary(cfg)
    output(json_out, {"config": str(config), "valid": True, **found}, lambda: _text(config, found))


def summary(cfg: Any) -> dict[str, Any]:
    """The pipeline's id, each binding's source, table, key and mode, and its templates' sources."""

    def where(source: Any) -> str:
        names = ("path", "topic", "topics", "topic_pattern", "folders_in")
        place = next((value for value in (getattr(source, n, None) for n in names) if value), None)
        place = ", ".join(place) if isinstance(place, list) else place
        return f"{source.format} {place}" if place else source.format

    return {
        "pipeline_id": cfg.pipeline_id,
        "bindings": [
            {"name": b.name, "source": where(b.source), "table": b.table, "key": list(b.key), "mode": b.mode} for b in cfg.bindings
        ],
        "templates": [{"source": where(t.source), "table": t.table} for t in cfg.templates],
    }


def _text(config: Path, found: dict[str, Any]) -> Iterator[str]:
    bindings, templates = found["bindings"], found["templates"]
    yield f"{config}: valid: pipeline {found['pipeline_id']}, {len(bindings)} binding(s), {len(templates)} template(s)"
    for b in bindings:
        yield f"  {b['name']}: {b['source']} -> {b['table']} (key {', '.join(b['key'])}; {b['mode']})"
    for t in templates:
        yield f"  template: {t['source']} -> {t['table']} (its bindings are made when a run lists the source)"
