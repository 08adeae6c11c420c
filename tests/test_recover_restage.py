"""recover re-stages an epoch with the runtime's own steps (runtime.EpochStager), in process.

Epoch 2 is committed and not applied (a kill between the log commit and the apply), then its
staged dataset is lost. ``recover`` re-reads epoch 2 from its rewind checkpoint, exactly to the
extent the entry recorded though more input has arrived, stages it for the binding that lacks
it (a binding with loads: a ``sum``, so the re-staging reads the table at epoch 1), checks it
whole, and commits epoch 2 again; the next run applies it once. Its spool is left behind by no one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.recovery_log import RecoveryLog
from materializer.runtime import Runtime
from materializer.staging import SPOOL, StagingArea
from materializer.storage import open_store
from materializer.tools.recover import recover
from tests.helpers import assert_tables_equal_oracle, binding, write_jsonl
from tests.test_holes import Killed, config_with, killed_before_applying

pytestmark = pytest.mark.spark


def test_recover_re_stages_a_lost_epoch_with_the_runtimes_steps(spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "qty": 5}, {"id": 2, "qty": 1}])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 1, "qty": 2}, {"id": 3, "qty": 7}])
    config = config_with(
        tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", reductions={"qty": "sum"})], max_documents=2
    )
    with pytest.raises(Killed):
        killed_before_applying(Runtime(config, spark), 2).run()
    log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
    entry = log.read().last_commit
    assert entry is not None and entry.epoch == 2 and entry.driver_checkpoint is not None
    lost = entry.driver_checkpoint.staged["items"]
    assert lost is not None
    area = StagingArea.of(config)
    area.store.delete_prefix(lost.uri)
    assert not area.intact(lost)
    # More input since: the re-read must still end where epoch 2 ended.
    write_jsonl(tmp_path / "src" / "c.jsonl", [{"id": 3, "qty": 100}])

    summary = recover(config, spark)
    assert summary.recommitted_epoch == 2 and summary.restaged == {"items": 2}  # ids 1 and 3
    again = log.read().last_commit
    assert again is not None and again.epoch == 2 and again.runtime_checkpoint == entry.runtime_checkpoint
    restaged = again.driver_checkpoint.staged["items"]  # type: ignore[union-attr]
    assert restaged is not None and restaged.uri != lost.uri and area.intact(restaged)
    assert area.store.list(SPOOL) == []

    assert Runtime(config, spark).run().last_epoch == 3
    assert_tables_equal_oracle(spark, config)
