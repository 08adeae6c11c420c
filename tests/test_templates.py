"""Binding templates (issue 32 item 3): one binding per topic a pattern matches or per sub-folder.

First the expansion alone (no JVM, no broker): names and tables from ``{topic}``, named groups and
``{folder}``, the set a committed epoch covered made again whatever is found, two topics on one
name or table, names and tables that cannot be. Then in process on Spark, documents sub-folders: a
folder added between epochs is a new binding read from its start, a removed one stops the run
after its epoch is applied (or is dropped, ``on_missing: drop``); the set each epoch covers is in
its driver checkpoint; tables equal the oracle, read by Spark and delta-rs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from materializer.config import parse_config
from materializer.errors import ConfigError, SourceError
from materializer.templates import discover, expand, sub_folders

DEBEZIUM = r"shop\.(?P<schema>\w+)\.(?P<table>\w+)"


def _config(*templates: dict[str, Any], bindings: list[dict[str, Any]] | None = None) -> Any:
    return parse_config(
        {"pipeline_id": "fleet", "recovery_log": "/tmp/l", "staging": "/tmp/s", "bindings": bindings or [], "templates": list(templates)},
        "test",
    )


def _kafka(pattern: str = DEBEZIUM, **extra: Any) -> dict[str, Any]:
    source = {"format": "kafka", "bootstrap_servers": "b:9092", "topic_pattern": pattern, **extra.pop("source", {})}
    return {"source": source, "name": "{schema}_{table}", "table": "/d/{schema}/{table}", "key": ["id"], **extra}


def _folders(root: str = "/land", **extra: Any) -> dict[str, Any]:
    return {"source": {"format": "documents", "folders_in": root}, "table": "/d/{folder}", "key": ["id"], **extra}


# --- expansion, no JVM ---


def test_named_groups_name_the_binding_and_table_and_other_topics_are_not_taken() -> None:
    config = _config(_kafka(source={"key_from": "message"}))
    found = ["shop.public.orders", "shop.sales.orders", "other.public.x", "shop.public", "__consumer_offsets"]
    made = expand(config, {0: [t for t in found]})
    assert [b.name for b in made.config.bindings] == ["public_orders", "sales_orders"]
    orders = made.config.binding("public_orders")
    assert (orders.table, orders.source.topic, orders.source.key_from) == ("/d/public/orders", "shop.public.orders", "message")
    assert made.covered == {"public_orders": "topic:shop.public.orders", "sales_orders": "topic:shop.sales.orders"}
    assert made.config.templates == [] and not made.missing


def test_topic_placeholder_and_kafka_internal_topics() -> None:
    config = _config(_kafka(r".*", name="{topic}", table="/d/{topic}"))
    made = expand(config, {0: ["orders", "__consumer_offsets", "items"]})
    assert [b.name for b in made.config.bindings] == ["items", "orders"]


def test_one_binding_per_folder_after_the_configured_bindings() -> None:
    explicit = {"name": "fixed", "source": {"format": "documents", "path": "/x"}, "table": "/d/fixed", "key": ["id"]}
    made = expand(_config(_folders(), bindings=[explicit]), {0: ["b", "a"]})
    assert [b.name for b in made.config.bindings] == ["fixed", "a", "b"]
    assert made.config.binding("a").source.path == "/land/a"
    assert made.covered == {"a": "folder:/land/a", "b": "folder:/land/b"}


def test_two_topics_on_one_table_are_a_config_error_naming_both() -> None:
    config = _config(_kafka(name="{schema}_{table}", table="/d/{table}"))
    with pytest.raises(ConfigError, match=r"shop\.public\.orders.*shop\.sales\.orders.*both make the table"):
        expand(config, {0: ["shop.public.orders", "shop.sales.orders"]})


def test_two_topics_on_one_name_are_a_config_error() -> None:
    config = _config(_kafka(name="{table}", table="/d/{schema}/{table}"))
    with pytest.raises(ConfigError, match="both make the binding name 'orders'"):
        expand(config, {0: ["shop.public.orders", "shop.sales.orders"]})


def test_a_made_table_two_spellings_of_a_configured_table_is_refused() -> None:
    explicit = {"name": "fixed", "source": {"format": "documents", "path": "/x"}, "table": "/d/./a/", "key": ["id"]}
    with pytest.raises(ConfigError, match="both make the table"):
        expand(_config(_folders(), bindings=[explicit]), {0: ["a"]})


def test_a_topic_that_makes_no_binding_name_is_refused_with_the_way_out() -> None:
    config = _config(_kafka(r"[a-z.-]+", name="{topic}", table="/d/{topic}"))
    with pytest.raises(ConfigError, match=r"topic 'shop\.orders' makes the binding name 'shop\.orders'.*named group"):
        expand(config, {0: ["shop.orders"]})


def test_a_catalog_table_that_is_not_a_name_is_refused() -> None:
    config = _config(_kafka(r"[a-z-]+", name="t_{topic}", table="main.bronze.{topic}"))
    with pytest.raises(ConfigError, match=r"makes the binding name 't_or-ders'"):
        expand(config, {0: ["or-ders"]})
    config = _config(_kafka(r"(?P<t>[a-z]+)-v\d", name="{t}", table="main.bronze.{topic}"))
    with pytest.raises(ConfigError, match=r"table 'main\.bronze\.orders-v2'.*not a catalog name"):
        expand(config, {0: ["orders-v2"]})
    ok = _config(_kafka(r"(?P<t>[a-z]+)-v\d", name="{t}", table="main.bronze.`{topic}`"))
    assert expand(ok, {0: ["orders-v2"]}).config.binding("orders").table == "main.bronze.`orders-v2`"


@pytest.mark.parametrize(
    "option, pattern, folder",
    [
        # a folder closing its backticked part and opening another: catalog bronze, schema x
        ("table", "bronze.`{folder}`", "x`.`y"),
        ("table", "main.bronze.`{folder}`", "x`.`y"),
        # an unquoted part: a dot adds a part, a colon makes a path of the name
        ("table", "bronze.{folder}", "x.y"),
        ("table", "{folder}", "x:y"),
        # the dead-letter table, filled from the folder too
        ("dead_letter_table", "rejects.`{folder}`", "x`.`y"),
        ("dead_letter_table", "rejects.{folder}", "x.y"),
        ("dead_letter_table", "main.rejects.`{folder}`", "a`; DROP TABLE t; --"),
        ("view", "live.`{folder}`", "x`.`y"),
    ],
)
def test_a_folder_cannot_move_a_catalog_table_to_another_schema(option: str, pattern: str, folder: str) -> None:
    """A folder's name is untrusted (issue #66 item 3): every catalog name a template fills from it
    passes the one check, and keeps the template's parts, before any SQL is written."""
    extra: dict[str, Any] = {"on_invalid": "dead_letter", option: pattern} if option == "dead_letter_table" else {option: pattern}
    template = _folders(name="b", **extra)  # one binding, named without the folder (the name has its own check)
    if option != "table":
        template["table"] = "/d/{folder}"
    config = _config(template)
    with pytest.raises(ConfigError, match=rf"templates\[0\]: folder '.*' makes the {option} .*Rename the topic or folder") as caught:
        expand(config, {0: [folder]})
    assert repr(folder) in str(caught.value)
    # the same template with a folder that is a name makes its binding
    made = expand(config, {0: ["orders"]}).config.bindings[0]
    assert "orders" in str(getattr(made, option))


@pytest.mark.parametrize("table", ["main.s.t; DROP TABLE x", "a.b.c.d", "s.`t`.`u``v`", "a`.`b", "s.t--"])
@pytest.mark.parametrize("option", ["table", "dead_letter_table"])
def test_a_configured_catalog_name_is_checked_like_a_made_one(table: str, option: str) -> None:
    from materializer.delta.names import sql_name
    from materializer.tables import TableRef

    binding: dict[str, Any] = {"name": "b", "source": {"format": "documents", "path": "/x"}, "table": "/d/t", "key": ["id"],
                               "on_invalid": "dead_letter", option: table}
    with pytest.raises(ConfigError, match=rf"{option}: .* is neither a path nor a catalog name"):
        _config(bindings=[binding])
    # and where SQL is written, for a name that came some other way
    with pytest.raises(ConfigError, match="is neither a path nor a catalog name"):
        sql_name(TableRef(table))


def test_a_quoted_catalog_table_gets_its_dead_letter_table_inside_the_quotes() -> None:
    binding = {"name": "b", "source": {"format": "documents", "path": "/x"}, "table": "main.s.`t-1`", "key": ["id"], "on_invalid": "dead_letter"}
    assert _config(bindings=[binding]).bindings[0].dead_letters == "main.s.`t-1_dead_letters`"


@pytest.mark.parametrize(
    "template, message",
    [
        # a placeholder the template does not fill
        (_kafka(name="{tabel}"), r"placeholder\(s\) \{tabel\}; this template fills \{schema\}, \{table\}, \{topic\}"),
        # one table for every topic
        (_kafka(table="/d/all"), "has no placeholder, so every binding would share one table"),
        # a kafka template's topics come from the pattern
        (_kafka() | {"source": {"format": "kafka", "bootstrap_servers": "b", "topic": "t"}}, "takes topic_pattern"),
        (_kafka(r"shop\.(", name="x{topic}", table="/d/{topic}"), "is not a regular expression"),
        (_kafka(source={"starting": {"t": {"0": 5}}}), "offsets per topic are not for a template"),
        (_folders() | {"source": {"format": "documents", "path": "/x"}}, "takes folders_in"),
        # every rule of a binding holds for the bindings it makes
        (_folders(key=["_id"]), "reserved"),
        (_folders(mode="delta_updates", sequence_by=["at"]), "for mode standard or scd2"),
        (_folders(previous_names=["old"]), "previous_names is for a binding"),
    ],
)
def test_a_template_is_checked_when_the_file_is_read(template: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(template)


def test_no_binding_and_no_template_is_an_error() -> None:
    with pytest.raises(ConfigError, match="at least one binding"):
        _config()


def test_what_the_last_epoch_covered_is_made_again_and_named_missing() -> None:
    config = _config(_folders())
    made = expand(config, {0: ["b", "c"]}, {"a": "folder:/land/a", "b": "folder:/land/b"}, epoch=7)
    assert [b.name for b in made.config.bindings] == ["a", "b", "c"]
    assert set(made.missing) == {"a"} and made.covered == {"b": "folder:/land/b", "c": "folder:/land/c"}
    dropped = expand(config, {0: ["b"]}, {"a": "folder:/land/a"}, dropped={"a"})
    assert [b.name for b in dropped.config.bindings] == ["b"] and not dropped.missing


def test_a_covered_binding_no_template_makes_any_more_stops_before_anything() -> None:
    config = _config(_folders(table="/d/x_{folder}"))
    with pytest.raises(ConfigError, match=r"epoch 3 covers binding 'a'.*no template makes it"):
        expand(config, {0: []}, {"a": "folder:/elsewhere/a"}, epoch=3)


def test_sub_folders_skip_hidden_ones_and_a_missing_root_is_named(tmp_path: Path) -> None:
    for name in ("b", "a", "_spark_metadata", ".hidden"):
        (tmp_path / name).mkdir()
    (tmp_path / "file.jsonl").write_text("{}\n")
    assert sub_folders(str(tmp_path), "here") == ["a", "b"]
    with pytest.raises(SourceError, match="does not exist"):
        sub_folders(str(tmp_path / "nope"), "templates[0].source.folders_in")
    assert discover(_config(_folders(str(tmp_path)))) == {0: ["a", "b"]}


# --- in process on Spark: documents sub-folders ---


def _folder_config(tmp_path: Path, **template: Any) -> Any:
    from tests.helpers import write_config

    path = write_config(tmp_path, [], pipeline_id="fleet-folders", templates=[{
        "source": {"format": "documents", "folders_in": str(tmp_path / "land"), "max_files": 1},
        "table": str(tmp_path / "tables" / "{folder}"),
        "key": ["id"],
        **template,
    }])
    from materializer.config import load_config

    return load_config(path)


def _file(tmp_path: Path, folder: str, n: int, docs: list[dict[str, Any]]) -> None:
    from tests.helpers import write_jsonl

    write_jsonl(tmp_path / "land" / folder / f"{n:04d}.jsonl", docs)


def _last_checkpoint(config: Any) -> Any:
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    return RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit.driver_checkpoint


def _assert_tables(spark: Any, config: Any, expected_bindings: set[str]) -> None:
    from materializer.runtime import as_recorded
    from tests.helpers import assert_tables_equal_oracle

    covered = as_recorded(config)
    assert {b.name for b in covered.bindings} == expected_bindings
    assert_tables_equal_oracle(spark, covered)  # Spark and delta-rs


def test_a_folder_added_between_epochs_is_a_binding_and_a_removed_one_stops_the_run(spark: Any, tmp_path: Path) -> None:
    from materializer import events
    from materializer.progress import ListCollector
    from materializer.runtime import TemplatedRuntime
    from tests.helpers import delta_rs_rows

    config = _folder_config(tmp_path)
    _file(tmp_path, "a", 1, [{"id": 1, "v": "a1"}, {"id": 2, "v": "a2"}])
    _file(tmp_path, "a", 2, [{"id": 1, "v": "a1'"}, {"id": 3, "_meta": {"op": "d"}}])
    _file(tmp_path, "b", 1, [{"id": 1, "v": "b1"}])

    class AddsFolderC(ListCollector):
        """Lands folder c while epoch 1 is being applied: the run takes it at the next boundary."""

        def emit(self, event: Any) -> None:
            super().emit(event)
            if isinstance(event, events.Committed) and event.epoch == 1:
                _file(tmp_path, "c", 1, [{"id": 7, "v": "c7"}])
                _file(tmp_path, "c", 2, [{"id": 8, "v": "c8"}])

    collector = AddsFolderC()
    summary = TemplatedRuntime(config, spark, collector).run()
    assert [sorted(e.documents) for e in summary.epochs] == [["a", "b"], ["a", "c"], ["c"]]
    assert _last_checkpoint(config).templated == {n: f"folder:{tmp_path}/land/{n}" for n in "abc"}
    # the progress record of each new epoch names every binding it read (a round's re-apply after
    # Open sends one too, of the bindings it found applied)
    named: dict[int, list[str]] = {}
    read: dict[int, list[str]] = {}
    for record in collector.named("progress"):
        named.setdefault(record["epoch"], sorted(b.binding for b in record["record"].bindings))
        read.setdefault(record["epoch"], sorted(b.binding for b in record["record"].bindings if b.documents))
    assert named == {1: ["a", "b"], 2: ["a", "b", "c"], 3: ["a", "b", "c"]}
    assert read == {1: ["a", "b"], 2: ["a", "c"], 3: ["c"]}
    _assert_tables(spark, config, {"a", "b", "c"})
    assert delta_rs_rows(tmp_path / "tables" / "c", ["id"]) == {(7,): {"id": 7, "v": "c7"}, (8,): {"id": 8, "v": "c8"}}
    from materializer.tools.status import pipeline_status

    status = pipeline_status(config)  # from the log: no folder is listed
    assert status.agrees and [t.binding for t in status.tables] == ["a", "b", "c"]

    # folder b removed (and a new file for a): the run stops naming b, and reads nothing
    shutil.rmtree(tmp_path / "land" / "b")
    _file(tmp_path, "a", 3, [{"id": 9, "v": "a9"}])
    with pytest.raises(SourceError, match=r"binding 'b' \(table .*tables/b\): folder .*/land/b' is gone.*up to 3.*on_missing: drop.*templates\[0\]"):
        TemplatedRuntime(config, spark).run()
    assert _last_checkpoint(config).epoch == 3
    assert delta_rs_rows(tmp_path / "tables" / "b", ["id"]) == {(1,): {"id": 1, "v": "b1"}}

    # the user says drop: b's table keeps its rows, the next epochs cover a and c only
    dropping = _folder_config(tmp_path, on_missing="drop")
    summary = TemplatedRuntime(dropping, spark).run()
    assert [sorted(e.documents) for e in summary.epochs] == [["a"]]
    assert set(_last_checkpoint(dropping).templated) == {"a", "c"}
    _assert_tables(spark, dropping, {"a", "c"})
    assert delta_rs_rows(tmp_path / "tables" / "b", ["id"]) == {(1,): {"id": 1, "v": "b1"}}


@pytest.mark.slow
def test_a_replay_covers_the_set_of_its_epoch_even_after_its_folder_is_gone(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    # Killed after epoch 1 is committed and before it is applied; folder b then disappears: the
    # restart still applies epoch 1 to b's table (the epoch covers b), then stops naming b.
    from materializer.runtime import TemplatedRuntime
    from tests.helpers import InProcessCrash, delta_rs_rows

    config = _folder_config(tmp_path)
    _file(tmp_path, "a", 1, [{"id": 1, "v": "a1"}])
    _file(tmp_path, "b", 1, [{"id": 2, "v": "b2"}])
    crash = InProcessCrash(monkeypatch, "after-log-commit:1")
    crash.run(lambda: TemplatedRuntime(config, spark).run())
    crash.disarm()
    assert not (tmp_path / "tables" / "b").exists()
    shutil.rmtree(tmp_path / "land" / "b")
    try:
        with pytest.raises(SourceError, match="binding 'b'"):
            TemplatedRuntime(config, spark).run()
        assert delta_rs_rows(tmp_path / "tables" / "b", ["id"]) == {(2,): {"id": 2, "v": "b2"}}
        assert delta_rs_rows(tmp_path / "tables" / "a", ["id"]) == {(1,): {"id": 1, "v": "a1"}}
    finally:
        crash.thaw()
