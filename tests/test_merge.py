"""materializer.merge without a JVM: one CommitProperties per commit, and the apply's conflict path.

The apply reads the table's state, writes in one tagged commit, and on a commit conflict (Delta's
``delta.exceptions`` types, on the classic client and Spark Connect alike, or Delta's error class)
reads the table again and retries; any other failure is the epoch's ApplyError, never retried.
The table's state, the write and the Spark session are stand-ins here: what is tested is the
loop's decisions, one scenario per row (delta-rs's scenario tables).
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import pytest
from delta.exceptions.base import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    MetadataChangedException,
)

from materializer import merge
from materializer.merge import writer as apply_loop
from materializer.config import load_config
from materializer.delta import (
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
    OtherCommit,
    TableState,
    conflict_name,
    parse_user_metadata,
    user_metadata,
)
from materializer.errors import ApplyError, CommitConflictError, TableStateError
from materializer.merge import CommitProperties, DeltaWriter
from materializer.progress import Collector
from materializer.protocol import StagedFile
from materializer.staging import StagingArea
from materializer.storage import open_store
from tests.helpers import FakeConf, binding, write_config


class _Session:
    """The apply session's conf and tags: all the loop touches besides the write itself."""

    def __init__(self) -> None:
        self.conf = FakeConf()
        self.tags: list[str] = []

    def addTag(self, tag: str) -> None:  # noqa: N802 - PySpark's name
        self.tags.append(tag)

    def removeTag(self, tag: str) -> None:  # noqa: N802 - PySpark's name
        self.tags.remove(tag)


class _ErrorClass(Exception):
    """What a Spark Connect server's error looks like when the client maps no Python type to it."""

    def __init__(self, condition: str) -> None:
        super().__init__(f"[{condition}] at java.util.concurrent.FutureTask.run")
        self.condition = condition

    def getCondition(self) -> str:  # noqa: N802 - PySpark's name
        return self.condition


def _writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[BaseException], **options: Any
) -> tuple[DeltaWriter, list[dict[str, Any]]]:
    """A writer whose table exists at epoch 1 and whose write raises ``failures`` in turn, then
    succeeds; the calls' txn confs and tags are recorded. ``options``: the binding's."""
    config = load_config(write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", **options)]))
    session = _Session()
    writer = DeltaWriter(session, config, StagingArea(open_store(str(tmp_path / "staging"))), Collector())  # type: ignore[arg-type]
    looks: list[int] = []
    # Patched where the apply loop looks them up (materializer/merge/writer.py).
    monkeypatch.setattr(apply_loop, "table_state", lambda _s, _t, _app, **_k: looks.append(1) or TableState(True, 1, 1))
    monkeypatch.setattr(apply_loop, "latest_version", lambda _s, _t: 2)
    calls: list[dict[str, Any]] = []
    pending = list(failures)

    def write(binding: Any, table: Any, props: CommitProperties, source: Any, exists: bool, *_a: Any, **_k: Any) -> Any:
        calls.append({"props": props, "conf": dict(session.conf.values), "tags": list(session.tags), "looks": len(looks)})
        if pending:
            raise pending.pop(0)
        return {"num_inserted_rows": 0}

    writer.write = write  # type: ignore[method-assign]
    return writer, calls


# (failures the write raises in turn, the attempts expected, what the apply ends with)
SCENARIOS = [
    # the classic client's typed conflict: read the table again, retry, applied
    ([ConcurrentAppendException(message="files were added")], 2, nullcontext()),
    # a zombie's MERGE after the new writer evolved the schema: a conflict too
    ([MetadataChangedException(message="metadata changed")], 2, nullcontext()),
    ([ConcurrentTransactionException(message="same txn app id")], 2, nullcontext()),
    # Spark Connect without Delta's class mapping: recognised by the error class
    ([_ErrorClass("DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT")], 2, nullcontext()),
    # conflicts on every attempt: stop after CommitProperties.max_retries, saying to run again
    # (the stand-in session has no history to name the winner: the error says so)
    ([ConcurrentAppendException(message="x")] * 3, 3, pytest.raises(
        CommitConflictError, match=r"each of 3 attempts .*ConcurrentAppendException.*history could not be read.*run again",
    )),
    # not a conflict, though its message quotes java.util.concurrent: the epoch's error, once
    ([_ErrorClass("CAST_INVALID_INPUT")], 1, pytest.raises(ApplyError, match="Delta refused to apply")),
]


@pytest.mark.parametrize(("failures", "attempts", "ends"), SCENARIOS)
def test_the_apply_retries_conflicts_by_type_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[BaseException], attempts: int, ends: Any
) -> None:
    writer, calls = _writer(tmp_path, monkeypatch, failures)
    with ends:
        result = writer.apply(writer.config.bindings[0], 2, None)
        assert result.status == "empty" and result.delta_version == 2  # no staged rows: an empty tagged commit
        assert result.conflicts_retried == attempts - 1
    assert len(calls) == attempts
    # Every attempt read the table again first, and committed under the epoch's txn id.
    assert [c["looks"] for c in calls] == list(range(1, attempts + 1))
    for call in calls:
        assert call["conf"][TXN_APP_ID] == writer.config.pipeline_id and call["conf"][TXN_VERSION] == "2"
        assert parse_user_metadata(call["conf"][USER_METADATA]) == {"pipeline": writer.config.pipeline_id, "binding": "items", "epoch": 2}
        assert call["tags"] == [writer.apply_tag]
    # Session-wide confs: nothing of the epoch's txn stays on the apply session.
    assert TXN_APP_ID not in writer.apply_spark.conf.values and writer.apply_spark.tags == []  # type: ignore[attr-defined]


def test_an_epoch_the_table_records_is_skipped_without_a_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer, calls = _writer(tmp_path, monkeypatch, [])
    staged = StagedFile(uri="staged/epoch-000000000001/items-x", rows=1, bytes=1, files=1)
    assert writer.apply(writer.config.bindings[0], 1, staged).status == "skipped"
    assert calls == []


def test_commit_properties_are_one_frozen_keyword_only_object() -> None:
    props = CommitProperties.for_epoch("p", "items", 7)
    assert props == CommitProperties(txn_app_id="p", txn_version=7, user_metadata=props.user_metadata, max_retries=3)
    assert parse_user_metadata(props.user_metadata) == {"pipeline": "p", "binding": "items", "epoch": 7}
    assert props.writer_options() == {"txnAppId": "p", "txnVersion": "7", "userMetadata": props.user_metadata}
    with pytest.raises(dataclasses.FrozenInstanceError):
        props.txn_version = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        CommitProperties("p", 7, "m")  # type: ignore[misc]


def test_on_spark_connect_delta_conflicts_arrive_as_the_same_types() -> None:
    """A Connect session's writer registers delta-spark's mapping of the server's exception classes,
    whose Python classes subclass ``delta.exceptions``' types: one isinstance check serves both."""
    import pyspark.errors.exceptions.connect as connect_errors

    connect_session: Callable[[], Any] = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    merge.register_conflict_types(connect_session())
    mapped = connect_errors.EXCEPTION_CLASS_MAPPING["io.delta.exceptions.ConcurrentAppendException"]
    assert issubclass(mapped, ConcurrentAppendException)
    from materializer.delta import is_commit_conflict

    assert is_commit_conflict(mapped(message="files were added"))


PERSON = OtherCommit(version=5, operation="UPDATE", engine_info="Apache-Spark/4.2.0 Delta-Lake/4.4.0")
OPTIMIZE = OtherCommit(version=5, operation="OPTIMIZE", engine_info="Apache-Spark/4.2.0 Delta-Lake/4.4.0")
ZOMBIE = OtherCommit(version=5, operation="MERGE", user_metadata=user_metadata("test-pipeline", "items", 2), pipeline="test-pipeline")
OTHER_PIPELINE = OtherCommit(version=5, operation="MERGE", user_metadata=user_metadata("other", "x", 9), pipeline="other")

# (others_may_write, the commits after the version the apply read, conflicts in a row, attempts, what the apply ends with)
RACES = [
    # a person's UPDATE won, others_may_write: true: their row is part of the table, the MERGE lands over it
    (True, [PERSON], 1, 2, nullcontext()),
    # others_may_write: false, a compaction won: no row changed, a retry is sound
    (False, [OPTIMIZE], 1, 2, nullcontext()),
    # others_may_write: false, our own zombie's MERGE won: ours, a retry finds the epoch or merges after it
    (False, [ZOMBIE], 1, 2, nullcontext()),
    # others_may_write: false, a person's UPDATE won: a retry would write over it, so stop, naming it
    (False, [OPTIMIZE, PERSON], 1, 1, pytest.raises(
        TableStateError, match=r"lost the race to version 5 \(UPDATE, engineInfo 'Apache-Spark/4.2.0 Delta-Lake/4.4.0'\)",
    )),
    # another pipeline's MERGE changed rows too
    (False, [OTHER_PIPELINE], 1, 1, pytest.raises(TableStateError, match=r"version 5 \(MERGE, userMetadata")),
    # lost every race: the last winner named, the newest not ours, with its operation
    (True, [OPTIMIZE, ZOMBIE], 3, 3, pytest.raises(
        CommitConflictError, match=r"each of 3 attempts .* the last race was won by version 5 \(OPTIMIZE, .*run again",
    )),
]


@pytest.mark.parametrize(("others_may_write", "others", "conflicts", "attempts", "ends"), RACES)
def test_a_lost_race_is_retried_unless_a_retry_would_write_over_a_persons_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others_may_write: bool, others: list[OtherCommit],
    conflicts: int, attempts: int, ends: Any,
) -> None:
    writer, calls = _writer(
        tmp_path, monkeypatch, [ConcurrentDeleteReadException(message="x")] * conflicts, others_may_write=others_may_write,
    )
    read: list[int | None] = []
    monkeypatch.setattr(apply_loop, "commits_after", lambda _s, _t, version: read.append(version) or list(others))
    with ends as stopped:
        result = writer.apply(writer.config.bindings[0], 2, None)
        assert result.status == "empty" and result.conflicts_retried == conflicts
    assert len(calls) == attempts
    assert all(version == 1 for version in read)  # the history after the version each attempt read
    if isinstance(stopped, pytest.ExceptionInfo):
        assert "ConcurrentDeleteReadException" in str(stopped.value) and "epoch 2" in str(stopped.value)
        if isinstance(stopped.value, CommitConflictError):
            assert (stopped.value.version, stopped.value.operation, stopped.value.epoch) == (5, "OPTIMIZE", 2)


def test_conflicts_are_named_as_delta_names_them() -> None:
    assert conflict_name(ConcurrentDeleteReadException(message="x")) == "ConcurrentDeleteReadException"
    assert conflict_name(_ErrorClass("DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT")) == "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT"
    assert OtherCommit(version=3, operation="").shown() == "version 3 (an operation the history does not name)"
