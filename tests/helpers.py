"""Shared test helpers: pipeline configs in a temp folder, the CLI as a subprocess, the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent

current_tiers: set[str] | None = None
"""The running test's tier markers (tests/conftest.py sets it); None outside a test."""


def write_config(folder: Path, bindings: list[dict[str, Any]], **settings: Any) -> Path:
    """A pipeline config whose state lives under ``folder``; returns its path."""
    data = {
        "pipeline_id": settings.pop("pipeline_id", "test-pipeline"),
        "recovery_log": str(folder / "log"),
        "staging": str(folder / "staging"),
        "transaction": {"max_documents": settings.pop("max_documents", 1000)},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "bindings": bindings,
    }
    data.update(settings)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def binding(name: str, source: Path, table: Path, key: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    source_options = {k: extra.pop(k) for k in ("max_files", "max_bytes", "schema") if k in extra}
    return {
        "name": name,
        "source": {"format": extra.pop("format", "documents"), "path": str(source), **source_options},
        "table": str(table),
        "key": key or ["id"],
        **extra,
    }


def write_jsonl(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def require_subprocess_tier(what: str) -> None:
    """Fail the running test unless it is in the ``subprocess`` tier (tests/conftest.py)."""
    if current_tiers is not None and "subprocess" not in current_tiers:
        import pytest

        pytest.fail(f"{what}: mark the test `subprocess` (or `crash`)")


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600, jvm: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``materializer ARGS`` in a fresh process (its own JVM).

    A test that starts a JVM this way belongs to the ``subprocess`` tier (mark it ``subprocess``, or
    ``crash`` if it kills it). ``jvm=False`` says the command stops before Spark (``--version``,
    ``schema``, a configuration error, no Java): allowed in any tier, and held to it by a
    ``JAVA_HOME`` that has no Java unless the test sets its own.
    """
    full_env = dict(os.environ)
    full_env.pop("MATERIALIZER_CRASH_AT", None)
    if jvm:
        require_subprocess_tier("run_cli starts the CLI and its JVM (or pass jvm=False)")
    else:
        full_env["JAVA_HOME"] = str(REPO / "no-jvm-in-this-tier")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def documents_oracle(folder: Path, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Standard mode, lastWriteWins: the final row per key, computed in plain Python."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".jsonl", ".json", ".ndjson")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            doc = json.loads(line)
            k = tuple(doc[f] for f in key)
            if doc.get("_meta", {}).get("op") == "d":
                state.pop(k, None)
            else:
                state[k] = {f: v for f, v in doc.items() if f != "_meta"}
    return state


def table_rows(spark: Any, table: Path | str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The Delta table as {key: row}, dropping NULL fields (absent in the source documents)."""
    rows = spark.read.format("delta").load(str(table)).collect()
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        data = {k: v for k, v in row.asDict(recursive=True).items() if v is not None}
        k = tuple(data[f] for f in key)
        assert k not in out, f"key {k} appears twice in {table}"
        out[k] = data
    return out
