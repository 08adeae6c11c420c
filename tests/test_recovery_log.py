"""The recovery log: exclusive, checksummed entries; fencing; compaction. No JVM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from materializer.errors import FencedError, RecoveryLogError
from materializer.protocol import DriverCheckpoint, StagedFile
from materializer.recovery_log import RecoveryLog, entry_path
from materializer.storage.local import LocalStore


def cp(epoch: int) -> DriverCheckpoint:
    return DriverCheckpoint(epoch=epoch, staged={"b": StagedFile(uri=f"staged/e{epoch}", rows=1, bytes=10, files=1)})


def log(tmp_path: Path, **kw) -> RecoveryLog:  # type: ignore[no-untyped-def]
    return RecoveryLog(LocalStore(str(tmp_path / "log")), "p1", **kw)


def test_empty_log_opens_at_epoch_zero_with_a_fence(tmp_path: Path) -> None:
    writer = log(tmp_path)
    state = writer.open()
    assert state.last_epoch == 0 and state.last_commit is None
    entries = writer.entries()
    assert [(e.seq, e.kind) for e in entries] == [(1, "fence")]


def test_commits_are_read_back_after_reopen(tmp_path: Path) -> None:
    first = log(tmp_path)
    first.open()
    first.commit(1, {"b": {"file": "a", "line": 3}}, cp(1))
    first.commit(2, {"b": {"file": "a", "line": 6}}, cp(2))
    second = log(tmp_path)
    state = second.open()
    assert state.last_epoch == 2
    assert state.last_commit is not None
    assert state.last_commit.runtime_checkpoint == {"b": {"file": "a", "line": 6}}
    assert state.last_commit.driver_checkpoint == cp(2)


def test_a_newer_open_fences_the_older_writer(tmp_path: Path) -> None:
    old = log(tmp_path)
    old.open()
    old.commit(1, {}, cp(1))
    new = log(tmp_path)
    assert new.open().last_epoch == 1
    with pytest.raises(FencedError, match="fenced"):
        old.commit(2, {}, cp(2))
    # the newer writer goes on; the log never saw the stale epoch 2
    new.commit(2, {"ok": True}, cp(2))
    assert log(tmp_path).read().last_commit.runtime_checkpoint == {"ok": True}  # type: ignore[union-attr]


def test_zombie_writing_into_a_compacted_gap_is_fenced_and_ignored(tmp_path: Path) -> None:
    zombie = log(tmp_path, retention=2)
    zombie.open()  # seq 1
    live = log(tmp_path, retention=2)
    live.open()  # seq 2
    for epoch in range(1, 8):
        live.commit(epoch, {"e": epoch}, cp(epoch))
    assert 2 not in live.sequences()  # compacted away
    # The zombie's next sequence (2) was taken by the live writer's fence, then compacted away:
    # its exclusive create succeeds, but the newer entries above it fence it all the same.
    with pytest.raises(FencedError):
        zombie.commit(1, {"stale": True}, cp(1))
    state = log(tmp_path).read()
    assert state.last_epoch == 7 and state.last_commit.runtime_checkpoint == {"e": 7}  # type: ignore[union-attr]


def test_compaction_keeps_the_last_commit_behind_many_fences(tmp_path: Path) -> None:
    writer = log(tmp_path, retention=2)
    writer.open()
    writer.commit(1, {"e": 1}, cp(1))
    for _ in range(6):  # restarts that crashed before committing anything
        log(tmp_path, retention=2).open()
    last = log(tmp_path, retention=2)
    state = last.open()
    assert state.last_epoch == 1
    last.commit(2, {"e": 2}, cp(2))
    assert log(tmp_path).read().last_epoch == 2
    assert len(last.sequences()) <= 4


def test_corrupted_entry_is_detected_with_file_named(tmp_path: Path) -> None:
    writer = log(tmp_path)
    writer.open()
    writer.commit(1, {"e": 1}, cp(1))
    path = tmp_path / "log" / entry_path(2)
    data = json.loads(path.read_text())
    data["entry"]["epoch"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(RecoveryLogError, match="checksum") as info:
        log(tmp_path).read()
    assert str(path) in str(info.value)


def test_torn_entry_is_detected(tmp_path: Path) -> None:
    writer = log(tmp_path)
    writer.open()
    writer.commit(1, {"e": 1}, cp(1))
    path = tmp_path / "log" / entry_path(2)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(RecoveryLogError, match="torn"):
        log(tmp_path).read()


def test_log_of_another_pipeline_is_refused(tmp_path: Path) -> None:
    log(tmp_path).open()
    other = RecoveryLog(LocalStore(str(tmp_path / "log")), "p2")
    with pytest.raises(RecoveryLogError, match="belongs to pipeline 'p1'"):
        other.read()


def test_temp_files_of_a_crashed_publish_are_invisible(tmp_path: Path) -> None:
    writer = log(tmp_path)
    writer.open()

    class Boom(Exception):
        pass

    def crash() -> None:
        raise Boom

    with pytest.raises(Boom):
        writer.commit(1, {}, cp(1), before_publish=crash)
    assert log(tmp_path).read().last_epoch == 0
    assert writer.sequences() == [1]


def test_open_removes_temp_files_a_killed_commit_left(tmp_path: Path) -> None:
    writer = log(tmp_path)
    writer.open()
    (tmp_path / "log" / "entries" / ".tmp-killed-mid-commit").write_bytes(b"a durable but unpublished entry")
    log(tmp_path).open()
    assert sorted(p.name for p in (tmp_path / "log" / "entries").iterdir()) == [
        "00000000000000000001.json", "00000000000000000002.json"
    ]


def test_a_writer_whose_temp_file_a_newer_open_removed_is_fenced_not_crashed(tmp_path: Path) -> None:
    """The newer Open cleans the older writer's temp file in its publish window: its link then
    fails with FileNotFoundError, which must read as "fenced", never as a storage failure."""
    old = log(tmp_path)
    old.open()

    def newer_open_meanwhile() -> None:
        log(tmp_path).open()  # publishes its fence and removes every temp file, ours included

    with pytest.raises(FencedError, match="log sequence 2 is taken"):
        old.commit(1, {"b": {}}, cp(1), before_publish=newer_open_meanwhile)
    assert [e.kind for e in log(tmp_path).entries()] == ["fence", "fence"]
    assert not [p for p in (tmp_path / "log" / "entries").iterdir() if p.name.startswith(".tmp-")]


def test_failures_are_recorded_read_and_cleared(tmp_path: Path) -> None:
    writer = log(tmp_path)
    writer.open()
    writer.record_failure(3, "items", "epoch 3, binding items: Delta refused …")
    assert writer.failures() == {(3, "items"): "epoch 3, binding items: Delta refused …"}
    writer.clear_failures(2)
    assert writer.failures() != {}
    writer.clear_failures(3)
    assert writer.failures() == {}


def test_local_publish_of_a_removed_temp_file_reads_as_not_published(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "store"))

    def cleaned_meanwhile() -> None:
        for temp in (tmp_path / "store" / "entries").glob(".tmp-*"):
            temp.unlink()

    assert store.put_if_absent("entries/x.json", b"data", before_publish=cleaned_meanwhile) is False
    assert not (tmp_path / "store" / "entries" / "x.json").exists()


def test_what_each_table_records_is_carried_from_entry_to_entry() -> None:
    """``recorded`` (issue #32: an epoch commits only to the tables it has something for): carried
    on from the previous entry; an older entry (none) committed to every table that existed."""
    file = StagedFile(uri="s/e6-a", rows=1, bytes=10, files=1)
    older = DriverCheckpoint(epoch=5, staged={"a": file, "b": None, "never": None}, written=["b"])
    assert older.commits_to("never") and older.table_records("never") == 5  # the old rule, unchanged
    recorded = DriverCheckpoint.carried(older, 6, ["a"])
    assert recorded == {"a": 6, "b": 5}  # "never" had no table: it records nothing
    sixth = DriverCheckpoint(epoch=6, staged={"a": file, "b": None, "never": None}, recorded=recorded, truncate=[], skipped={})
    assert [sixth.commits_to(n) for n in ("a", "b", "never")] == [True, False, False]
    assert [sixth.table_records(n) for n in ("a", "b", "never")] == [6, 5, 0]
    # Dead letters, a truncate and rows set aside each commit to the table too.
    dead = DriverCheckpoint(epoch=7, staged={"b": None}, dead_letters={"b": file}, recorded={"b": 7})
    assert dead.commits_to("b") and DriverCheckpoint(epoch=7, staged={"b": None}, truncate=["b"], recorded={}).commits_to("b")
    assert DriverCheckpoint(epoch=7, staged={"b": None}, skipped={"b": "kept"}, recorded={}).commits_to("b")
    assert DriverCheckpoint.carried(sixth, 7, []) == recorded and DriverCheckpoint.carried(None, 1, ["a"]) == {"a": 1}
