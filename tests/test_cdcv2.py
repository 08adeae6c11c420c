"""The ``cdcv2`` source (issue #3): Materialize's CDC v2 statements, mangled, into exact tables.

Three layers:

* the progress bookkeeping in plain Python (``parse_progress``, ``track``, ``plan_epoch``): no JVM;
* in-process runs of :class:`materializer.runtime.Runtime` on the shared ``spark`` session, checked
  against a plain-Python oracle: the seed's own example, the shipped example, random histories that
  are encoded as CDC v2 and then mangled (every statement possibly duplicated, shuffled, re-batched
  into other statements and files, progress split and merged), with kills simulated in-process at
  every failure point, and corrupt input;
* one real kill -9 of the CLI in a subprocess (its own JVM), then a rerun.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from materializer import crash
from materializer.errors import SourceError
from materializer.sources.cdcv2.source import Origin, Progress, parse_progress, plan_epoch, track
from tests.helpers import REPO, InProcessCrash, binding, table_rows, write_config

Update = tuple[dict[str, Any], int, int]
Row = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Histories, their CDC v2 encoding, mangling, and the oracle (plain Python).
# ---------------------------------------------------------------------------------------------


def random_history(rng: random.Random, keys: int, times: int) -> list[Update]:
    """A keyed history: at every time each key holds at most one row; a change is (-1 old, +1 new)."""
    state: dict[int, Row] = {}
    updates: list[Update] = []
    for t in range(times):
        for k in rng.sample(range(keys), rng.randint(0, keys)):
            old = state.get(k)
            if old is not None and rng.random() < 0.3:
                updates.append((old, t, -1))
                del state[k]
                continue
            new = {"id": k, "v": rng.randint(0, 3), "s": rng.choice(["a", "b", "c"])}
            if new == old:
                continue
            if old is not None:
                updates.append((old, t, -1))
            updates.append((new, t, 1))
            state[k] = new
    return updates


def oracle(updates: list[Update], frontier: int | None) -> dict[tuple[Any, ...], Row]:
    """The history's state at ``frontier`` (None: all of it), one row per key."""
    counts: dict[str, int] = {}
    for data, t, diff in updates:
        if frontier is None or t < frontier:
            text = json.dumps(data, sort_keys=True)
            counts[text] = counts.get(text, 0) + diff
    state: dict[tuple[Any, ...], Row] = {}
    for text, n in counts.items():
        assert n in (0, 1), (text, n)
        if n == 1:
            row = json.loads(text)
            assert (row["id"],) not in state
            state[(row["id"],)] = row
    return state


def _partition(rng: random.Random, low: int, high: int) -> list[tuple[int, int]]:
    """``[low, high)`` cut into random consecutive intervals (maybe empty ones)."""
    cuts = sorted(rng.sample(range(low, high + 1), min(rng.randint(0, 3), high - low + 1)))
    bounds = [low] + cuts + [high]
    return [(a, b) for a, b in zip(bounds, bounds[1:])]


def encode(rng: random.Random, updates: list[Update], upper: int | None, horizon: int) -> list[dict[str, Any]]:
    """CDC v2 statements for ``updates``, with progress up to ``upper`` (None: the stream ends).

    The update statements are batched twice, differently; progress is given as two different
    partitions of ``[0, upper)`` (the second one partial): duplicated information, re-batched.
    """
    statements: list[dict[str, Any]] = []
    for _ in range(2):
        shuffled = updates[:]
        rng.shuffle(shuffled)
        while shuffled:
            size = rng.randint(1, 4)
            batch, shuffled = shuffled[:size], shuffled[size:]
            statements.append({"updates": [[d, t, r] for d, t, r in batch]})
    per_time: dict[int, int] = {}
    for _, t, _ in updates:
        per_time[t] = per_time.get(t, 0) + 1
    end = horizon if upper is None else upper
    for round_ in range(2):
        intervals = _partition(rng, 0, end)
        if round_ == 1:
            intervals = [iv for iv in intervals if rng.random() < 0.5]
        for a, b in intervals:
            counts = [[t, per_time[t]] for t in range(a, b) if t in per_time]
            statements.append({"progress": {"lower": [a], "upper": [b], "counts": counts}})
    if upper is None:
        statements.append({"progress": {"lower": [end], "upper": [], "counts": []}})
    return statements


def mangle(rng: random.Random, statements: list[dict[str, Any]], files: int) -> list[list[dict[str, Any]]]:
    """Duplicate statements at random, shuffle them, and deal them into ``files`` files."""
    out = []
    for s in statements:
        out.extend([s] * rng.choice([1, 1, 2, 3]))
    rng.shuffle(out)
    dealt: list[list[dict[str, Any]]] = [[] for _ in range(files)]
    for s in out:
        dealt[rng.randrange(files)].append(s)
    return dealt


def write_files(folder: Path, dealt: list[list[dict[str, Any]]], prefix: str = "part") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, statements in enumerate(dealt):
        (folder / f"{prefix}-{i:03d}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in statements))


# ---------------------------------------------------------------------------------------------
# Progress bookkeeping, no JVM.
# ---------------------------------------------------------------------------------------------


def P(lower: int, upper: int | None, counts: dict[int, int] | None = None, name: str = "f.jsonl") -> Progress:
    body = {"lower": [lower], "upper": [] if upper is None else [upper], "counts": [[t, n] for t, n in (counts or {}).items()]}
    return parse_progress(body, Origin(name, json.dumps({"progress": body}), 1))


def test_parse_progress_rejects_malformed_statements() -> None:
    origin = Origin("/src/a.jsonl", "{}", 7)
    for body, fragment in [
        ([], "must be an object"),
        ({"lower": [0, 1], "upper": [2]}, '"lower" must be [t]'),
        ({"lower": [-1], "upper": [2]}, '"lower" must be [t]'),
        ({"lower": [0], "upper": [1, 2]}, '"upper" must be [t]'),
        ({"lower": [3], "upper": [2]}, "above upper"),
        ({"lower": [0], "upper": [2], "counts": [[2, 1]]}, "outside [0, 2)"),
        ({"lower": [0], "upper": [2], "counts": [[1, -1]]}, "negative"),
        ({"lower": [0], "upper": [2], "counts": [[1, 1], [1, 2]]}, "counted twice"),
        ({"lower": [0], "upper": [2], "counts": [[1.5, 1]]}, "pair of integers"),
        ({"lower": [0], "upper": [2], "extra": 1}, "unknown field"),
    ]:
        with pytest.raises(SourceError) as info:
            parse_progress(body, origin)
        assert fragment in str(info.value)
        assert "/src/a.jsonl:7" in str(info.value) and "run again" in str(info.value)
        assert info.value.file == "/src/a.jsonl" and info.value.line == 7
    ok = parse_progress({"lower": [0], "upper": [], "counts": [[5, 2], [1, 0]]}, origin)
    assert ok.upper is None and ok.counts == ((5, 2),)  # zero counts say nothing


def test_track_follows_the_seed_on_its_example() -> None:
    # The seed's statements: progress (time0, 3), (time1, 2), (time2, 2), (time3, 0).
    statements = [P(0, 1, {0: 3}), P(1, 2, {1: 2}), P(2, 3, {2: 2}), P(3, 4)]
    done = track(0, statements, {0: 3, 1: 2, 2: 2})
    assert (done.progress, done.complete, done.problems) == (4, 4, [])
    # Missing one update at time 1: time 0 is complete, time 1 is not.
    partial = track(0, statements, {0: 3, 1: 1, 2: 2})
    assert (partial.progress, partial.complete) == (4, 1)
    # Updates before their progress: nothing is complete beyond the progress frontier.
    early = track(0, statements[:1], {0: 3, 1: 2})
    assert (early.progress, early.complete) == (1, 1)


def test_track_waits_for_the_lower_bound_and_absorbs_rebatched_progress() -> None:
    # [2, 5) arrives before [0, 2): queued, not applied, until the gap is covered.
    later = P(2, 5, {2: 1, 4: 2})
    gap = track(0, [later], {2: 1, 4: 2})
    assert (gap.progress, gap.complete, gap.pending) == (0, 0, 1)
    statements = [later, P(0, 2, {0: 3, 1: 3}), P(0, 1, {0: 3}), P(1, 3, {1: 3, 2: 1}), P(0, 2, {0: 3, 1: 3})]
    done = track(0, statements, {0: 3, 1: 3, 2: 1, 4: 2})
    assert (done.progress, done.complete, done.problems, done.pending) == (5, 5, [], 0)
    # From a checkpoint: counts below it are ignored, statements reaching it apply.
    resumed = track(2, statements, {2: 1, 4: 2})
    assert (resumed.progress, resumed.complete, resumed.expected) == (5, 5, {2: 1, 4: 2})
    # An empty upper ends the stream: the frontier becomes None (nothing is ever due again).
    ended = track(3, [P(0, 3), P(3, None, {3: 1})], {3: 1})
    assert (ended.progress, ended.complete) == (None, None)
    assert track(None, statements, {}).complete is None


def test_track_finds_counts_that_can_never_be_met_and_disagreeing_progress() -> None:
    excess = track(0, [P(0, 3, {0: 1, 1: 1}, name="p.jsonl")], {0: 1, 1: 2, 2: 1})
    assert [p.time for p in excess.problems] == [1, 2]
    assert excess.problems[0].origins[0].file == "p.jsonl"
    assert "can never be met" in excess.problems[0].message
    assert excess.limit == 1  # time 0 may still be materialized, nothing from time 1 on
    disagree = track(0, [P(0, 2, {0: 1, 1: 2}), P(1, 3, {1: 3, 2: 1})], {0: 1, 1: 2, 2: 1})
    assert [p.time for p in disagree.problems] == [1]
    assert "disagree" in disagree.problems[0].message
    assert disagree.limit == 1
    silent = track(0, [P(0, 2, {0: 1, 1: 2}), P(1, 3, {2: 1})], {0: 1, 1: 2, 2: 1})
    assert [p.time for p in silent.problems] == [1] and "no updates" in silent.problems[0].message
    # Fewer updates than counted is not corrupt: the rest may still arrive.
    waiting = track(0, [P(0, 2, {0: 1, 1: 2})], {0: 1, 1: 1})
    assert (waiting.complete, waiting.problems) == (1, [])


def test_plan_epoch_takes_whole_times_up_to_max_documents() -> None:
    received = {0: 3, 1: 2, 4: 2, 9: 1}
    assert plan_epoch(0, 5, received, 4) is not None
    first = plan_epoch(0, 5, received, 4)
    assert first is not None and (first.times, first.frontier, first.count) == ((0,), 1, 3)
    second = plan_epoch(1, 5, received, 4)
    assert second is not None and (second.times, second.frontier, second.count) == ((1, 4), 5, 4)
    # A time larger than max_documents is taken whole, alone.
    big = plan_epoch(0, 5, received, 1)
    assert big is not None and (big.times, big.frontier) == ((0,), 1)
    # Times without updates are passed over; nothing to materialize is None.
    assert plan_epoch(5, 9, received, 10) is None
    ended = plan_epoch(5, None, received, 10)
    assert ended is not None and (ended.times, ended.frontier) == ((9,), None)
    assert plan_epoch(None, None, received, 10) is None


def python_reader(dealt: list[list[dict[str, Any]]], frontier: int = 0) -> tuple[int | None, dict[int, int]]:
    """The whole reader without Spark: dedupe the updates, count them per time, track progress."""
    distinct = {
        (json.dumps(d, sort_keys=True), t, r)
        for statements in dealt
        for s in statements
        for d, t, r in s.get("updates", [])
        if t >= frontier
    }
    received: dict[int, int] = {}
    for _, t, _ in distinct:
        received[t] = received.get(t, 0) + 1
    progress = [P(**_progress_args(s["progress"])) for statements in dealt for s in statements if "progress" in s]
    tracking = track(frontier, progress, received)
    assert tracking.problems == []
    return tracking.complete, received


def _progress_args(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "lower": body["lower"][0],
        "upper": body["upper"][0] if body["upper"] else None,
        "counts": {t: n for t, n in body["counts"]},
    }


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), upper=st.one_of(st.none(), st.integers(0, 6)), resume=st.integers(0, 6))
def test_mangling_never_changes_what_is_complete(seed: int, upper: int | None, resume: int) -> None:
    rng = random.Random(seed)
    updates = random_history(rng, keys=4, times=6)
    dealt = mangle(rng, encode(rng, updates, upper, horizon=6), files=rng.randint(1, 4))
    complete, received = python_reader(dealt)
    assert complete == upper
    # Epochs of any size cover exactly the times with updates below the frontier, each once.
    covered: list[int] = []
    at: int | None = 0
    while (plan := plan_epoch(at, complete, received, rng.randint(1, 5))) is not None:
        covered.extend(plan.times)
        at = plan.frontier
    assert covered == sorted(t for t in received if upper is None or t < upper)
    # Resuming from any frontier below the end reaches the same end.
    start = resume if upper is None else min(resume, upper)
    assert python_reader(dealt, start)[0] == upper


# ---------------------------------------------------------------------------------------------
# In-process runs on the shared Spark session.
# ---------------------------------------------------------------------------------------------


class Killed(BaseException):
    """An in-process stand-in for the SIGKILL of a crash point (nothing catches BaseException)."""


def _run(spark: Any, config_path: Path) -> Any:
    from materializer.config import load_config
    from materializer.runtime import Runtime

    return Runtime(load_config(config_path), spark).run()


def _pipeline(tmp: Path, source: Path, max_documents: int, pipeline_id: str = "cdcv2-test") -> Path:
    return write_config(
        tmp, [binding("rows", source, tmp / "table", format="cdcv2")], max_documents=max_documents, pipeline_id=pipeline_id
    )


@pytest.mark.slow
@pytest.mark.spark
def test_the_seeds_example_round_trips(spark: Any, tmp_path: Path) -> None:
    # Seed 002: record0 twice at time0; record1 -> record2 at time1; record0 and record2 at time2.
    r = [{"id": i, "name": f"record{i}"} for i in range(3)]
    statements = [
        {"updates": [[r[0], 0, 2], [r[1], 0, 1], [r[2], 0, 1]]},
        {"progress": {"lower": [0], "upper": [1], "counts": [[0, 3]]}},
        {"updates": [[r[1], 1, -1], [r[2], 1, 1]]},
        {"progress": {"lower": [1], "upper": [2], "counts": [[1, 2]]}},
        {"updates": [[r[0], 2, -1], [r[2], 2, -1]]},
        {"progress": {"lower": [2], "upper": [3], "counts": [[2, 2]]}},
        {"progress": {"lower": [3], "upper": [4], "counts": []}},
    ]
    source = tmp_path / "src"
    rng = random.Random(2)
    write_files(source, mangle(rng, statements, 3))
    summary = _run(spark, _pipeline(tmp_path, source, max_documents=100))
    assert table_rows(spark, tmp_path / "table", ["id"]) == {(0,): r[0], (2,): r[2]}
    assert [e.documents["rows"] for e in summary.epochs] == [7]
    assert _run(spark, _pipeline(tmp_path, source, max_documents=100)).epochs == []  # nothing twice


@pytest.mark.spark
def test_the_shipped_example(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(REPO / "conf" / "examples" / "cdcv2", source)
    summary = _run(spark, _pipeline(tmp_path, source, max_documents=3))
    assert len(summary.epochs) == 3
    assert table_rows(spark, tmp_path / "table", ["id"]) == {
        (1,): {"id": 1, "owner": "ada", "balance": 70},
        (2,): {"id": 2, "owner": "bob", "balance": 80},
        (4,): {"id": 4, "owner": "dan", "balance": 12},  # its delete at time 5 awaits progress
    }
    # The progress for time 5 arrives in a new file: the next run applies just that.
    (source / "cdc-004.jsonl").write_text(json.dumps({"progress": {"lower": [5], "upper": [6], "counts": [[5, 1]]}}) + "\n")
    summary = _run(spark, _pipeline(tmp_path, source, max_documents=3))
    assert [e.documents["rows"] for e in summary.epochs] == [1]
    assert (4,) not in table_rows(spark, tmp_path / "table", ["id"])
    import yaml

    example = yaml.safe_load((REPO / "conf" / "cdcv2-example.yaml").read_text())
    assert example["bindings"][0]["source"] == {"format": "cdcv2", "path": "conf/examples/cdcv2"}


KILLS = st.one_of(
    st.none(), st.tuples(st.sampled_from([p for p in crash.POINTS if p != "mid-load"]), st.integers(1, 2))
)
"""Where to kill the first run: a failure point of materializer.crash and an epoch (mid-load needs
loads, which lastWriteWins bindings never issue)."""


def check_mangled_history(
    spark: Any, tmp: Path, seed: int, upper: int | None, max_documents: int, kill: tuple[str, int] | None
) -> None:
    """Encode a random history, mangle it, hold some statements back; run (killed at ``kill``),
    let the held statements arrive, run again: the table is the history's state at ``upper``."""
    rng = random.Random(seed)
    updates = random_history(rng, keys=4, times=6)
    source = tmp / "src"
    dealt = mangle(rng, encode(rng, updates, upper, horizon=6), files=rng.randint(1, 4))
    held = [s for s in dealt[-1] if rng.random() < 0.5]
    dealt[-1] = [s for s in dealt[-1] if s not in held]
    write_files(source, dealt)
    config = _pipeline(tmp, source, max_documents)
    with pytest.MonkeyPatch.context() as mp:
        if kill is not None:
            mp.setattr(crash, "kill_now", _raise_killed)
            mp.setenv(crash.ENV, f"{kill[0]}:{kill[1]}")
        try:
            _run(spark, config)
        except Killed:
            pass
    write_files(source, [held], prefix="late")
    _run(spark, config)
    assert _table(spark, tmp / "table") == oracle(updates, upper)


@pytest.mark.slow
@pytest.mark.spark
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    upper=st.one_of(st.none(), st.integers(0, 6)),
    max_documents=st.integers(1, 12),
    kill=KILLS,
)
def test_mangled_histories_materialize_to_the_state_at_the_frontier(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, seed: int, upper: int | None, max_documents: int, kill: Any
) -> None:
    check_mangled_history(spark, tmp_path_factory.mktemp("prop"), seed, upper, max_documents, kill)


@pytest.mark.drill
@pytest.mark.spark
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    upper=st.one_of(st.none(), st.integers(0, 6)),
    max_documents=st.integers(1, 12),
    kill=KILLS,
)
def test_drill_many_mangled_histories(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, seed: int, upper: int | None, max_documents: int, kill: Any
) -> None:
    check_mangled_history(spark, tmp_path_factory.mktemp("drill"), seed, upper, max_documents, kill)


def _raise_killed() -> None:
    # mid-apply's watcher thread calls this too: an exception there would only end that thread.
    # The main thread calls it again as soon as the Spark job is over, still before anything else.
    if threading.current_thread() is threading.main_thread():
        raise Killed()


@pytest.mark.spark
def test_corrupt_input_stops_at_its_time_naming_file_and_statement(spark: Any, tmp_path: Path) -> None:
    a, b, c = ({"id": 1, "v": 1}, {"id": 1, "v": 2}, {"id": 2, "v": 1})
    source = tmp_path / "src"
    write_files(
        source,
        [
            [
                {"updates": [[a, 0, 1], [c, 0, 1]]},
                {"progress": {"lower": [0], "upper": [3], "counts": [[0, 2], [1, 2], [2, 1]]}},
                {"updates": [[a, 1, -1], [b, 1, 1]]},
            ],
            [{"updates": [[c, 2, -1]]}, {"updates": [[c, 2, 1]]}],  # two diffs for (c, 2)
        ],
    )
    with pytest.raises(SourceError) as info:
        _run(spark, _pipeline(tmp_path, source, max_documents=100))
    message = str(info.value)
    assert "time 2" in message and "different diffs" in message, message
    assert "part-001.jsonl:1" in message and "part-001.jsonl:2" in message, message
    assert "run again" in message
    # Times 0 and 1 were good: they are in the table; nothing of time 2 is.
    assert table_rows(spark, tmp_path / "table", ["id"]) == {(1,): b, (2,): c}


@pytest.mark.slow
@pytest.mark.spark
def test_ambiguous_keys_and_malformed_statements_are_errors(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "src"
    one, other = {"id": 1, "v": 1}, {"id": 1, "v": 2}
    write_files(
        source,
        [[{"updates": [[one, 0, 1], [other, 0, 1]]}, {"progress": {"lower": [0], "upper": [1], "counts": [[0, 2]]}}]],
    )
    with pytest.raises(SourceError) as info:
        _run(spark, _pipeline(tmp_path, source, max_documents=100))
    assert "more than once" in str(info.value) and "part-000.jsonl:1" in str(info.value)
    assert not (tmp_path / "table").exists()

    (source / "part-000.jsonl").write_text('{"updates": [[{"id": 1}, 0, 1]]}\n{"updates": [[{"v": 1}, 0, 1]]}\n')
    with pytest.raises(SourceError) as info:
        _run(spark, _pipeline(tmp_path, source, max_documents=100))
    assert "part-000.jsonl:2" in str(info.value) and "key field 'id'" in str(info.value)
    assert info.value.line == 2

    # Two statements on one line: Spark's parser would read the first and drop the second.
    (source / "part-000.jsonl").write_text('{"updates": [[{"id": 1}, 0, 1]]}{"updates": [[{"id": 2}, 0, 1]]}\n')
    with pytest.raises(SourceError) as info:
        _run(spark, _pipeline(tmp_path, source, max_documents=100))
    assert "part-000.jsonl:1" in str(info.value) and "more than one JSON value" in str(info.value)


# ---------------------------------------------------------------------------------------------
# A crash inside the MERGE of epoch 2 (in process: the thread freezes there, its Spark job is
# interrupted; tests/helpers.py InProcessCrash), then a rerun replays from the frontier.
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.spark
def test_a_crash_mid_apply_then_rerun(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from materializer.config import load_config
    from materializer.runtime import Runtime

    rng = random.Random(7)
    updates = random_history(rng, keys=5, times=5)
    source = tmp_path / "src"
    write_files(source, mangle(rng, encode(rng, updates, None, horizon=5), files=3))
    config = load_config(_pipeline(tmp_path, source, max_documents=4))
    killed = InProcessCrash(monkeypatch, "mid-apply:2")
    frozen = killed.run(lambda: Runtime(config, spark).run())
    try:
        killed.disarm()
        assert Runtime(config, spark).run().opened_at_epoch == 2
        assert _table(spark, tmp_path / "table") == oracle(updates, None)
    finally:
        killed.thaw()
        frozen.join(timeout=120)


def _table(spark: Any, table: Path) -> dict[tuple[Any, ...], Row]:
    return table_rows(spark, table, ["id"]) if (table / "_delta_log").exists() else {}
