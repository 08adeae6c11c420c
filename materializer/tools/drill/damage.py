"""The ``damage`` scenario's harm: a recovery-log entry torn or corrupted, a staged dataset deleted
or one of its files truncated, each done to the epoch a crash point left unapplied."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from materializer.config import PipelineConfig
from materializer.tools.drill.plan import DrillError

DAMAGES = ("torn-log", "corrupt-log", "missing-staged", "truncated-staged")


def do_damage(name: str, log: Any, staging: Any, config: PipelineConfig) -> str:
    """Do one damage to the pipeline's state; returns what was done."""
    from materializer.recovery_log import entry_path
    from materializer.staging import is_data_file

    state = log.read()
    entry = state.last_commit
    assert entry is not None and entry.driver_checkpoint is not None
    path = Path(log.store.spark_path(entry_path(entry.seq)))
    if name == "torn-log":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return f"tore log entry {path.name} (epoch {entry.epoch}) to {len(data) // 2} of {len(data)} bytes"
    if name == "corrupt-log":
        data = path.read_text()
        # Change one digit of the body: still valid JSON, so only the checksum can tell.
        changed = re.sub(r'"rows": (\d+)', lambda m: f'"rows": {int(m.group(1)) + 1}', data, count=1)
        path.write_text(changed)
        return f"changed a row count in log entry {path.name} (epoch {entry.epoch})"
    # In the configuration's order (the entry's own order is alphabetical): the first binding's
    # file is unapplied after `after-log-commit`, the last binding's after `after-apply`.
    in_order = [entry.driver_checkpoint.staged.get(b.name) for b in config.bindings]
    staged = [s for s in in_order if s is not None]
    if name == "missing-staged":
        target = staged[0]
        staging.delete_prefix(target.uri)
        return f"deleted staged dataset {target.uri} (epoch {entry.epoch})"
    if name == "truncated-staged":
        target = staged[-1]
        files = [f for f in staging.list(target.uri) if is_data_file(f.path)]
        victim = Path(staging.spark_path(files[0].path))
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])
        return f"truncated staged file {files[0].path} (epoch {entry.epoch}) to {len(data) // 2} of {len(data)} bytes"
    raise DrillError(f"unknown damage {name!r}")
