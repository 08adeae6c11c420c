"""Symbolic links and paths that leave a root (issue #66 items 3 and 4). No JVM but the last tests.

Item 4: clean-up only ever deletes under the staging root, resolved, through no link; a staged file
named by a recovery-log entry is checked before anything deletes it. Item 3: a link in a source
folder is not read unless the source says ``follow_links: true``, and then only a link to a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from materializer.errors import RecoveryLogError, SourceError, StorageError, UnsafePathError
from materializer.protocol import DriverCheckpoint, StagedFile
from materializer.recovery_log import RecoveryLog, decode, encode, entry_path
from materializer.staging import StagingArea
from materializer.storage import check_relative, open_store
from materializer.storage.local import LocalStore

FORGED = [
    "../../victim",
    "staged/../../victim",
    "staged/epoch-000000000001/../../../victim",
    "a/../../x",
    "/abs/victim",
    "//host/victim",
    "file:///abs/victim",
    "file:/abs/victim",
    "s3://bucket/victim",
    "%2e%2e/%2e%2e/victim",
    "staged/%2E%2E/victim",
    "staged/..%2fvictim",
    "staged\\..\\victim",
    "./staged/x",
    "C:/victim",
]


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A staging root beside a victim folder whose files nothing may delete."""
    root = tmp_path / "staging" / "p"
    victim = tmp_path / "victim"
    victim.mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    (victim / "sub").mkdir()
    (victim / "sub" / "deep.txt").write_text("keep me too")
    root.mkdir(parents=True)
    return {"root": root, "victim": victim, "tmp": tmp_path}


def victim_intact(world: dict[str, Path]) -> None:
    assert (world["victim"] / "precious.txt").read_text() == "keep me"
    assert (world["victim"] / "sub" / "deep.txt").read_text() == "keep me too"


def staged(uri: str) -> StagedFile:
    return StagedFile(uri=uri, rows=1, bytes=1, files=1)


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- item 4: paths that leave the root -----------------------------------------------------------


@pytest.mark.parametrize("path", FORGED)
def test_a_path_leaving_the_root_is_refused_by_every_delete(world: dict[str, Path], path: str) -> None:
    store = LocalStore(str(world["root"]))
    write(world["root"] / "staged" / "keep.txt")
    for delete in (store.delete, store.delete_prefix, store.prune_empty):
        with pytest.raises(UnsafePathError) as refused:
            delete(path)
        assert isinstance(refused.value, StorageError) and "Nothing was deleted" in str(refused.value)
    victim_intact(world)
    assert (world["root"] / "staged" / "keep.txt").exists()


def test_the_shared_check_takes_what_the_materializer_makes() -> None:
    for path in ("staged/epoch-000000000001/items-0123456789ab", "spool/w/epoch-000000000002/x.jsonl", "entries/1.json"):
        assert check_relative(path, "delete") == path.split("/")
    assert check_relative("", "delete", empty=True) == []
    with pytest.raises(UnsafePathError):
        check_relative("", "delete")


@pytest.mark.parametrize("path", ["../victim", "/victim", "a/../../victim"])
def test_s3_keys_refuse_dot_dot_and_a_leading_slash_too(path: str) -> None:
    from materializer.storage.s3 import S3Store

    store = S3Store("s3://bucket/root", client=object())  # type: ignore[arg-type] - refused before any call
    with pytest.raises(UnsafePathError):
        store.delete(path)
    with pytest.raises(UnsafePathError):
        store.delete_prefix(path)


@pytest.mark.parametrize("uri", FORGED + ["elsewhere/epoch-000000000001/b-0123456789ab"])
def test_a_forged_staged_uri_is_refused_before_any_delete(world: dict[str, Path], uri: str) -> None:
    area = StagingArea(LocalStore(str(world["root"])))
    for act in (lambda: area.delete_applied(staged(uri)), lambda: area.discard([staged(uri)]), lambda: area.intact(staged(uri))):
        with pytest.raises(RecoveryLogError, match="materializer recover"):
            act()
    victim_intact(world)


def test_a_forged_entry_is_refused_where_the_log_is_read_naming_the_entry(world: dict[str, Path]) -> None:
    log = RecoveryLog(open_store(str(world["tmp"] / "log")), "p")
    log.open()
    checkpoint = DriverCheckpoint(epoch=1, staged={"b": staged("staged/epoch-000000000001/b-0123456789ab")})
    log.commit(1, {}, checkpoint)
    assert log.read().last_epoch == 1
    for field in ("staged", "dead_letters"):
        forged = DriverCheckpoint(epoch=2, **{field: {"b": staged("../../victim")}})  # type: ignore[arg-type]
        entry = log._entry(9, "commit", 2, runtime_checkpoint={}, driver_checkpoint=forged)
        with pytest.raises(RecoveryLogError) as refused:
            decode(encode(entry), "log/entries/9.json")
        message = str(refused.value)
        assert "log/entries/9.json" in message and f"driver_checkpoint.{field}.b" in message
        assert "materializer recover" in message and "'../../victim'" in message


def test_a_forged_entry_in_the_log_stops_the_read_before_the_apply_deletes(world: dict[str, Path]) -> None:
    """The whole path: an entry on disk rewritten by hand with a staged file outside the area."""
    log_store = open_store(str(world["tmp"] / "log"))
    log = RecoveryLog(log_store, "p")
    log.open()
    outside = os.path.relpath(world["victim"], world["root"])  # ../../victim, as the report had it
    forged = DriverCheckpoint(epoch=1, staged={"b": staged(outside)})
    entry = log._entry(2, "commit", 1, runtime_checkpoint={}, driver_checkpoint=forged)
    (world["tmp"] / "log" / entry_path(2)).write_bytes(encode(entry))
    with pytest.raises(RecoveryLogError, match="entries/00000000000000000002.json"):
        RecoveryLog(log_store, "p").read()
    victim_intact(world)


# --- item 4: links inside the staging area --------------------------------------------------------


def link_layouts(world: dict[str, Path]) -> dict[str, Path]:
    """Where a link may sit in the staging tree, each pointing at the victim folder."""
    return {
        "spool": world["root"] / "spool",
        "spool-writer": world["root"] / "spool" / "w1",
        "staged": world["root"] / "staged",
        "epoch-folder": world["root"] / "staged" / "epoch-000000000001",
        "dataset": world["root"] / "staged" / "epoch-000000000001" / "b-0123456789ab",
        "tmp": world["root"] / "_tmp",
    }


@pytest.mark.parametrize("where", ["spool", "spool-writer", "staged", "epoch-folder", "dataset", "tmp"])
def test_a_linked_folder_anywhere_in_staging_never_has_its_targets_files_deleted(world: dict[str, Path], where: str) -> None:
    link = link_layouts(world)[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(world["victim"], target_is_directory=True)
    area = StagingArea(LocalStore(str(world["root"])))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        area.delete_unreferenced(None, lambda: None)
    for act in (
        lambda: area.delete_applied(staged("staged/epoch-000000000001/b-0123456789ab")),
        lambda: area.delete_spool("w1"),
        lambda: area.store.delete_prefix("spool/w1/epoch-000000000001"),
        lambda: area.store.delete_prefix(""),
        lambda: area.store.delete(os.path.relpath(link / "precious.txt", world["root"])),
    ):
        try:
            act()
        except UnsafePathError:
            pass
    for folder in ("", "staged", "spool", "_tmp"):
        area.store.prune_empty(folder)
    victim_intact(world)
    assert link.is_symlink()  # not ours to delete either


def test_a_link_to_a_file_in_staging_is_neither_listed_nor_deleted_through(world: dict[str, Path]) -> None:
    store = LocalStore(str(world["root"]))
    write(world["root"] / "spool" / "w1" / "real.jsonl")
    (world["root"] / "spool" / "w1" / "secret.jsonl").symlink_to(world["victim"] / "precious.txt")
    (world["root"] / "spool" / "w1" / "dangling.jsonl").symlink_to(world["victim"] / "gone.txt")
    listing = store.scan("spool")
    assert [f.path for f in listing.files] == ["spool/w1/real.jsonl"]
    assert [(link.path, link.kind) for link in listing.links] == [
        ("spool/w1/dangling.jsonl", "dangling"), ("spool/w1/secret.jsonl", "file"),
    ]
    assert store.list("spool") == listing.files
    with pytest.raises(UnsafePathError, match="secret.jsonl"):
        store.delete("spool/w1/secret.jsonl")
    with pytest.raises(UnsafePathError):
        store.delete_prefix("spool/w1")
    assert (world["root"] / "spool" / "w1" / "real.jsonl").exists()  # refused before deleting anything
    victim_intact(world)


def test_a_prefix_under_a_link_lists_only_the_link(world: dict[str, Path]) -> None:
    store = LocalStore(str(world["root"]))
    (world["root"] / "spool").symlink_to(world["victim"], target_is_directory=True)
    listing = store.scan("spool/sub")
    assert listing.files == [] and [link.path for link in listing.links] == ["spool"]
    assert store.list("spool") == []


def test_a_staged_dataset_holding_a_link_is_damage_not_data(world: dict[str, Path]) -> None:
    area = StagingArea(LocalStore(str(world["root"])))
    dataset = world["root"] / "staged" / "epoch-000000000001" / "b-0123456789ab"
    data = write(dataset / "part-0.parquet", "p")
    (dataset / "part-1.parquet").symlink_to(world["victim"] / "precious.txt")
    assert not area.intact(StagedFile(uri="staged/epoch-000000000001/b-0123456789ab", rows=1, bytes=data.stat().st_size, files=1))


def test_clean_up_without_links_still_deletes_what_it_should(world: dict[str, Path]) -> None:
    """The refusals cost the ordinary clean-up nothing: orphans, spools and empty folders go."""
    area = StagingArea(LocalStore(str(world["root"])))
    keep = "staged/epoch-000000000001/b-0123456789ab"
    write(world["root"] / keep / "part-0.parquet")
    write(world["root"] / "staged" / "epoch-000000000002" / "b-aaaaaaaaaaaa" / "part-0.parquet")
    write(world["root"] / "spool" / "w1" / "epoch-000000000002" / "x.jsonl")
    checkpoint = DriverCheckpoint(epoch=1, staged={"b": staged(keep)})
    assert area.delete_unreferenced(checkpoint, lambda: None) == (2, 1)
    assert sorted(area.datasets()) == [keep] and not (world["root"] / "spool" / "w1").exists()
    area.delete_applied(staged(keep))
    assert area.datasets() == [] and not (world["root"] / keep).exists()


def test_a_staging_root_that_is_itself_a_link_is_the_configured_folder(world: dict[str, Path]) -> None:
    """The configured folder may be a link (a volume mounted elsewhere): it is the root, resolved once."""
    real = world["tmp"] / "real-staging"
    write(real / "spool" / "w1" / "x.jsonl")
    linked = world["tmp"] / "linked-staging"
    linked.symlink_to(real, target_is_directory=True)
    store = LocalStore(str(linked))
    assert [f.path for f in store.list()] == ["spool/w1/x.jsonl"]
    assert store.delete_prefix("spool/w1") == 1 and not (real / "spool" / "w1").exists()


# --- item 3: links in a source folder ------------------------------------------------------------


def documents_source(tmp_path: Path, **options: Any) -> Any:
    from materializer.config import BindingConfig
    from materializer.sources.documents.source import DocumentsSource

    (tmp_path / "src").mkdir(parents=True, exist_ok=True)
    binding = BindingConfig.model_validate({
        "name": "b", "source": {"format": "documents", "path": str(tmp_path / "src"), **options},
        "table": str(tmp_path / "t"), "key": ["id"],
    })
    return DocumentsSource(binding, LocalStore(str(tmp_path / "staging")))


def cdcv2_source(tmp_path: Path, **options: Any) -> Any:
    from materializer.config import BindingConfig
    from materializer.sources.cdcv2.source import CdcV2Source

    (tmp_path / "src").mkdir(parents=True, exist_ok=True)
    binding = BindingConfig.model_validate({
        "name": "b", "source": {"format": "cdcv2", "path": str(tmp_path / "src"), **options},
        "table": str(tmp_path / "t"), "key": ["id"],
    })
    return CdcV2Source(binding, LocalStore(str(tmp_path / "staging")))


def outside(tmp_path: Path) -> dict[str, Path]:
    """Targets outside the source folder: a data file, a secrets file, a folder of data."""
    return {
        "data": write(tmp_path / "elsewhere" / "rows.jsonl", '{"id": 99}\n'),
        "secret": write(tmp_path / "secrets" / "token", "s3cr3t\n"),
        "folder": write(tmp_path / "elsewhere" / "more" / "x.jsonl", '{"id": 98}\n').parent,
    }


def names(files: list[Any]) -> list[str]:
    return [f.path for f in files]


@pytest.mark.parametrize("kind", ["data", "secret", "folder", "dangling", "inside"])
def test_a_link_the_documents_source_would_read_stops_the_run_naming_it(tmp_path: Path, kind: str) -> None:
    src = documents_source(tmp_path)
    write(tmp_path / "src" / "a.jsonl", '{"id": 1}\n')
    targets = {**outside(tmp_path), "dangling": tmp_path / "gone.jsonl", "inside": tmp_path / "src" / "a.jsonl"}
    (tmp_path / "src" / "b.jsonl").symlink_to(targets[kind])
    with pytest.raises(SourceError) as refused:
        src.listing()
    message = str(refused.value)
    assert f"b.jsonl -> {targets[kind]}" in message and "follow_links: true" in message
    assert refused.value.file == f"{tmp_path / 'src'}/b.jsonl"


def test_links_the_documents_source_never_reads_by_name_are_passed_over(tmp_path: Path) -> None:
    src = documents_source(tmp_path)
    targets = outside(tmp_path)
    write(tmp_path / "src" / "a.jsonl", '{"id": 1}\n')
    (tmp_path / "src" / "_latest.jsonl").symlink_to(tmp_path / "src" / "a.jsonl")
    (tmp_path / "src" / ".hidden.jsonl").symlink_to(targets["secret"])
    (tmp_path / "src" / "notes.txt").symlink_to(targets["secret"])
    (tmp_path / "src" / "sub").symlink_to(targets["folder"], target_is_directory=True)
    (tmp_path / "src" / "real").mkdir()
    (tmp_path / "src" / "real" / "c.jsonl").symlink_to(targets["data"])  # a sub-folder's: never a document
    _store, files, legacy = src.listing()
    assert names(files) == ["a.jsonl"] and "sub/x.jsonl" not in names(legacy)


def test_follow_links_reads_links_to_files_by_their_name_and_still_stops_at_folders(tmp_path: Path) -> None:
    targets = outside(tmp_path)
    src = documents_source(tmp_path, follow_links=True)
    write(tmp_path / "src" / "a.jsonl", '{"id": 1}\n')
    (tmp_path / "src" / "b.jsonl").symlink_to(targets["data"])
    (tmp_path / "src" / "c.jsonl").symlink_to(tmp_path / "src" / "a.jsonl")
    _store, files, _legacy = src.listing()
    assert [(f.path, f.size) for f in files] == [("a.jsonl", 10), ("b.jsonl", 11), ("c.jsonl", 10)]
    for name, target in (("d.jsonl", targets["folder"]), ("e.jsonl", tmp_path / "gone")):
        (tmp_path / "src" / name).symlink_to(target)
        with pytest.raises(SourceError, match=f"{name} -> .*follow_links reads links to files only"):
            src.listing()
        (tmp_path / "src" / name).unlink()


def test_a_loop_of_folder_links_is_never_walked(tmp_path: Path) -> None:
    src = cdcv2_source(tmp_path, follow_links=True)
    write(tmp_path / "src" / "a.json", '{"progress": {"lower": [0], "upper": [1], "counts": []}}\n')
    (tmp_path / "src" / "_loop").symlink_to(tmp_path / "src", target_is_directory=True)  # named to be skipped
    assert [name for name, _ in src._listing()] == ["a.json"]
    (tmp_path / "src" / "loop").symlink_to(tmp_path / "src", target_is_directory=True)
    with pytest.raises(SourceError, match="loop -> .*a folder"):
        src._listing()


@pytest.mark.parametrize("where", ["top", "sub-folder", "linked sub-folder"])
def test_a_link_in_a_cdcv2_folder_stops_the_run_unless_followed(tmp_path: Path, where: str) -> None:
    targets = outside(tmp_path)
    write(tmp_path / "src" / "a.json", '{"progress": {"lower": [0], "upper": [1], "counts": []}}\n')
    link = {"top": tmp_path / "src" / "b.json", "sub-folder": tmp_path / "src" / "sub" / "b.json",
            "linked sub-folder": tmp_path / "src" / "sub"}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(targets["folder"] if where == "linked sub-folder" else targets["secret"])
    with pytest.raises(SourceError, match="symbolic link"):
        cdcv2_source(tmp_path)._listing()
    followed = cdcv2_source(tmp_path, follow_links=True)
    if where == "linked sub-folder":
        with pytest.raises(SourceError, match="never walked into"):
            followed._listing()
    else:
        assert os.path.relpath(link, tmp_path / "src") in [name for name, _ in followed._listing()]


def test_follow_links_is_for_folders_of_files_only() -> None:
    from materializer.config import BindingConfig

    with pytest.raises(ValueError, match="follow_links is for the documents and cdcv2 formats"):
        BindingConfig.model_validate({
            "name": "b", "table": "t", "key": ["id"],
            "source": {"format": "kafka", "bootstrap_servers": "h:9092", "topic": "t", "follow_links": True},
        })


def test_a_linked_sub_folder_is_no_templates_binding_unless_followed(tmp_path: Path) -> None:
    from materializer.templates import sub_folders

    targets = outside(tmp_path)
    (tmp_path / "root" / "orders").mkdir(parents=True)
    (tmp_path / "root" / "stolen").symlink_to(targets["folder"], target_is_directory=True)
    with pytest.raises(SourceError, match="stolen -> "):
        sub_folders(str(tmp_path / "root"), "templates[0].source.folders_in")
    assert sub_folders(str(tmp_path / "root"), "t", follow_links=True) == ["orders", "stolen"]


# --- end to end: a documents folder with a link -----------------------------------------------------


def pipeline(tmp_path: Path, **source: Any) -> Any:
    from materializer.config import load_config
    from tests.helpers import binding, write_config

    spec = binding("b", tmp_path / "src", tmp_path / "t", on_invalid="dead_letter")
    spec["source"].update(source)
    return load_config(write_config(tmp_path, [spec]))


@pytest.mark.spark
def test_a_linked_secret_never_reaches_the_table_nor_the_dead_letters(spark: Any, tmp_path: Path) -> None:
    from materializer.runtime import Runtime

    targets = outside(tmp_path)
    write(tmp_path / "src" / "a.jsonl", '{"id": 1}\n')
    (tmp_path / "src" / "b.jsonl").symlink_to(targets["secret"])
    with pytest.raises(SourceError, match="b.jsonl -> .*token"):
        Runtime(pipeline(tmp_path), spark).run()
    assert not (tmp_path / "t").exists()  # nothing read, nothing landed, no dead letter
    # follow_links: a link to a data file outside the folder lands its rows, by the link's name.
    (tmp_path / "src" / "b.jsonl").unlink()
    (tmp_path / "src" / "b.jsonl").symlink_to(targets["data"])
    Runtime(pipeline(tmp_path, follow_links=True), spark).run()
    rows = {r["id"] for r in spark.read.format("delta").load(str(tmp_path / "t")).collect()}
    assert rows == {1, 99}
    assert targets["data"].read_text() == '{"id": 99}\n' and targets["data"].exists()
