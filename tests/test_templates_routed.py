"""One topic, many tables (issue 32 item 3): a ``route_by`` template on a real broker.

One topic of two partitions carries Debezium change events of three source tables (with and
without the schema envelope, tombstones after deletes, one id in several tables). Epoch 1 sees two
tables; epochs 2 and 3 are produced while the run goes on, and epoch 3's records name a third table
first: it becomes a binding in that very epoch. Epoch 4's apply is cut (in process) after one of
its three tables is applied; the restart applies the two others only. Every table is read back
with delta-rs and Spark and equals the events' last state per key, each table recording each
epoch it was a binding of once. A record without the route fields, and a value that makes
no table name, stop the run naming the record, before anything is committed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from materializer.config import load_config, routed_found
from materializer.delta import read_txn_without_spark
from materializer.errors import SourceError
from materializer.recovery_log import RecoveryLog
from materializer.runtime import TemplatedRuntime
from materializer.storage import open_store
from materializer.tables import TableRef
from tests.helpers import InProcessCrash, delta_rs_rows, table_rows, write_config
from tests.kafka_broker import Broker

PIPELINE = "routed"
TOPIC = "shop.routed"


def _event(table: str, op: str, row: dict[str, Any], *, envelope: bool = False, schema: str = "public") -> bytes:
    body = {
        "before": row if op == "d" else None, "after": None if op == "d" else row, "op": op, "ts_ms": 0,
        "source": {"db": "shop", "schema": schema, "table": table, "lsn": 1},
    }
    return json.dumps({"schema": {"type": "struct"}, "payload": body} if envelope else body).encode()


class Topic:
    """Produces events and keeps the expected tables: per table, id -> row (deletes remove)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.expected: dict[str, dict[int, dict[str, Any]]] = {}

    def send(self, events: list[tuple[str, str, dict[str, Any], int]], *, envelope_every: int = 3) -> None:
        messages: list[tuple[Any, Any, int | None]] = []
        for i, (table, op, row, partition) in enumerate(events):
            key = json.dumps({"id": row["id"]}).encode()
            messages.append((key, _event(table, op, row, envelope=i % envelope_every == 0), partition))
            rows = self.expected.setdefault(table, {})
            if op == "d":
                rows.pop(row["id"], None)
                messages.append((key, None, partition))  # the tombstone Debezium writes after a delete
            else:
                rows[row["id"]] = row
        self.broker.produce(TOPIC, messages)


def _config(tmp_path: Path, broker: Broker, topic: str = TOPIC, name: str = "{schema}_{table}", **source: Any) -> Any:
    return load_config(write_config(
        tmp_path, [], pipeline_id=PIPELINE,
        templates=[{
            "name": name,
            "source": {
                "format": "kafka", "bootstrap_servers": broker.bootstrap, "topic": topic, "payload": "debezium",
                "route_by": {"schema": "source.schema", "table": "source.table"}, **source,
            },
            "table": str(tmp_path / "tables" / "{schema}" / "{table}"),
            "key": ["id"],
        }],
    ))


def _recorded(table: Path) -> int:
    state = read_txn_without_spark(TableRef(str(table)), PIPELINE)
    return 0 if state is None else state.txn_version or 0


def _epochs(table: Path) -> list[int]:
    from deltalake import DeltaTable

    return sorted(
        json.loads(c["userMetadata"])["materializer"]["epoch"] for c in DeltaTable(str(table)).history() if c.get("userMetadata")
    )


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_one_topic_of_three_tables_routed_over_epochs_and_a_kill_mid_apply(
    spark: Any, broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.create_topic(TOPIC, 2)
    topic = Topic(broker)
    tables = tmp_path / "tables" / "public"
    config = _config(tmp_path, broker)
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)

    # Epoch 1: customers and orders, on both partitions; id 1 in both tables.
    topic.send([
        ("customers", "r", {"id": 1, "name": "ann"}, 0), ("customers", "r", {"id": 2, "name": "bob"}, 1),
        ("orders", "c", {"id": 1, "amount": 10}, 1), ("orders", "c", {"id": 7, "amount": 70}, 0),
        ("customers", "u", {"id": 1, "name": "ann2"}, 0),
    ])
    assert TemplatedRuntime(config, spark).run().last_epoch == 1
    assert set(log.read().last_commit.driver_checkpoint.templated) == {"public_customers", "public_orders"}

    # Epochs 2 and 3 are produced while the run goes on (at its epoch boundaries); epoch 3 names
    # items first, so the run ends its round of two bindings and opens one of three, in that epoch.
    waves = [
        [
            ("customers", "u", {"id": 2, "name": "bob2"}, 1), ("orders", "u", {"id": 1, "amount": 11}, 1),
            ("orders", "d", {"id": 7, "amount": 70}, 0), ("customers", "c", {"id": 3, "name": "cy"}, 0),
        ],
        [
            ("items", "c", {"id": 1, "sku": "a"}, 0), ("orders", "u", {"id": 1, "amount": 12}, 1),
            ("items", "c", {"id": 2, "sku": "b"}, 1), ("items", "u", {"id": 1, "sku": "a2"}, 0),
        ],
    ]
    calls: list[int] = []

    def between() -> bool:
        calls.append(len(calls))
        if waves:
            topic.send(waves.pop(0))
        return False

    summary = TemplatedRuntime(config, spark).run(should_stop=between)
    assert [e.epoch for e in summary.epochs] == [2, 3]
    assert summary.epochs[1].documents.get("public_items") == 3
    assert "public_items" not in summary.epochs[0].documents
    covered = log.read().last_commit.driver_checkpoint.templated
    assert covered == {
        f"public_{t}": "route:" + routed_found(TOPIC, {"schema": "public", "table": t}) for t in ("customers", "items", "orders")
    }

    # Epoch 4 on every table; its apply is cut once the first table records it.
    topic.send([
        ("customers", "d", {"id": 1, "name": "ann2"}, 0), ("orders", "c", {"id": 2, "amount": 20}, 0),
        ("items", "u", {"id": 2, "sku": "b2"}, 1), ("customers", "u", {"id": 3, "name": "cy2"}, 0),
        ("orders", "u", {"id": 2, "amount": 21}, 0),
    ])
    killed = InProcessCrash(monkeypatch, "after-apply:4")
    frozen = killed.run(lambda: TemplatedRuntime(config, spark).run(), timeout=400)
    try:
        assert log.read().last_epoch == 4
        applied = [t for t in ("customers", "items", "orders") if _recorded(tables / t) >= 4]
        assert len(applied) == 1, f"killed with {applied} applied"
        killed.disarm()
        summary = TemplatedRuntime(config, spark).run()
        assert summary.reapplied is not None and summary.epochs == []
        statuses = {r.binding: r.status for r in summary.reapplied.results}
        assert statuses == {f"public_{t}": ("skipped" if t in applied else "applied") for t in ("customers", "items", "orders")}
    finally:
        killed.thaw()
        frozen.join(timeout=120)

    for name, rows in topic.expected.items():
        want = {(k,): row for k, row in rows.items()}
        assert delta_rs_rows(tables / name, ["id"]) == want, name
        assert table_rows(spark, tables / name, ["id"]) == want, name
    assert topic.expected["customers"] == {2: {"id": 2, "name": "bob2"}, 3: {"id": 3, "name": "cy2"}}
    # Each table records every epoch that had records for it, once: customers has none in epoch 3,
    # which makes no commit on its table (an epoch commits only to the tables it has rows for);
    # items is a binding from epoch 3 on, the epoch that first carries it.
    assert _epochs(tables / "customers") == [1, 2, 4]
    assert _epochs(tables / "orders") == [1, 2, 3, 4]
    assert _epochs(tables / "items") == [3, 4]


@pytest.mark.kafka
@pytest.mark.spark
def test_a_record_that_names_no_table_or_an_unmakeable_one_stops_the_run(spark: Any, broker: Broker, tmp_path: Path) -> None:
    broker.create_topic("shop.unroutable", 1)
    no_table = json.dumps({"before": None, "after": {"id": 2}, "op": "c", "source": {"schema": "public"}}).encode()
    broker.produce("shop.unroutable", [(b"1", _event("customers", "c", {"id": 1}), 0), (b"2", no_table, 0)])
    (tmp_path / "a").mkdir()
    config = _config(tmp_path / "a", broker, "shop.unroutable")
    with pytest.raises(SourceError) as caught:
        TemplatedRuntime(config, spark).run()
    assert "record shop.unroutable/0 offset 1 has no source.table" in str(caught.value)
    assert RecoveryLog(open_store(config.recovery_log), PIPELINE).read().last_epoch == 0

    broker.create_topic("shop.badname", 1)
    broker.produce("shop.badname", [(b"1", _event("order-lines", "c", {"id": 1}), 0)])
    (tmp_path / "b").mkdir()
    config = _config(tmp_path / "b", broker, "shop.badname")
    with pytest.raises(SourceError) as caught:
        TemplatedRuntime(config, spark).run()
    assert "record shop.badname/0 offset 0 is the first of the epoch to name this table" in str(caught.value)
    assert "'public_order-lines'" in str(caught.value)
    assert not (tmp_path / "b" / "tables").exists()


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_ranges_of_tombstones_only_are_passed_over_before_and_after_the_first_table(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """A range whose records name no table (tombstones only, ``max_records`` of them or more) is
    read by no binding: without passing it over, no checkpoint would ever pass it, and the topic
    would stall there, before the first table as after it."""
    topic_name = "shop.tombstones"
    broker.create_topic(topic_name, 1)
    tombstones = [(json.dumps({"id": i}).encode(), None, 0) for i in range(5)]
    broker.produce(topic_name, [*tombstones, (b"1", _event("customers", "c", {"id": 1, "name": "ann"}), 0)])
    config = _config(tmp_path, broker, topic_name, max_records=2)
    tables = tmp_path / "tables" / "public"
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)

    summary = TemplatedRuntime(config, spark).run()
    assert [e.epoch for e in summary.epochs] == [1], "the tombstones before the first table stalled the topic"
    assert delta_rs_rows(tables / "customers", ["id"]) == {(1,): {"id": 1, "name": "ann"}}
    assert log.read().last_commit.runtime_checkpoint["public_customers"]["offsets"] == {topic_name: {"0": 6}}

    # After the first table: five more tombstones, then a change of a second table.
    broker.produce(topic_name, [*tombstones, (b"2", _event("orders", "c", {"id": 2, "amount": 20}), 0)])
    summary = TemplatedRuntime(config, spark).run()
    assert [e.epoch for e in summary.epochs] == [2], "the tombstones after the first table stalled the topic"
    assert delta_rs_rows(tables / "orders", ["id"]) == {(2,): {"id": 2, "amount": 20}}
    assert table_rows(spark, tables / "orders", ["id"]) == {(2,): {"id": 2, "amount": 20}}
    assert delta_rs_rows(tables / "customers", ["id"]) == {(1,): {"id": 1, "name": "ann"}}
    assert log.read().last_commit.runtime_checkpoint["public_orders"]["offsets"] == {topic_name: {"0": 12}}
    # Nothing left but tombstones: a run reads nothing and commits nothing.
    broker.produce(topic_name, tombstones)
    assert TemplatedRuntime(config, spark).run().epochs == []
    assert log.read().last_epoch == 2


def test_route_by_makes_a_binding_per_value_and_keeps_every_recorded_one() -> None:
    """Unit tier: the bindings made, recorded tables that an epoch does not carry stay covered
    (never missing), and the configurations route_by refuses."""
    from pydantic import ValidationError

    from materializer import templates
    from materializer.config import PipelineConfig

    def pipeline(**source: Any) -> PipelineConfig:
        return PipelineConfig.model_validate({
            "pipeline_id": "p", "recovery_log": "/tmp/r/log", "staging": "/tmp/r/staging",
            "templates": [{
                "name": "{table}", "table": "/tmp/r/tables/{table}", "key": ["id"],
                "source": {"format": "kafka", "bootstrap_servers": "h:9092", "payload": "debezium", **source},
            }],
        })

    config = pipeline(topic="t", route_by={"table": "source.table"})
    orders, items = (routed_found("t", {"table": name}) for name in ("orders", "items"))
    expansion = templates.expand(config, {0: [orders]}, {"items": f"route:{items}"}, epoch=3)
    assert expansion.missing == {}
    assert {b.name: (b.source.topic, b.source.routed) for b in expansion.config.bindings} == {
        "items": ("t", {"source.table": "items"}), "orders": ("t", {"source.table": "orders"}),
    }
    assert expansion.covered == {"items": f"route:{items}", "orders": f"route:{orders}"}
    assert templates.discover(config) == {}  # its tables are found by reading the records, not listed
    # A drill's oracle does not route records: such a table is "not verified", never a false FAIL.
    from materializer.tools import oracle

    assert all(
        not e.verified and "route_by" in e.reason for e in oracle.expected_all(expansion.config).values()
    ), oracle.expected_all(expansion.config)
    for source, words in [
        ({"topics": ["t"], "route_by": {"table": "source.table"}}, "route_by is for a kafka template of topics"),
        ({"topic": "t", "topic_pattern": "t.*", "route_by": {"table": "source.table"}}, "give topic (one topic) or topic_pattern"),
        ({"topic": "t", "route_by": {"table": "source..table"}}, "is not a dotted path"),
        ({"topic": "t", "route_by": {"topic": "source.table"}}, "is not a placeholder name"),
        ({"topic": "t", "route_by": {"other": "source.table"}}, "placeholder(s) {table}"),
    ]:
        with pytest.raises(ValidationError, match=re.escape(words)):
            pipeline(**source)


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_records_that_name_no_table_are_dead_letters_with_one_dead_letter_table(
    spark: Any, broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_invalid: dead_letter`` and a dead-letter table without placeholders: a record that names
    no table no longer stops every table; it lands once in that table (binding ``<topic>__unrouted``),
    beside the routed tables' own rejects, also from a range of nothing else, and also when the
    apply is cut between the tables and the dead letters."""
    from tests.helpers import delta_rs_list

    topic_name = "shop.unrouted"
    broker.create_topic(topic_name, 1)
    no_table = json.dumps({"before": None, "after": {"id": 9}, "op": "c", "source": {"schema": "public"}}).encode()
    dead = tmp_path / "tables" / "rejects"
    config = _config(tmp_path, broker, topic_name, max_records=4)
    data = config.templates[0].model_dump(by_alias=True, exclude_unset=True)
    config = load_config(write_config(
        tmp_path, [], pipeline_id=PIPELINE, templates=[{**data, "on_invalid": "dead_letter", "dead_letter_table": str(dead)}],
    ))
    tables = tmp_path / "tables" / "public"
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)

    # Epoch 1 (offsets 0-3): a change, a record of no table, a tombstone (no change of any table:
    # passed over, not a dead letter), a change that is no JSON. Epoch 2 (4-7): a change of orders
    # whose op is not a change, and three records of no table.
    broker.produce(topic_name, [
        (b"1", _event("customers", "c", {"id": 1, "name": "ann"}), 0), (b"9", no_table, 0), (b"1", None, 0), (b"x", b"{nope", 0),
        (b"2", json.dumps({"op": "t", "source": {"schema": "public", "table": "orders"}}).encode(), 0),
        (b"9", no_table, 0), (b"9", no_table, 0), (b"9", b"[]", 0),
    ])
    killed = InProcessCrash(monkeypatch, "after-apply:2")
    frozen = killed.run(lambda: TemplatedRuntime(config, spark).run(), timeout=400)
    try:
        assert log.read().last_epoch == 2
        killed.disarm()
        summary = TemplatedRuntime(config, spark).run()
        assert summary.reapplied is not None and summary.epochs == []
    finally:
        killed.thaw()
        frozen.join(timeout=120)

    # Epoch 3: records of no table only (a range no table's binding reads). The range is read
    # from the brokers once, by the router's scan; the bindings take their records from there.
    from materializer.sources.kafka.transport import KafkaTransport

    reads: list[Any] = []
    records = KafkaTransport.records

    def counted(self: Any, spark: Any, plan: Any, raw_columns: bool = False) -> Any:
        reads.append(plan)
        return records(self, spark, plan, raw_columns)

    monkeypatch.setattr(KafkaTransport, "records", counted)
    broker.produce(topic_name, [(b"9", no_table, 0), (b"9", no_table, 0)])
    summary = TemplatedRuntime(config, spark).run()
    assert [e.epoch for e in summary.epochs] == [3]
    assert len(reads) == 1, "each routed binding read the range again"

    assert delta_rs_rows(tables / "customers", ["id"]) == table_rows(spark, tables / "customers", ["id"]) == {(1,): {"id": 1, "name": "ann"}}
    assert not (tables / "orders").exists()  # its only record is a dead letter
    rows = sorted((r["epoch"], r["offset"], r["binding"], r["reason"]) for r in delta_rs_list(dead))
    assert [(e, o, b) for e, o, b, _ in rows] == [
        (1, 1, "shop_unrouted__unrouted"), (1, 3, "shop_unrouted__unrouted"),
        (2, 4, "public_orders"), (2, 5, "shop_unrouted__unrouted"), (2, 6, "shop_unrouted__unrouted"), (2, 7, "shop_unrouted__unrouted"),
        (3, 8, "shop_unrouted__unrouted"), (3, 9, "shop_unrouted__unrouted"),
    ]
    assert all("names no table" in r for e, o, b, r in rows if b.endswith("__unrouted")) and "op 't'" in rows[2][3]
    assert sorted(r["epoch"] for r in spark.read.format("delta").load(str(dead)).collect()) == [e for e, *_ in rows]
    assert not Path(str(dead) + "__unrouted").exists()  # the binding of records that name no table writes no row
    assert log.read().last_commit.runtime_checkpoint["shop_unrouted__unrouted"]["offsets"] == {topic_name: {"0": 10}}


def test_the_binding_for_records_that_name_no_table_is_made_only_with_one_dead_letter_table() -> None:
    """Unit tier: with ``on_invalid: dead_letter`` and a dead-letter table without placeholders a
    route_by template makes one more binding, for its topic's records that name no table; with a
    dead-letter table per table (placeholders), none (such a record stops the run)."""
    from materializer import templates
    from materializer.config import PipelineConfig

    def pipeline(dead_letter_table: str) -> PipelineConfig:
        return PipelineConfig.model_validate({
            "pipeline_id": "p", "recovery_log": "/tmp/r/log", "staging": "/tmp/r/staging",
            "templates": [{
                "name": "{table}", "table": "/tmp/r/tables/{table}", "key": ["id"], "on_invalid": "dead_letter",
                "dead_letter_table": dead_letter_table,
                "source": {"format": "kafka", "bootstrap_servers": "h:9092", "payload": "debezium", "topic": "cdc.all",
                           "route_by": {"table": "source.table"}},
            }],
        })

    unrouted = templates.unrouted_found("cdc.all")
    config = pipeline("/tmp/r/rejects")
    expansion = templates.expand(config, {0: [unrouted, routed_found("cdc.all", {"table": "orders"})]})
    made = {b.name: b for b in expansion.config.bindings}
    assert set(made) == {"cdc_all__unrouted", "orders"}
    carrier = made["cdc_all__unrouted"]
    assert (carrier.source.unrouted, carrier.source.routed, carrier.dead_letters) == (["source.table"], None, "/tmp/r/rejects")
    assert made["orders"].dead_letters == "/tmp/r/rejects"
    assert templates.takes(config.templates[0], unrouted)
    # Recorded, it is made again for a replay (its records' position is the topic's too).
    assert templates.expand(config, {}, {"cdc_all__unrouted": f"route:{unrouted}"}).missing == {}

    per_table = pipeline("/tmp/r/rejects/{table}")
    assert templates.make(per_table, 0, unrouted) is None and not templates.takes(per_table.templates[0], unrouted)


def test_route_by_over_a_topic_pattern_makes_a_binding_per_topic_and_value() -> None:
    """Unit tier: ``route_by`` with ``topic_pattern`` (a Debezium topic per database, each carrying
    its tables): the pattern's groups and the route values fill the placeholders, each topic's
    records its own tables, a recorded table of a topic no longer matched is missing (one of a
    topic still there is not), each topic has its own binding for records that name no table,
    and a placeholder filled from both sides is refused."""
    from pydantic import ValidationError

    from materializer import templates
    from materializer.config import PipelineConfig

    def pipeline(**extra: Any) -> PipelineConfig:
        template = {
            "name": "{db}_{table}", "table": "/tmp/r/tables/{db}/{table}", "key": ["id"],
            "source": {"format": "kafka", "bootstrap_servers": "h:9092", "payload": "debezium",
                       "topic_pattern": r"cdc\.(?P<db>\w+)", "route_by": {"table": "source.table"}},
        }
        return PipelineConfig.model_validate({
            "pipeline_id": "p", "recovery_log": "/tmp/r/log", "staging": "/tmp/r/staging", "templates": [{**template, **extra}],
        })

    config = pipeline()
    template = config.templates[0]
    assert template.source.placeholders == {"topic", "db", "table"}
    shop_orders, shop_items, crm_people = (
        routed_found(t, {"table": n}) for t, n in (("cdc.shop", "orders"), ("cdc.shop", "items"), ("cdc.crm", "people"))
    )
    assert templates.values_for(template, shop_orders) == {"topic": "cdc.shop", "db": "shop", "table": "orders"}
    assert templates.values_for(template, routed_found("other.shop", {"table": "orders"})) is None
    assert templates.values_for(template, routed_found("__cdc.shop", {"table": "orders"})) is None
    expansion = templates.expand(
        config, {0: [shop_orders, crm_people]}, {"shop_items": f"route:{shop_items}"}, epoch=2,
        routed_topics={0: ["cdc.crm", "cdc.shop"]},
    )
    assert expansion.missing == {}
    assert {b.name: (b.source.topic, b.source.routed, b.table) for b in expansion.config.bindings} == {
        "shop_orders": ("cdc.shop", {"source.table": "orders"}, "/tmp/r/tables/shop/orders"),
        "shop_items": ("cdc.shop", {"source.table": "items"}, "/tmp/r/tables/shop/items"),
        "crm_people": ("cdc.crm", {"source.table": "people"}, "/tmp/r/tables/crm/people"),
    }
    # cdc.shop is gone: its recorded tables are made (their epoch must be applied) and missing.
    gone = templates.expand(
        config, {0: [crm_people]}, {"shop_items": f"route:{shop_items}", "crm_people": f"route:{crm_people}"},
        epoch=2, routed_topics={0: ["cdc.crm"]},
    )
    assert set(gone.missing) == {"shop_items"}
    assert "topic 'cdc.shop' is gone from the brokers" in str(templates.missing_error(gone, 2, config))

    dead = pipeline(on_invalid="dead_letter", dead_letter_table="/tmp/r/rejects")
    carriers = templates.expand(dead, {0: [templates.unrouted_found("cdc.shop"), templates.unrouted_found("cdc.crm")]})
    made = {b.name: b for b in carriers.config.bindings}
    assert {n: (b.source.topic, b.table, b.dead_letters) for n, b in made.items()} == {
        "cdc_shop__unrouted": ("cdc.shop", "/tmp/r/rejects__unrouted_cdc_shop", "/tmp/r/rejects"),
        "cdc_crm__unrouted": ("cdc.crm", "/tmp/r/rejects__unrouted_cdc_crm", "/tmp/r/rejects"),
    }
    assert not templates.takes(dead.templates[0], templates.unrouted_found("other"))

    with pytest.raises(ValidationError, match=re.escape("route_by and topic_pattern both fill {table}")):
        pipeline(source={"format": "kafka", "bootstrap_servers": "h:9092", "payload": "debezium",
                         "topic_pattern": r"cdc\.(?P<table>\w+)", "route_by": {"table": "source.table"}})


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.spark
def test_route_by_over_a_topic_pattern_a_topic_per_database(spark: Any, broker: Broker, tmp_path: Path) -> None:
    """A Debezium topic per database (``fleet.<db>``), each carrying several tables: one template
    with ``topic_pattern`` and ``route_by``. Each topic keeps a position of its own; a topic created
    later is read from its start at the next epoch boundary, its tables bindings from then on; a
    topic deleted stops the run naming it once its epochs are applied, and ``on_missing: drop``
    goes on without it. Every table read back with delta-rs and Spark."""
    def send(topic: str, events: list[tuple[str, str, dict[str, Any]]]) -> None:
        messages: list[tuple[Any, Any, int | None]] = []
        for i, (table, op, row) in enumerate(events):
            key = json.dumps({"id": row["id"]}).encode()
            messages.append((key, _event(table, op, row, envelope=i % 2 == 0, schema=topic.split(".")[1]), 0))
            rows = expected.setdefault(f"{topic.split('.')[1]}/{table}", {})
            if op == "d":
                rows.pop(row["id"], None)
                messages.append((key, None, 0))
            else:
                rows[row["id"]] = row
        broker.produce(topic, messages)

    expected: dict[str, dict[int, dict[str, Any]]] = {}
    for name in ("fleet.shop", "fleet.crm"):
        broker.create_topic(name, 1)
    send("fleet.shop", [("orders", "c", {"id": 1, "amount": 10}), ("items", "c", {"id": 1, "sku": "a"}),
                        ("orders", "u", {"id": 1, "amount": 11})])
    send("fleet.crm", [("people", "c", {"id": 1, "name": "ann"}), ("people", "c", {"id": 2, "name": "bob"})])
    data = {
        "name": "{db}_{table}", "table": str(tmp_path / "tables" / "{db}" / "{table}"), "key": ["id"],
        "source": {"format": "kafka", "bootstrap_servers": broker.bootstrap, "payload": "debezium",
                   "topic_pattern": r"fleet\.(?P<db>\w+)", "route_by": {"table": "source.table"}},
    }
    config = load_config(write_config(tmp_path, [], pipeline_id=PIPELINE, templates=[data]))
    log = RecoveryLog(open_store(config.recovery_log), PIPELINE)

    assert TemplatedRuntime(config, spark).run().last_epoch == 1
    entry = log.read().last_commit
    assert set(entry.driver_checkpoint.templated) == {"shop_orders", "shop_items", "crm_people"}
    offsets = {n: c["offsets"] for n, c in entry.runtime_checkpoint.items() if c}
    assert offsets == {"shop_orders": {"fleet.shop": {"0": 3}}, "shop_items": {"fleet.shop": {"0": 3}},
                       "crm_people": {"fleet.crm": {"0": 2}}}

    # A new database's topic, and more changes on an old one: the next run reads both.
    broker.create_topic("fleet.erp", 1)
    send("fleet.erp", [("invoices", "c", {"id": 5, "total": 50})])
    send("fleet.crm", [("people", "d", {"id": 1, "name": "ann"}), ("notes", "c", {"id": 1, "text": "hi"})])
    summary = TemplatedRuntime(config, spark).run()
    assert summary.epochs and set(log.read().last_commit.driver_checkpoint.templated) == {
        "shop_orders", "shop_items", "crm_people", "crm_notes", "erp_invoices",
    }
    for name, rows in expected.items():
        want = {(k,): row for k, row in rows.items()}
        assert delta_rs_rows(tmp_path / "tables" / name, ["id"]) == want, name
        assert table_rows(spark, tmp_path / "tables" / name, ["id"]) == want, name

    # The shop database's topic is deleted: the run stops naming it, nothing more read.
    broker.delete_topic("fleet.shop")
    last = log.read().last_epoch
    with pytest.raises(SourceError, match=r"topic 'fleet\.shop' is gone from the brokers"):
        TemplatedRuntime(config, spark).run()
    assert log.read().last_epoch == last
    dropping = load_config(write_config(tmp_path, [], pipeline_id=PIPELINE, templates=[{**data, "on_missing": "drop"}]))
    send("fleet.erp", [("invoices", "u", {"id": 5, "total": 55})])
    TemplatedRuntime(dropping, spark).run()
    assert set(log.read().last_commit.driver_checkpoint.templated) == {"crm_people", "crm_notes", "erp_invoices"}
    assert delta_rs_rows(tmp_path / "tables" / "erp" / "invoices", ["id"]) == {(5,): {"id": 5, "total": 55}}
