"""Reductions (issue #5): per-field strategies, loads in standard mode, exactly-once sums.

Pipelines are checked against materializer's own oracle (:mod:`materializer.tools.oracle`, the drill's);
one reduce step against a plain-Python fold (below); see the semantics in :mod:`materializer.reductions`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from materializer import crash, reductions
from materializer.config import BindingConfig, load_config, parse_config
from materializer.errors import ConfigError
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from tests.helpers import REPO, assert_tables_equal_oracle, binding, run_cli, write_config, write_jsonl

LWW = "lastWriteWins"
REDUCTIONS = {"n": "sum", "lo": "min", "hi": "max", "first": "firstWriteWins", "tags": "append", "profile": "merge"}


# --- the oracle ----------------------------------------------------------------------------------


def _merge(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k)) for k in {**a, **b}}
    return a if b is None else b


def _step(how: str, a: Any, b: Any) -> Any:
    if how == LWW:
        return b
    if b is None:
        return a
    if a is None:
        return b
    return {
        "firstWriteWins": lambda: a,
        "sum": lambda: a + b,
        "min": lambda: min(a, b),
        "max": lambda: max(a, b),
        "append": lambda: a + b,
        "merge": lambda: _merge(a, b),
    }[how]()


def fold(state: tuple[str, dict[str, Any]] | None, doc: dict[str, Any], key: list[str], rules: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """One document into a key's state (op, fields); a delete resets the key."""
    fields = {f: v for f, v in doc.items() if f not in key and f != "_meta"}
    if doc.get("_meta", {}).get("op") == "d":
        return "d", {f: v for f, v in fields.items() if rules.get(f, LWW) == LWW}
    current = state[1] if state is not None and state[0] == "u" else {}
    return "u", {f: _step(rules.get(f, LWW), current.get(f), fields.get(f)) for f in {**current, **fields}}


def normalize(value: Any) -> Any:
    """Drop NULLs inside objects: Spark's structs carry every sub-field, documents do not."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def standard_rows(docs: list[dict[str, Any]], key: list[str], rules: dict[str, str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Standard mode: every document folded in order; the rows that exist at the end."""
    state: dict[tuple[Any, ...], tuple[str, dict[str, Any]]] = {}
    for doc in docs:
        k = tuple(doc[f] for f in key)
        state[k] = fold(state.get(k), doc, key, rules)
    return {k: {**dict(zip(key, k)), **fields} for k, (op, fields) in state.items() if op == "u"}


def canonical(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


# --- configuration, no Spark ---------------------------------------------------------------------


def _binding(**extra: Any) -> BindingConfig:
    return BindingConfig.model_validate({"name": "c", "source": {"format": "documents", "path": "x"}, "table": "t", "key": ["id"], **extra})


def test_only_bindings_with_reductions_need_loads() -> None:
    assert not _binding().needs_loads
    assert not _binding(reductions={"n": "lastWriteWins"}).needs_loads
    assert _binding(reductions={"n": "sum"}).needs_loads
    assert not _binding(reductions={"n": "sum"}, mode="delta_updates").needs_loads


def test_every_strategy_is_accepted_and_reserved_fields_are_refused() -> None:
    for how in ("lastWriteWins", "firstWriteWins", "sum", "min", "max", "merge", "append"):
        reductions.check_supported(_binding(reductions={"f": how}))
    with pytest.raises(ConfigError, match="'_seq' is reserved"):
        reductions.check_supported(_binding(reductions={"_seq": "sum"}))


def test_types_unify_by_field_name_with_the_table_first() -> None:
    from pyspark.sql.types import ArrayType, DoubleType, IntegerType, LongType, StringType, StructField, StructType

    table = StructType([StructField("w", LongType()), StructField("x", LongType())])
    doc = StructType([StructField("x", StringType()), StructField("a", IntegerType())])
    assert reductions.unify_types(table, doc) == StructType(
        [StructField("w", LongType()), StructField("x", LongType()), StructField("a", IntegerType())]
    )
    assert reductions.unify_types(LongType(), DoubleType()) == DoubleType()
    assert reductions.unify_types(ArrayType(LongType()), ArrayType(StringType())) == ArrayType(LongType())
    assert reductions.unify_types(ArrayType(LongType()), LongType()) is None


# --- Spark ---------------------------------------------------------------------------------------


def example_config(tmp_path: Path, extra_bindings: list[dict[str, Any]] | None = None) -> Any:
    """conf/counters-example.yaml with its state under ``tmp_path`` instead of ``.materializer/``."""
    data = yaml.safe_load((REPO / "conf" / "counters-example.yaml").read_text())
    for name in ("recovery_log", "staging"):
        data[name] = str(tmp_path / data[name])
    for b in data["bindings"]:
        b["table"] = str(tmp_path / b["table"])
        b["source"]["path"] = str(REPO / b["source"]["path"])
    data["bindings"] += extra_bindings or []
    data["spark"] = {"master": "local[2]"}
    return parse_config(data, "counters-example")


@pytest.mark.spark
def test_seed_counter_in_both_modes_and_loads_only_where_reductions_are(spark: Any, tmp_path: Path) -> None:
    """Seed 000: -1, 3, 2 store 4; then 6, -7, -1 store 2 (standard) or -2 (delta-updates)."""
    lww = binding("latest", REPO / "conf" / "examples" / "counters", tmp_path / "tables" / "latest", key=["counter"])
    config = example_config(tmp_path, [lww])
    events = ListCollector()
    Runtime(config, spark, events).run(max_epochs=1)
    counters = tmp_path / ".materializer" / "tables" / "counters"
    deltas = tmp_path / ".materializer" / "tables" / "counter_deltas"
    assert [r["n"] for r in spark.read.format("delta").load(str(counters)).collect()] == [4]
    Runtime(config, spark, events).run()
    [row] = spark.read.format("delta").load(str(counters)).collect()
    assert row.asDict(recursive=True) == {
        "counter": "clicks",
        "n": 2,  # -1 + 3 + 2 + 6 - 7 - 1
        "smallest": -7,
        "largest": 6,
        "first_seen": "2026-03-01T09:00:00Z",
        "last_seen": "2026-03-02T09:00:00Z",
        "sources": ["web", "app", "web", "api", "web"],
        "labels": {"owner": "ada", "team": "search"},
    }
    appended = spark.read.format("delta").load(str(deltas)).orderBy("first_seen").collect()
    assert [(r["n"], r["smallest"], r["largest"], r["_op"]) for r in appended] == [(4, -1, 3, "u"), (-2, -7, 6, "u")]
    assert [r["sources"] for r in appended] == [["web", "app", "web"], ["api", "web"]]
    # Loads: one per epoch for the standard binding with reductions; none for delta-updates or
    # for the lastWriteWins-only binding.
    assert [(e["binding"], e["epoch"]) for e in events.named("load")] == [("counters", 1), ("counters", 2)]
    assert [r["counter"] for r in spark.read.format("delta").load(str(tmp_path / "tables" / "latest")).collect()] == ["clicks"]


# --- property tests against the oracle ---------------------------------------------------------

KEYS = st.integers(0, 2)
LEAF = st.none() | st.integers(-9, 9)
# Through the driver, objects carry every sub-field (values may be NULL): the driver's _align
# casts structs by position, so an object shape the table lacks fails there (reported; see
# reductions.conform for the by-name alignment the fold itself uses).
PROFILE = st.fixed_dictionaries({"a": LEAF, "b": LEAF, "c": st.fixed_dictionaries({"d": LEAF})})
# Without the driver, sub-fields may be missing: the fold unifies structs by name.
LOOSE_PROFILE = st.fixed_dictionaries(
    {"a": LEAF}, optional={"b": LEAF, "c": st.none() | st.fixed_dictionaries({"d": LEAF}, optional={"e": LEAF})}
)


def documents(profile: Any) -> Any:
    upsert = st.fixed_dictionaries(
        {"id": KEYS},
        optional={
            "name": st.sampled_from(["x", "y"]),
            "n": LEAF,
            "lo": LEAF,
            "hi": LEAF,
            "first": st.none() | st.sampled_from(["p", "q"]),
            "tags": st.none() | st.lists(st.sampled_from(["t1", "t2"]), max_size=2),
            "profile": st.none() | profile,
        },
    )
    delete = st.builds(lambda k: {"_meta": {"op": "d"}, "id": k}, KEYS)
    return st.one_of(upsert, upsert, upsert, delete)


def spool(spark: Any, folder: Path, docs: list[dict[str, Any]]) -> Any:
    """The documents DataFrame the documents source makes (fields, ``_op``, ``_seq``)."""
    from materializer.sources.documents.source import DocumentsSource
    from materializer.storage.local import LocalStore

    source = folder / f"src-{len(list(folder.iterdir()))}"
    write_jsonl(source / "docs.jsonl", docs)
    config = BindingConfig.model_validate({"name": "c", "source": {"format": "documents", "path": str(source)}, "table": "t", "key": ["id"]})
    batch = DocumentsSource(config, LocalStore(str(folder / "staging"))).next_batch(spark, None, len(docs), "x")
    assert batch is not None
    return batch.documents


# Spark-backed examples are slow: few of them, no deadline, and no shrinking (a failing example
# is reported as found; shrinking one would take minutes of Spark jobs).
SPARK_SETTINGS = dict(
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.slow
@pytest.mark.spark
@settings(max_examples=10, **SPARK_SETTINGS)  # type: ignore[arg-type]
@given(before=st.lists(documents(LOOSE_PROFILE), max_size=8), epoch=st.lists(documents(LOOSE_PROFILE), min_size=1, max_size=8))
def test_reduce_into_loaded_rows_equals_the_sequential_fold(spark: Any, before: list[dict[str, Any]], epoch: list[dict[str, Any]]) -> None:
    """One epoch reduced in Spark into the current rows (as a join would load them) = the fold."""
    binding_config = _binding(reductions=REDUCTIONS)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        epoch_keys = {d["id"] for d in epoch}
        current = [row for (k,), row in standard_rows(before, ["id"], REDUCTIONS).items() if k in epoch_keys]
        loaded = None
        if current:
            (folder / "current.jsonl").write_text("".join(json.dumps(r) + "\n" for r in current))
            loaded = spark.read.json(str(folder / "current.jsonl"))
        rows = reductions.reduce(spool(spark, folder, epoch), loaded, binding_config).collect()
    got = sorted((normalize(r.asDict(recursive=True)) for r in rows), key=canonical)
    state = {(row["id"],): ("u", {f: v for f, v in row.items() if f != "id"}) for row in current}
    for doc in epoch:
        state[(doc["id"],)] = fold(state.get((doc["id"],)), doc, ["id"], REDUCTIONS)
    expected = sorted(
        (normalize({"id": k, **fields, "_op": op}) for (k,), (op, fields) in state.items() if k in epoch_keys), key=canonical
    )
    assert got == expected


def seed_document() -> dict[str, Any]:
    # First in the source, with every field non-NULL: the table's columns get their types from
    # the first epoch (JSON infers a string for a field that is NULL throughout an epoch).
    return {"id": 9, "name": "s", "n": 1, "lo": 1, "hi": 1, "first": "s", "tags": ["s"], "profile": {"a": 1, "b": 1, "c": {"d": 1}}}


# Epochs of 3 after the seed document: [seed, 0, 1] [delete 0, 0, 2] [0, 1, delete 2]. Key 0 is
# deleted and written again within an epoch, key 1 skips an epoch, key 2 ends deleted.
THREE_EPOCHS = [
    {"id": 0, "n": 5, "lo": 5, "hi": 5, "tags": ["t1"], "profile": {"a": 1, "b": None, "c": {"d": None}}},
    {"id": 1, "n": 1, "first": "q"},
    {"_meta": {"op": "d"}, "id": 0},
    {"id": 0, "n": 2, "first": "p", "name": "x"},
    {"id": 2, "n": None, "lo": None, "hi": 4},
    {"id": 0, "n": 3, "lo": 7, "tags": ["t2", "t1"], "profile": {"a": None, "b": 2, "c": {"d": 3}}},
    {"id": 1, "n": 4, "first": "p", "tags": ["t2"]},
    {"_meta": {"op": "d"}, "id": 2},
]


@pytest.mark.slow
@pytest.mark.spark
@settings(max_examples=2, **SPARK_SETTINGS)  # type: ignore[arg-type]
@example(docs=THREE_EPOCHS, epoch_size=3)
@given(docs=st.lists(documents(PROFILE), min_size=6, max_size=9), epoch_size=st.sampled_from([2, 3]))
def test_several_epochs_in_both_modes_equal_the_oracle(spark: Any, docs: list[dict[str, Any]], epoch_size: int) -> None:
    """Standard mode (loads + MERGE) and delta-updates mode (appends) over several epochs."""
    docs = [seed_document()] + docs
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # One file per epoch: the documents source takes whole files.
        for start in range(0, len(docs), epoch_size):
            write_jsonl(folder / "src" / f"part-{start:04d}.jsonl", docs[start : start + epoch_size])
        bindings = [
            binding("std", folder / "src", folder / "std", reductions=REDUCTIONS, max_files=1),
            binding("deltas", folder / "src", folder / "deltas", mode="delta_updates", reductions=REDUCTIONS, max_files=1),
        ]
        config = load_config(write_config(folder, bindings, max_documents=epoch_size))
        events = ListCollector()
        summary = Runtime(config, spark, events).run()
        assert summary.last_epoch == -(-len(docs) // epoch_size)
        assert_tables_equal_oracle(spark, config)
        assert [e["binding"] for e in events.named("load")] == ["std"] * summary.last_epoch


# --- crashes ---------------------------------------------------------------------------------------

# Each run of the chain dies at one point of one epoch; the next run recovers and goes on.
CRASH_CHAIN = [
    "after-stage:2",  # epoch 1 applied; epoch 2 staged, not in the log: Open deletes it
    "after-started-commit:2",
    "mid-log-commit:2",
    "after-log-commit:2",  # epoch 2 committed, unapplied: the next Open applies it
    "mid-apply:3",  # inside the MERGE of epoch 3 (loads of 3 read epoch 2 applied)
    "after-apply:4",  # counters applied, counter_deltas not: the re-apply skips the former
    "after-ack-before-gc:5",  # both applied, staged files kept: the re-apply skips both
    "mid-load:7",  # inside the Spark job that loads epoch 7's current rows
]


def counter_documents() -> list[dict[str, Any]]:
    import random

    rng = random.Random(5)
    docs: list[dict[str, Any]] = []
    for i in range(30):
        counter = rng.choice("abc")
        if i in (13, 22):
            docs.append({"_meta": {"op": "d"}, "counter": counter})  # a delete resets the counter
        else:
            docs.append({"counter": counter, "n": rng.randint(-20, 20), "hits": 1})
    return docs


@pytest.mark.crash
@pytest.mark.drill  # nine CLI runs, each starting a JVM: minutes on two cores (pytest -m drill)
def test_sums_are_exact_after_a_kill_at_every_failure_point(spark: Any, tmp_path: Path) -> None:
    """One pipeline, killed once at each failure point (in turn, across epochs), then run clean."""
    from materializer.delta import TableRef, history

    assert {entry.split(":")[0] for entry in CRASH_CHAIN} == set(crash.POINTS)
    docs = counter_documents()
    for start in range(0, 30, 3):  # 10 epochs: one file of 3 documents each
        write_jsonl(tmp_path / "src" / f"counters-{start:02d}.jsonl", docs[start : start + 3])
    rules = {"n": "sum", "hits": "sum"}
    bindings = [
        binding("counters", tmp_path / "src", tmp_path / "counters", key=["counter"], reductions=rules, max_files=1),
        binding("counter_deltas", tmp_path / "src", tmp_path / "counter_deltas", key=["counter"], mode="delta_updates", reductions=rules, max_files=1),
    ]
    config = write_config(tmp_path, bindings)
    for point in CRASH_CHAIN:
        result = run_cli("run", "--config", str(config), env={crash.ENV: point})
        assert result.returncode == -9, f"{point} did not fire:\n{result.stderr[-3000:]}"
    result = run_cli("run", "--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]

    assert_tables_equal_oracle(spark, config)
    for table in ("counters", "counter_deltas"):
        epochs = [h["tag"]["epoch"] for h in history(spark, TableRef(str(tmp_path / table))) if h["tag"]]
        assert epochs == list(range(1, 11)), f"{table}: every epoch applied exactly once"


# A kill inside the load (mid-load) with sums: tests/test_crash_points.py, in process; the drill
# above and the short drill (tests/test_drill.py) kill the real process there.
