"""A damaged recovery log or staged file, in process: the next run stops with a clear error, never
skips the epoch, and ``recover`` repairs it (the drill's damage scenario without its six JVMs).

The damage is done where the drill does it (materializer/tools/drill/damage.py ``do_damage``): a log entry torn
right after its commit, nothing applied; a staged file truncated after the first binding's apply,
the last binding's still to come. The run stops there (tests/helpers.py ``InProcessCrash``), the test
damages the state, a new run must refuse (``RecoveryLogError``, exit 5; ``StagingError``, exit 6)
naming ``materializer recover``; recover, run again, and the tables equal the oracle with each epoch
in Delta's history once. The same through the real CLI with SIGKILLs: ``pytest -m drill
tests/test_drill.py`` (every kind of damage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config
from materializer.delta import TableRef, history
from materializer.errors import MaterializerError, RecoveryLogError, StagingError
from materializer.recovery_log import RecoveryLog, encode, entry_path
from materializer.runtime import Runtime
from materializer.storage import open_store
from materializer.tools.recover import recover
from tests.helpers import InProcessCrash, assert_tables_equal_oracle, binding, write_config, write_jsonl

pytestmark = pytest.mark.spark

PIPELINE = "damage"


def _pipeline(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for n in range(3):  # one file per epoch
        write_jsonl(src / f"part-{n}.jsonl", [{"id": i % 4, "n": n * 10 + i} for i in range(5)] + [{"_meta": {"op": "d"}, "id": n}])
    return write_config(
        tmp_path,
        [
            binding("items", src, tmp_path / "tables" / "items", max_files=1),
            binding("events", src, tmp_path / "tables" / "events", max_files=1, mode="delta_updates"),
        ],
        pipeline_id=PIPELINE,
        transaction={"max_documents": 1000, "pipelined": False},
    )


def _tear_log(config: Any) -> None:
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)
    entry = log.read().last_commit
    assert entry is not None and entry.epoch == 2
    path = Path(log.store.spark_path(entry_path(entry.seq)))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _forge_bounds(config: Any) -> None:
    """The last entry rewritten by hand, checksum recomputed: a key bound naming a column that is no key."""
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)
    entry = log.read().last_commit
    assert entry is not None and entry.epoch == 2 and entry.driver_checkpoint is not None
    staged = {n: f.model_copy(update={"key_bounds": {"n": ["integer", "0", "1"]}}) if f is not None else None
              for n, f in entry.driver_checkpoint.staged.items()}
    assert any(staged.values())
    forged = entry.model_copy(update={"driver_checkpoint": entry.driver_checkpoint.model_copy(update={"staged": staged})})
    Path(log.store.spark_path(entry_path(entry.seq))).write_bytes(encode(forged))


def _truncate_staged(config: Any) -> None:
    entry = RecoveryLog(open_store(config.recovery_log), PIPELINE).read().last_commit
    assert entry is not None and entry.epoch == 2 and entry.driver_checkpoint is not None
    staging = open_store(config.staging_root)
    target = entry.driver_checkpoint.staged[config.bindings[-1].name]  # the binding not yet applied
    assert target is not None
    files = [f for f in staging.list(target.uri) if not f.path.rsplit("/", 1)[-1].startswith(("_", "."))]
    victim = Path(staging.spark_path(files[0].path))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])


# (damage, where the run stops in epoch 2, what the next run must raise, how the state is damaged)
DAMAGES = [
    ("torn-log", "after-log-commit:2", RecoveryLogError, _tear_log),
    ("forged-bounds", "after-log-commit:2", RecoveryLogError, _forge_bounds),
    ("truncated-staged", "after-apply:2", StagingError, _truncate_staged),
]


@pytest.mark.parametrize(("name", "stop_at", "error", "damage"), DAMAGES, ids=[d[0] for d in DAMAGES])
def test_damage_stops_the_next_run_and_recover_repairs_it(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, stop_at: str, error: type[MaterializerError], damage: Any
) -> None:
    config_path = _pipeline(tmp_path)
    config = load_config(config_path)
    killed = InProcessCrash(monkeypatch, stop_at)
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        damage(config)
        killed.disarm()
        with pytest.raises(error, match="materializer recover"):
            Runtime(config, spark).run()
        assert error.exit_code == {"torn-log": 5, "forged-bounds": 5, "truncated-staged": 6}[name]  # what the drill checks of the CLI
        recover(config, spark)
        assert Runtime(config, spark).run().last_epoch == 3
        assert_tables_equal_oracle(spark, config_path)
        for table in ("items", "events"):
            epochs = [h["tag"]["epoch"] for h in history(spark, TableRef(str(tmp_path / "tables" / table))) if h["tag"]]
            assert epochs == [1, 2, 3], (table, epochs)  # epoch 2 neither skipped nor applied twice
        assert [p for p in (tmp_path / "staging").rglob("*") if p.is_file()] == []
    finally:
        killed.thaw()
        frozen.join(timeout=120)
