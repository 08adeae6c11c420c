"""Recovery drills: `materializer drill` kills the real CLI, restarts it, and proves the tables right.

The default run has two drills (each JVM start costs ~15 s, so the kills are chained over
successive restarts of one pipeline): kills inside a MERGE's and a load's Spark job plus a random
kill, and the zombie. Every point, the damages and the long drill are ``pytest -m drill``: every
point and both damages are checked in process by tests/test_crash_points.py and
tests/test_damage.py. Fast unit tests of the oracle and the plan run without a JVM.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from materializer import crash
from materializer.tools import oracle
from materializer.config import parse_config
from materializer.merge import CREATION_WAIT_ENV
from materializer.tools.drill import Drill, DrillOptions, scratch_config, unreachable_points
from tests.helpers import REPO, binding, require_subprocess_tier, run_cli, write_config, write_jsonl


def make_collection(folder: Path, *, files: int = 4, per_file: int = 15, keys: int = 12, seed: int = 7) -> Path:
    """Inserts, updates and deletes of ``keys`` keys over ``files`` JSONL files; returns the folder."""
    rng = random.Random(seed)
    n = 0
    for f in range(files):
        docs: list[dict[str, Any]] = []
        for _ in range(per_file):
            n += 1
            k = rng.randrange(keys)
            if rng.random() < 0.15 and n > 1:
                docs.append({"_meta": {"op": "d"}, "id": k})
            else:
                # Integral and fractional scores: the oracle must match Spark's doubles. The first
                # document sets the column's type to double (an int column refuses 2.5 later).
                score = 0.5 if n == 1 else rng.choice([1, 2.5, 3])
                docs.append({"id": k, "n": n, "name": f"v{n}", "score": score})
        write_jsonl(folder / f"part-{f:03d}.jsonl", docs)
    return folder


def pipeline(tmp_path: Path, *, max_documents: int = 6, loads: bool = False, **collection: Any) -> Path:
    """Two bindings on one collection: standard mode and delta-updates mode (so after-apply fires).

    ``loads``: the standard binding reduces ``n`` by max, so it loads current rows (mid-load fires).
    """
    source = make_collection(tmp_path / "source", **collection)
    prod = tmp_path / "prod"
    prod.mkdir()
    extra: dict[str, Any] = {"reductions": {"n": "max"}} if loads else {}
    return write_config(
        prod,
        [
            # One file per epoch (the documents source takes whole files).
            binding("items", source, prod / "tables" / "items", max_files=1, **extra),
            binding("item_events", source, prod / "tables" / "item_events", mode="delta_updates", max_files=1),
        ],
        pipeline_id="drill-test",
        max_documents=max_documents,
    )


def _base() -> dict[str, Any]:
    return {"pipeline_id": "p", "recovery_log": "l", "staging": "s"}


# --- without a JVM -----------------------------------------------------------------------------


def test_oracle_standard_and_delta_updates(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"id": 1, "v": 1}, {"id": 2, "v": 2}, {"id": 1, "v": 3}])
    write_jsonl(src / "b.jsonl", [{"_meta": {"op": "d"}, "id": 2}, {"id": 3, "v": 4.0}])
    cfg = parse_config(
        {
            "pipeline_id": "p",
            "recovery_log": "l",
            "staging": "s",
            "transaction": {"max_documents": 2},
            "bindings": [
                binding("std", src, tmp_path / "t1", max_files=1),
                binding("upd", src, tmp_path / "t2", mode="delta_updates", max_files=1),
            ],
        },
        "test",
    )
    std = oracle.expected(cfg.binding("std"), 2)
    assert std.verified and std.epochs == 2 and std.documents == 5  # one file per epoch
    assert {k: json.loads(next(iter(c))) for k, c in std.rows.items()} == {(1,): {"id": 1, "v": 3}, (3,): {"id": 3, "v": 4}}
    upd = oracle.expected(cfg.binding("upd"), 2)
    # epochs (files): [1:v1, 2:v2, 1:v3] [2:delete, 3:v4]
    assert sum(sum(c.values()) for c in upd.rows.values()) == 4
    assert upd.rows[(2,)] == Counter({'{"_op":"u","id":2,"v":2}': 1, '{"_op":"d","id":2}': 1})
    # Reductions: the seed's example, -1, 3, 2 then 6, -7, -1 (a file each).
    write_jsonl(tmp_path / "seed" / "a.jsonl", [{"id": 1, "v": v} for v in (-1, 3, 2)])
    write_jsonl(tmp_path / "seed" / "b.jsonl", [{"id": 1, "v": v} for v in (6, -7, -1)])
    seed = {"name": "s", "source": {"format": "documents", "path": str(tmp_path / "seed"), "max_files": 1}, "table": "t", "key": ["id"]}
    std_sum = oracle.expected(parse_config({**_base(), "bindings": [{**seed, "reductions": {"v": "sum"}}]}, "t").bindings[0], 3)
    assert std_sum.rows == {(1,): Counter({'{"id":1,"v":2}': 1})}
    upd_sum = oracle.expected(
        parse_config({**_base(), "bindings": [{**seed, "mode": "delta_updates", "reductions": {"v": "sum"}}]}, "t").bindings[0], 3
    )
    assert upd_sum.rows == {(1,): Counter({'{"_op":"u","id":1,"v":4}': 1, '{"_op":"u","id":1,"v":-2}': 1})}
    # CDC v2: the shipped example's state at its frontier (time 5; the update at 5 waits).
    example = Path(__file__).resolve().parent.parent / "conf" / "examples" / "cdcv2"
    cdc = {**seed, "source": {"format": "cdcv2", "path": str(example)}}  # max_files is documents-only
    cdc_exp = oracle.expected(parse_config({**_base(), "bindings": [cdc]}, "t").bindings[0], 3)
    assert cdc_exp.verified and cdc_exp.rows
    # A mode without an oracle is "not verified", never a pass.
    cdc_upd = {**cdc, "mode": "delta_updates"}
    assert not oracle.expected(parse_config({**_base(), "bindings": [cdc_upd]}, "t").bindings[0], 3).verified

    # The comparison names lost, duplicated and wrong rows by key.
    rows = [{"id": 1, "v": 3.0, "extra": None}, {"id": 1, "v": 3}, {"id": 2, "v": 2}]
    cmp = oracle.compare(std, rows, ["id"])
    assert cmp.counts == {"lost": 1, "duplicated": 1, "wrong": 1}
    assert [d["key"] for d in cmp.lost] == [[3]] and [d["key"] for d in cmp.wrong] == [[2]]


def test_scratch_config_never_points_at_the_real_pipeline(tmp_path: Path) -> None:
    cfg_path = pipeline(tmp_path)
    from materializer.config import load_config

    cfg = load_config(cfg_path)
    data = scratch_config(cfg, tmp_path / "scratch", max_documents=3)
    for value in [data["recovery_log"], data["staging"]] + [b["table"] for b in data["bindings"]]:
        assert value.startswith(str(tmp_path / "scratch"))
    assert [b["source"]["path"] for b in data["bindings"]] == [b.source.path for b in cfg.bindings]
    assert data["transaction"]["max_documents"] == 3
    # The drill runs it: it must read back as a configuration (a dump of every default did not:
    # it set the kafka source's settings on documents sources), with --max-files applied.
    again = parse_config(scratch_config(cfg, tmp_path / "scratch", max_files=1), "scratch")
    assert [b.source.max_files for b in again.bindings] == [1, 1]
    # mid-load needs a binding that loads; both bindings here are lastWriteWins.
    assert set(unreachable_points(cfg)) == {"mid-load"}


def _fleet(tmp_path: Path) -> Any:
    """A pipeline as a fleet is written: a declared binding with its own dead-letter table and a
    live-row view, a template making a binding (table, dead letters, view) per sub-folder, and a
    Kafka template; everything it writes lives under prod/ or in the catalog's prod schema."""
    from materializer.config import load_config

    prod = tmp_path / "prod"
    for folder in ("eu", "us"):
        make_collection(tmp_path / "land" / folder, files=3, per_file=4, seed=len(folder) + ord(folder[0]))
    path = write_config(
        tmp_path,
        [binding("items", tmp_path / "land" / "eu", prod / "tables" / "items", on_invalid="dead_letter",
                 dead_letter_table=str(prod / "rejects"), view="prod.items_live")],
        pipeline_id="fleet-drill",
        templates=[
            {"source": {"format": "documents", "folders_in": str(tmp_path / "land")}, "name": "orders_{folder}",
             "table": str(prod / "tables" / "orders_{folder}"), "key": ["id"], "on_invalid": "dead_letter",
             "dead_letter_table": str(prod / "rejects"), "view": "prod.orders_{folder}_live"},
            {"source": {"format": "kafka", "bootstrap_servers": "127.0.0.1:9", "topic_pattern": r"shop\.(?P<table>\w+)"},
             "name": "shop_{table}", "table": "main.bronze.{table}", "key": ["id"]},
        ],
    )
    return load_config(path)


def test_scratch_config_moves_what_templates_dead_letters_and_views_would_write(tmp_path: Path) -> None:
    """A drill on a fleet wrote into the real pipeline's places: the scratch copy moved only the
    declared bindings' tables, so a template's tables, every dead-letter table and the live-row
    views (replaced with views of the scratch tables) were the user's own."""
    from materializer.templates import expand
    from materializer.tools.drill import scratch_notes

    cfg = _fleet(tmp_path)
    root = tmp_path / "scratch"
    data = scratch_config(cfg, root, max_files=1)
    text = json.dumps({k: v for k, v in data.items()})
    for own in (str(tmp_path / "prod"), "prod."):  # (main.bronze.{table}: checked below, made)
        assert own not in text, (own, text)
    scratch = parse_config(data, "scratch")
    assert scratch.bindings[0].dead_letters == scratch.templates[0].dead_letter_table  # shared: one copy
    assert all(t.source.max_files == 1 for t in scratch.templates if t.source.format == "documents")
    made = expand(scratch, {0: ["eu", "us"], 1: ["shop.a", "shop.b"]}).config.bindings
    assert [b.name for b in made] == ["items", "orders_eu", "orders_us", "shop_a", "shop_b"]
    places = [b.table for b in made] + [b.dead_letters for b in made if b.dead_letters]
    assert all(p.startswith(str(root)) for p in places), places
    assert len({b.table for b in made}) == 5 and all(b.view is None for b in made)
    assert [b.source.path for b in made[1:3]] == [str(tmp_path / "land" / f) for f in ("eu", "us")]  # read, not moved
    notes = scratch_notes(cfg)
    assert len(notes) == 1 and "items: prod.items_live" in notes[0] and "templates[0]: prod.orders_{folder}_live" in notes[0]


def test_a_fleets_epochs_are_sized_by_its_busiest_binding(tmp_path: Path) -> None:
    """The smallest binding's fit made every binding take one file (or record) an epoch: a fleet
    with one big table and a few small ones had rounds of hundreds of epochs."""
    from materializer.config import load_config
    from materializer.tools.drill import epoch_sizes, known_bindings

    for folder, files in (("big", 20), ("small", 2)):
        make_collection(tmp_path / "land" / folder, files=files, per_file=2)
    cfg = load_config(write_config(tmp_path, [], pipeline_id="fleet", templates=[
        {"source": {"format": "documents", "folders_in": str(tmp_path / "land")}, "table": str(tmp_path / "t" / "{folder}"), "key": ["id"]}
    ]))
    assert epoch_sizes(known_bindings(cfg), DrillOptions(config=tmp_path)).max_files == 4  # 20 files in 5 epochs
    # A binding that already has enough epochs (20 files, 2 an epoch) keeps everyone's sizes.
    cfg = load_config(write_config(tmp_path, [], pipeline_id="fleet", templates=[
        {"source": {"format": "documents", "folders_in": str(tmp_path / "land"), "max_files": 2}, "table": str(tmp_path / "t" / "{folder}"), "key": ["id"]}
    ]))
    assert epoch_sizes(known_bindings(cfg), DrillOptions(config=tmp_path)).max_files is None


def test_a_fleets_bindings_are_planned_for_from_what_its_templates_find(tmp_path: Path) -> None:
    """With templates, the bindings they make from what is there now are what the drill sizes
    epochs and reckons windows by: two sub-folders are two bindings (between two bindings' applies
    can be hit), each counted for its epochs."""
    from materializer.config import load_config
    from materializer.tools.drill import BETWEEN_BINDINGS, epoch_sizes, known_bindings

    for folder in ("eu", "us"):
        make_collection(tmp_path / "land" / folder, files=10, per_file=2)
    cfg = load_config(write_config(tmp_path, [], pipeline_id="fleet", templates=[
        {"source": {"format": "documents", "folders_in": str(tmp_path / "land")}, "table": str(tmp_path / "t" / "{folder}"), "key": ["id"]}
    ]))
    known = known_bindings(cfg)
    assert [b.name for b in known.bindings] == ["eu", "us"]
    assert BETWEEN_BINDINGS not in unreachable_points(known) and "after-apply" not in unreachable_points(known)
    sizes = epoch_sizes(known, DrillOptions(config=tmp_path))
    assert sizes.max_files == 2 and sizes.notes[:2] == ("eu: 10 document files, 1000 an epoch", "us: 10 document files, 1000 an epoch")
    # A pipeline of templates only (no `bindings:` in its file): its scratch copy parses.
    only = parse_config({k: v for k, v in cfg.model_dump(mode="json", by_alias=True, exclude_unset=True).items() if k != "bindings"}, "only")
    scratch = parse_config(scratch_config(only, tmp_path / "scratch", sizes.max_documents, sizes.max_files), "scratch")
    assert scratch.bindings == [] and scratch.templates[0].source.max_files == 2
    drill = Drill(DrillOptions(config=tmp_path / "pipeline.yaml", workdir=tmp_path / "w", kills=1, seed=3))
    drill.plans()
    assert drill.report.windows()[BETWEEN_BINDINGS] == 0  # reachable, not hit yet (was "one binding")
    assert drill.sizes.max_files == 2


def test_a_round_verified_no_table_is_not_a_pass() -> None:
    from materializer.tools.drill import Verification

    assert Verification(round=1).verdict == "not verified"


def test_plan_is_seeded_and_covers_every_reachable_point(tmp_path: Path) -> None:
    cfg_path = pipeline(tmp_path)
    plans = [Drill(DrillOptions(config=cfg_path, workdir=tmp_path / f"w{i}", kills=5, seed=3)).plans() for i in range(2)]
    assert plans[0] == plans[1]
    assert [p.point for p in plans[0] if p.kind == "point"] == [p for p in crash.POINTS if p != "mid-load"]
    assert sum(p.kind == "random" for p in plans[0]) == 5


def test_a_window_a_one_binding_pipeline_cannot_have_is_reported_as_such(tmp_path: Path) -> None:
    """Between two bindings' applies is no window of a one-binding pipeline: its report says
    why, whichever points were asked for (the long kafka drill's table said "never hit")."""
    from materializer.tools.drill import BETWEEN_BINDINGS, BETWEEN_EPOCHS

    source = make_collection(tmp_path / "source", files=2)
    cfg_path = write_config(tmp_path, [binding("items", source, tmp_path / "t")])
    for points in (None, [], ["mid-apply"]):
        drill = Drill(DrillOptions(config=cfg_path, workdir=tmp_path / f"w{len(str(points))}", kills=2, seed=3, points=points))
        drill.plans()
        windows = drill.report.windows()
        assert windows[BETWEEN_BINDINGS] == "the pipeline has one binding", (points, windows)
        assert windows[BETWEEN_EPOCHS] == 0


def test_random_kills_are_fitted_to_a_small_pipeline(tmp_path: Path) -> None:
    """Issue #11 item 12: a kill planned after the second commit of a pipeline that only ever
    commits one epoch is re-aimed at the first, with a delay inside the time the run lasted."""
    from materializer.tools.drill import Plan, RunPhase

    drill = Drill(DrillOptions(config=pipeline(tmp_path), workdir=tmp_path / "w", seed=5))
    phase = RunPhase(bindings=2)
    phase.saw("opened", 10.0)
    phase.saw("read", 11.0)
    phase.saw("committed", 14.0)
    phase.ended = 16.0
    fitted = drill.fit(Plan("random", trigger="committed", occurrence=2, delay=0.7), phase)
    assert fitted == Plan("random", trigger="committed", occurrence=1, delay=0.7)  # a fraction of the apply
    fitted = drill.fit(Plan("random", trigger="read", occurrence=2, delay=9.0), phase)
    assert fitted is not None and fitted.occurrence == 1 and 0 <= fitted.delay < 0.8 * (16.0 - 11.0)
    kept = drill.fit(Plan("random", trigger="read", occurrence=1, delay=1.0), phase)
    assert kept == Plan("random", trigger="read", occurrence=1, delay=1.0)
    # An event a fresh run never prints: nothing to aim at (reported as unreachable, not a failure).
    empty = RunPhase(bindings=2)
    empty.saw("opened", 1.0)
    empty.ended = 2.0
    assert drill.fit(Plan("random", trigger="committed", occurrence=1, delay=0.5), empty) is None


def test_workdir_must_be_empty(tmp_path: Path) -> None:
    cfg_path = pipeline(tmp_path)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    result = run_cli("drill", "--config", str(cfg_path), "--workdir", str(tmp_path / "busy"), timeout=60, jvm=False)
    assert result.returncode == 2 and "not empty" in result.stderr


# --- the drills (real subprocesses, real kills) ------------------------------------------------


def _drill(tmp_path: Path, cfg_path: Path, *args: str, timeout: float = 3600) -> tuple[Any, dict[str, Any]]:
    """Run ``materializer drill``; on timeout SIGTERM it, so it kills its own runs and JVMs first."""
    require_subprocess_tier("a drill runs the CLI and its JVMs")
    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "materializer_cli", "drill", "--config", str(cfg_path), "--workdir", str(tmp_path / "work"),
            "--report", str(report), *args]
    env = {k: v for k, v in os.environ.items() if k != crash.ENV}
    # A kill inside the first epoch's CREATE leaves files without a commit; the next run waits for
    # another creator's commit before it creates over them (120 s by default). The drill's scratch
    # tables have no other creator: a short wait still takes that path without sitting it out.
    env.setdefault(CREATION_WAIT_ENV, "3")
    # Spark's scratch folders of every process of the drill: the SIGKILLed runs' must not stay behind.
    scratch = tmp_path / "spark-scratch"
    scratch.mkdir()
    env["SPARK_LOCAL_DIRS"] = str(scratch)
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"drill did not finish in {timeout:.0f}s:\n{stdout}\n{stderr[-3000:]}")
    result = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    assert report.exists(), result.stdout + result.stderr
    # (the drill's own JVM, if it started one, removes its folder as it exits, a moment after the drill)
    deadline = time.monotonic() + 60
    while any(scratch.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(p.name for p in scratch.iterdir()) == [], "a run's Spark scratch folder was left behind"
    return result, json.loads(report.read_text())


def _assert_clean(data: dict[str, Any]) -> None:
    assert data["rows"] == {"lost": 0, "duplicated": 0, "wrong": 0}
    for rnd in data["rounds"]:
        assert rnd["problems"] == [] and rnd["orphans"] == []
        for table in rnd["tables"]:
            assert table["verified"] and table["epochs_applied_twice"] == [] and table["epochs_missing"] == []
            assert table["recorded_epoch"] == table["expected_epoch"] == rnd["last_epoch"]


@pytest.mark.slow
@pytest.mark.crash
def test_short_drill_kills_inside_spark_jobs_and_at_random(tmp_path: Path) -> None:
    """The default run's drill: a SIGKILL inside a MERGE's Spark job and inside a load's, chained,
    then a random kill and the drain (4 runs of the CLI).

    On a fresh pipeline the first kill lands inside epoch 1's CREATE (files, no commit: the next run
    waits for a commit, then creates over them); the next run re-applies epoch 1 and dies loading
    current rows for epoch 2. Every other point is checked in process, with the state each one
    promises, by tests/test_crash_points.py; the drill at every point is the next test (``-m drill``).
    """
    cfg_path = pipeline(tmp_path, loads=True)
    result, data = _drill(tmp_path, cfg_path, "--points", "mid-apply", "--points", "mid-load", "--kills", "1", "--seed", "11")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["verdict"] == "pass"
    _assert_clean(data)
    assert data["kills"].get("mid-apply") == 1 and data["kills"].get("mid-load") == 1, data["kills"]
    assert sum(n for k, n in data["kills"].items() if k.startswith("random")) == 1
    assert data["unreachable"] == {}
    # Its epochs: 4 files at max_files 1 is as small as they go, so the sizes are kept, and said.
    assert data["epoch_sizes"][-1].startswith("the configured sizes kept"), data["epoch_sizes"]
    assert set(data["windows"]) == {"between two bindings' applies", "apply N while reading N+1", "between epochs"}
    assert "verdict" in result.stdout and "pass" in result.stdout
    # The drill worked on a copy: the configuration's own log, staging and tables were not created.
    assert not (tmp_path / "prod" / "log").exists() and not (tmp_path / "prod" / "tables").exists()


@pytest.mark.drill
@pytest.mark.crash
def test_short_drill_every_point_and_random_kills(tmp_path: Path) -> None:
    """One kill at every failure point (mid-load included), chained, then 2 random kills.

    11 runs of the CLI (8 points, 2 random kills, the drain): about 3 minutes on 2 idle cores, so
    ``-m drill``; the default run has the kills inside Spark jobs (above) and every point in process.
    """
    cfg_path = pipeline(tmp_path, loads=True)
    result, data = _drill(tmp_path, cfg_path, "--kills", "2", "--seed", "11")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["verdict"] == "pass"
    _assert_clean(data)
    assert all(data["kills"].get(p) == 1 for p in crash.POINTS), data["kills"]
    assert sum(n for k, n in data["kills"].items() if k.startswith("random")) == 2
    assert data["unreachable"] == {}
    assert not (tmp_path / "prod" / "log").exists() and not (tmp_path / "prod" / "tables").exists()


@pytest.mark.slow
@pytest.mark.crash
def test_zombie_is_fenced_and_tables_stay_right(tmp_path: Path) -> None:
    cfg_path = pipeline(tmp_path, files=2)
    result, data = _drill(tmp_path, cfg_path, "--scenario", "zombie", "--seed", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    zombie = [r for r in data["runs"] if r["kind"] == "zombie"]
    assert len(zombie) == 1 and zombie[0]["exit_code"] == 4 and zombie[0]["outcome"] == "fenced"
    assert "fenced" in zombie[0]["error"]
    _assert_clean(data)


@pytest.mark.drill
@pytest.mark.crash
def test_damage_is_never_skipped_and_recover_repairs_it(tmp_path: Path) -> None:
    """A torn log entry and a truncated staged file: the run stops (exit 5 / 6), recover repairs.

    Seven CLI runs: ``-m drill``. The default run checks the same two damages in process
    (tests/test_damage.py); ``test_damage_all_kinds`` below does all four through the CLI."""
    cfg_path = pipeline(tmp_path, files=3)
    result, data = _drill(tmp_path, cfg_path, "--scenario", "damage", "--damage", "torn-log", "--damage", "truncated-staged")
    assert result.returncode == 0, result.stdout + result.stderr
    failed = [r for r in data["runs"] if r["plan"].startswith("after ")]
    assert [r["exit_code"] for r in failed] == [5, 6]
    assert [r["outcome"] for r in data["runs"] if r["kind"] == "recover"] == ["finished", "finished"]
    _assert_clean(data)


@pytest.mark.drill
@pytest.mark.subprocess
def test_drill_on_a_one_epoch_pipeline_passes(tmp_path: Path) -> None:
    """Issue #11 item 12: every document in one epoch. Random kills planned after a second commit
    or read used to end "never reached, even on a fresh pipeline" and FAIL with 0 rows wrong."""
    cfg_path = pipeline(tmp_path, files=1, per_file=10, max_documents=1000)
    # seed 6 plans kills after "committed #2" and "read #2", which a one-epoch pipeline never has
    plans = Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "plan", kills=4, seed=6, points=[])).plans()
    assert any(p.occurrence == 2 for p in plans), plans
    result, data = _drill(tmp_path, cfg_path, "--kills", "4", "--seed", "6", "--points", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["verdict"] == "pass" and data["problems"] == []
    _assert_clean(data)
    assert data["kills_total"] + len(data["missed"]) + len(data["unreachable"]) == 4
    assert data["kills_total"] >= 2


@pytest.mark.drill
@pytest.mark.subprocess
def test_damage_all_kinds(tmp_path: Path) -> None:
    # Each damage takes an epoch of its own, from the second on: five files, one an epoch.
    cfg_path = pipeline(tmp_path, files=5)
    result, data = _drill(tmp_path, cfg_path, "--scenario", "damage")
    assert result.returncode == 0, result.stdout + result.stderr
    failed = [r for r in data["runs"] if r["plan"].startswith("after ")]
    assert [r["exit_code"] for r in failed] == [5, 5, 6, 6]
    _assert_clean(data)


@pytest.mark.drill
@pytest.mark.subprocess
def test_long_drill_random_kills(tmp_path: Path) -> None:
    """``pytest -m drill``: 30 random kills over rounds of a bigger collection, on another seed."""
    cfg_path = pipeline(tmp_path, files=10, per_file=20, keys=40, seed=99, max_documents=8)
    result, data = _drill(tmp_path, cfg_path, "--kills", "30", "--seed", "2024", "--points", "none", timeout=4 * 3600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["kills_total"] >= 30
    _assert_clean(data)


def _neighbours_drill(tmp_path: Path, seed: int, *actions: str) -> dict[str, Any]:
    """A neighbours drill (a random kill, the drain) with ``actions``; its report, checked: the
    verification passed, no run stopped, and the maintenance really ran, its versions in the
    tables' history (read by delta-rs, not the Spark that made them), whose rows, read by delta-rs
    too, equal the oracle."""
    from deltalake import DeltaTable

    from materializer.config import load_config
    from tests.helpers import delta_rs_list

    cfg_path = pipeline(tmp_path, files=4)
    chosen = [arg for action in actions for arg in ("--maintenance", action)]
    result, data = _drill(tmp_path, cfg_path, "--scenario", "neighbours", "--points", "none", "--kills", "1", "--seed", str(seed), *chosen)
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["verdict"] == "pass" and data["problems"] == [], data["problems"]
    _assert_clean(data)
    assert data["maintenance_stops"] == [] and data["maintenance_counts"]["pipeline stops"] == 0
    assert data["maintenance_plan"]["seed"] == seed and data["maintenance_plan"]["actions"] == list(actions)
    done = [m for m in data["maintenance"] if m["outcome"] == "done"]
    assert done, data["maintenance"]
    made: set[str] = set()
    for action in done:
        history = {h["version"]: h for h in DeltaTable(action["table"]).history()}
        for version in action["versions"]:
            assert history[version].get("userMetadata") == f"materializer-drill maintenance #{action['index']}", history[version]
            made.add(history[version]["operation"])
    assert made & {"OPTIMIZE", "VACUUM START", "VACUUM END"}, done
    last = load_config(tmp_path / "work" / f"round-{data['rounds'][-1]['round']:03d}" / "pipeline.yaml")
    for name, expected in oracle.expected_all(last).items():
        cmp = oracle.compare(expected, delta_rs_list(last.binding(name).table), last.binding(name).key)
        assert cmp.ok, f"{name} read by delta-rs: lost {cmp.lost}, duplicated {cmp.duplicated}, wrong {cmp.wrong}"
    assert "pipeline stops after maintenance" in result.stdout
    return data


@pytest.mark.slow
@pytest.mark.crash
def test_neighbours_drill_maintenance_beside_the_kills_changes_no_row(tmp_path: Path) -> None:
    """Issue #67: OPTIMIZE, ZORDER and VACUUM RETAIN 0 HOURS at the seed's random times, from the
    drill's own JVM, while the pipeline is killed and restarted: no run stops, no row changes, and
    the maintenance made versions of its own in the tables. (Plain VACUUM and auto compaction are
    in the ``-m drill`` run below: the short one takes the actions that rewrite or delete files.)"""
    _neighbours_drill(tmp_path, 5, "optimize", "zorder", "vacuum-0")


@pytest.mark.drill
@pytest.mark.crash
def test_neighbours_drill_every_maintenance(tmp_path: Path) -> None:
    _neighbours_drill(tmp_path, 8, "optimize", "zorder", "vacuum", "vacuum-0", "auto-compact")


def test_the_neighbours_schedule_is_the_seeds_and_bad_actions_are_refused(tmp_path: Path) -> None:
    import itertools

    from materializer.tools.drill import DrillError, DrillReport, MAINTENANCE, check_operations, schedule

    first = list(itertools.islice(schedule(4, list(MAINTENANCE)), 20))
    assert first == list(itertools.islice(schedule(4, list(MAINTENANCE)), 20))
    assert first != list(itertools.islice(schedule(5, list(MAINTENANCE)), 20))
    assert {p.operation for p in itertools.islice(schedule(4, ["vacuum"]), 10)} == {"vacuum"}
    assert check_operations(None) == list(MAINTENANCE)
    with pytest.raises(DrillError, match="--maintenance defrag: unknown"):
        check_operations(["optimize", "defrag"])
    # A seed's kill plan is the kills scenario's: the schedule draws from a random of its own.
    cfg_path = pipeline(tmp_path)
    kills = Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "a", kills=3, seed=4)).plans()
    assert Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "b", kills=3, seed=4, scenario="neighbours")).plans() == kills
    with pytest.raises(DrillError, match="for --scenario neighbours"):
        Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "c", maintenance=["optimize"]))
    # A run that stopped beside maintenance fails the drill, whatever the tables say.
    report = DrillReport(scenario="neighbours", config="c", workdir="w", seed=1, started_at="t")
    from materializer.tools.drill import Verification

    report.rounds.append(Verification(round=1))
    report.rounds[0].tables = []
    report.maintenance_stops.append({"run": 2, "after": 3})
    assert report.verdict == "FAIL" and report.to_json()["maintenance_counts"]["pipeline stops"] == 1
    for bad, said in ((["--scenario", "neighbours", "--maintenance", "defrag"], "--maintenance must be one or more of"),
                      (["--maintenance", "optimize"], "--maintenance is for --scenario neighbours")):
        result = run_cli("drill", "--config", str(cfg_path), *bad, timeout=60, jvm=False)
        assert result.returncode == 2 and said in result.stderr, result.stderr


def test_a_zombie_whose_apply_fails_is_told_it_is_fenced(tmp_path: Path) -> None:
    """The zombie drill's finding: a paused run whose staged files the newer run applied and
    deleted must stop as fenced (exit 4), not with Spark's file-not-found."""
    from materializer.errors import FencedError
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    store = open_store(str(tmp_path / "log"))
    zombie, newer = RecoveryLog(store, "p", writer="zombie"), RecoveryLog(store, "p", writer="newer")
    zombie.open()
    zombie.check_not_fenced(1, cause=FileNotFoundError("part-0.parquet"))  # not fenced: returns
    newer.open()
    with pytest.raises(FencedError, match="opened by writer newer .* applying epoch 1.*part-0.parquet"):
        zombie.check_not_fenced(1, cause=FileNotFoundError("part-0.parquet"))


def test_the_drill_chooses_epoch_sizes_that_give_a_round_five_epochs(tmp_path: Path) -> None:
    from materializer.config import load_config
    from materializer.tools.drill import epoch_sizes

    source = make_collection(tmp_path / "source", files=12, per_file=2)
    cfg = load_config(write_config(tmp_path, [binding("items", source, tmp_path / "t")]))  # max_files 1000: one epoch
    sizes = epoch_sizes(cfg, DrillOptions(config=tmp_path))
    assert sizes.max_files == 2 and sizes.max_documents is None and sizes.max_records is None
    assert sizes.notes[0] == "items: 12 document files, 1000 an epoch"
    assert sizes.notes[-1].startswith("set max_files 2 so a round has at least 5 epochs")
    assert scratch_config(cfg, tmp_path / "scratch", sizes.max_documents, sizes.max_files)["bindings"][0]["source"]["max_files"] == 2
    # Told otherwise, it keeps what it was told; sizes that already give enough epochs are kept.
    assert epoch_sizes(cfg, DrillOptions(config=tmp_path, max_files=6)).max_files == 6
    assert epoch_sizes(cfg, DrillOptions(config=tmp_path, min_epochs=1)).max_files is None
    small = load_config(write_config(tmp_path, [binding("items", source, tmp_path / "t", max_files=1)]))
    assert "kept" in epoch_sizes(small, DrillOptions(config=tmp_path)).notes[-1]


def test_a_kill_is_counted_in_the_window_it_fell_in() -> None:
    from materializer import events
    from materializer.tools.drill import BETWEEN_BINDINGS, BETWEEN_EPOCHS, OVERLAP, DrillReport, RunRecord, RunPhase

    phase = RunPhase(bindings=2)
    steps = [
        (events.Committed(epoch=1, documents=2, at="now"), ""),
        (events.SpanStarted(name="read", epoch=2, binding="a"), OVERLAP),
        (events.Applied(binding="a", table="t", status="applied", epoch=1), BETWEEN_BINDINGS),
        (events.Applied(binding="b", table="u", status="applied", epoch=1), BETWEEN_EPOCHS),
    ]
    for event, window in steps:
        phase.feed(0.0, event)
        assert phase.window == window, (event, phase.phase)
    report = DrillReport(scenario="kills", config="c", workdir="w", seed=0, started_at="now")
    report.runs = [
        RunRecord(round=1, index=1, plan="p", kind="random", point=None, exit_code=-9, outcome="killed", window=OVERLAP),
        RunRecord(round=1, index=2, plan="p", kind="point", point="after-apply", exit_code=-9, outcome="killed", window=BETWEEN_BINDINGS),
        RunRecord(round=1, index=3, plan="p", kind="point", point="mid-apply", exit_code=0, outcome="finished"),
    ]
    assert report.windows() == {BETWEEN_BINDINGS: 1, OVERLAP: 1, BETWEEN_EPOCHS: 0}  # 0: never hit
    report.unreachable = {BETWEEN_BINDINGS: "the pipeline has one binding"}
    assert report.windows()[BETWEEN_BINDINGS] == "the pipeline has one binding"


def test_a_kill_in_the_re_apply_at_open_is_counted_in_its_window() -> None:
    """A restarted run re-applies the last committed epoch before it commits one of its own (the
    Connect drill's runs spend half their time there): a kill with one of its tables re-applied and
    not the other is between two bindings' applies, and with the next epoch's read under way it is
    the overlap window; neither was counted (the run had no Committed event yet)."""
    from materializer import events
    from materializer.tools.drill import BETWEEN_BINDINGS, BETWEEN_EPOCHS, OVERLAP, RunPhase

    phase = RunPhase(bindings=2)
    steps = [
        (events.Opened(pipeline="p", epoch=4, writer="w"), ""),
        (events.SpanStarted(name="read", epoch=5, binding="a"), OVERLAP),
        (events.Applied(binding="a", table="t", status="skipped", epoch=4), BETWEEN_BINDINGS),
        (events.Applied(binding="b", table="u", status="applied", epoch=4), BETWEEN_EPOCHS),
        (events.Committed(epoch=5, documents=2, at="now"), ""),
    ]
    for event, window in steps:
        phase.feed(0.0, event)
        assert phase.window == window, (event, phase.phase)
    assert phase.committed == [5]  # what the run itself committed to the log, as before
    fresh = RunPhase(bindings=2)
    fresh.feed(0.0, events.Opened(pipeline="p", epoch=0, writer="w"))  # nothing committed yet: nothing to re-apply
    assert fresh.window == "" and not fresh.applying


def test_the_apply_window_is_measured_when_the_next_read_overlaps_it() -> None:
    """Random kills after 'committed' are spread over the apply window measured so far; the next
    epoch's read starts during the apply (and ends long before a MERGE does), and the window was
    only measured when no read had begun: never, so every such kill fell in the first second of
    the first table's MERGE and none between two bindings' applies (a 3-binding Connect drill)."""
    from materializer import events
    from materializer.tools.drill import RunPhase

    phase = RunPhase(bindings=2)
    phase.feed(0.0, events.Committed(epoch=1, documents=2, at="now"))
    phase.feed(1.0, events.Read(epoch=2, binding="a", documents=2, extent="f", seconds=1.0, at="now"))
    phase.feed(5.0, events.Applied(binding="a", table="t", status="applied", epoch=1))
    phase.feed(10.0, events.Applied(binding="b", table="u", status="applied", epoch=1))
    assert phase.apply_windows == [10.0]


def test_a_drill_cut_short_says_so_in_its_table(tmp_path: Path) -> None:
    """`kill -USR1` drains and reports the kills made; the printed table said nothing of the cut,
    so '3 random kills, pass' of a 1000-kill drill read like a finished one."""
    import io

    from rich.console import Console

    from cli.drill import _print_report
    from materializer.tools.drill import DrillReport, RunRecord

    report = DrillReport(scenario="kills", config="c", workdir="w", seed=7, started_at="now", planned_kills=1008, stopped_early=True)
    report.runs = [RunRecord(round=1, index=i, plan="p", kind="random", point=None, exit_code=-9, outcome="killed", landed="apply") for i in (1, 2, 3)]
    out = io.StringIO()
    _print_report(report, Console(file=out, width=200))
    assert "stopped early (SIGUSR1)" in out.getvalue() and "3 of 1008 planned kills" in out.getvalue(), out.getvalue()
    assert report.to_json()["planned_kills"] == 1008


# --- a round that a failed run stopped ------------------------------------------------------------


@pytest.mark.spark
def test_a_round_a_failed_run_stopped_counts_no_rows_lost_after_the_error(spark: Any, tmp_path: Path) -> None:
    """A drill on input the pipeline refuses reported the rows after the error as lost, beside the
    run's error; they were never applied, not lost. Such a round is verified as far as the
    pipeline got: its tables are 'not verified' against the oracle (which folds all of the input)
    and no row is counted lost or wrong; what an error cannot explain is still checked."""
    from materializer.config import load_config
    from materializer.errors import SourceError
    from materializer.runtime import Runtime
    from materializer.tools.drill.verification import verify

    source = make_collection(tmp_path / "source", files=3, per_file=10, keys=6)
    with (source / "part-002.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": 1, "n": 99, "name": "x", "score": 1.0, "colour": "red"}) + "\n")
    (tmp_path / "prod").mkdir()
    schema = "id BIGINT, n BIGINT, name STRING, score DOUBLE"
    path = write_config(tmp_path / "prod", [binding("items", source, tmp_path / "prod" / "tables" / "items", max_files=1, schema=schema)], pipeline_id="stopped")
    config = load_config(path)
    with pytest.raises(SourceError, match="colour"):
        Runtime(config, spark).run()  # epochs 1 and 2 applied; the third file is refused

    counted = verify(config, spark)  # as the drill verified such a round
    assert counted.tables[0].counts.get("lost", 0) + counted.tables[0].counts.get("wrong", 0) > 0
    stopped_by = "run 1 failed (exit 7) before the sources drained"
    stopped = verify(config, spark, stopped_by=stopped_by)
    table = stopped.tables[0]
    assert not table.verified and table.reason.startswith(stopped_by), table.reason
    assert not table.lost and not table.wrong and set(table.counts) <= {"duplicated"}, table.counts
    assert table.recorded_epoch == 2 and table.history_epochs == 2
    assert stopped.problems == [] and stopped.verdict == "not verified" and stopped.stopped_by == stopped_by

    # A bad line the oracle cannot read either: the round is not verified, the drill does not crash.
    with (source / "part-002.jsonl").open("a") as handle:
        handle.write("{not json\n")
    with pytest.raises(SourceError):
        verify(config, spark)
    unread = verify(config, spark, stopped_by=stopped_by)
    assert not unread.tables[0].verified and "cannot read the input" in unread.tables[0].reason


@pytest.mark.spark
def test_a_round_of_a_fleet_verifies_every_table_its_templates_made(spark: Any, tmp_path: Path) -> None:
    """A round's verification looked at the declared bindings only: a pipeline of templates had
    its tables unread and its round said "pass". Now each binding the last committed epoch covers
    is verified (its rows by delta-rs, its history, its txn version), in the scratch copy's places;
    and a binding's dead letters are left out of the oracle's fold (the oracle stopped the drill on
    the first line it could not read), each of them once in its dead-letter table."""
    from materializer.config import load_config
    from materializer.runtime import open_runtime
    from materializer.tools.drill.verification import verify

    for folder in ("eu", "us"):
        make_collection(tmp_path / "land" / folder, files=2, per_file=5, keys=4, seed=ord(folder[0]))
    bad = tmp_path / "land" / "us" / "part-000.jsonl"
    with bad.open("a") as handle:
        handle.write('{"id": 1, "n": \n')  # line 6: set aside as a dead letter
    cfg = load_config(write_config(tmp_path, [], pipeline_id="fleet", templates=[
        {"source": {"format": "documents", "folders_in": str(tmp_path / "land")}, "name": "orders_{folder}",
         "table": str(tmp_path / "prod" / "{folder}"), "key": ["id"], "view": "default.orders_{folder}_live",
         "on_invalid": "dead_letter", "dead_letter_table": str(tmp_path / "prod" / "rejects")}
    ]))
    scratch = parse_config(scratch_config(cfg, tmp_path / "round", max_files=1), "scratch")
    assert open_runtime(scratch, spark).run().last_epoch == 2
    checked = verify(scratch, spark, reader="deltalake")
    assert [t.binding for t in checked.tables] == ["orders_eu", "orders_us"]
    assert all(t.verified and t.expected_rows > 0 and t.recorded_epoch == 2 for t in checked.tables), checked.tables
    assert all(t.table.startswith(str(tmp_path / "round")) for t in checked.tables)
    assert checked.problems == [] and checked.verdict == "pass"  # the bad line: in the dead letters, not the fold
    by_spark = verify(scratch, spark, reader="spark")  # the dead letters read by Spark: the same verdict
    assert by_spark.problems == [] and by_spark.verdict == "pass" and len(by_spark.tables) == 2
    assert not (tmp_path / "prod").exists() and "orders_eu_live" not in [t.name for t in spark.catalog.listTables("default")]
    # A bad line that is in neither table is a document lost (here: written after the run).
    with bad.open("a") as handle:
        handle.write("{oops\n")
    lost = verify(scratch, spark, reader="deltalake")
    assert lost.verdict == "FAIL" and "orders_us: a document neither landed nor set aside" in lost.problems[0], lost.problems
    assert "part-000.jsonl:7" in lost.problems[0]


def test_a_drill_passes_the_failed_run_to_its_rounds_verification_and_its_table_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drill's side: a drain that fails marks the round's verification (and only that round's),
    and the printed table says the round's rows were not counted."""
    import io

    from rich.console import Console

    from cli.drill import _print_report
    from materializer.tools.drill import RunRecord, scenarios
    from materializer.tools.drill.verification import Verification

    cfg_path = pipeline(tmp_path)
    the_drill = Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "work", kills=0, points=[]), None)
    the_drill.new_round()
    seen: list[str] = []

    def fake_verify(config: Any, spark: Any, round_no: int = 1, reader: str = "spark", *, stopped_by: str = "") -> Verification:
        seen.append(stopped_by)
        return Verification(round=round_no, stopped_by=stopped_by)

    monkeypatch.setattr(scenarios, "verify", fake_verify)
    monkeypatch.setattr(Drill, "spark", lambda self: None)
    failed = RunRecord(round=1, index=1, plan="drain", kind="drain", point=None, exit_code=7, outcome="failed", error="bad input")
    monkeypatch.setattr(Drill, "run", lambda self, plan, extra_args=(): failed)
    assert the_drill.drain() is False
    the_drill.verify_round()
    the_drill.verify_round()
    assert seen == ["run 1 failed (exit 7) before the sources drained", ""]
    out = io.StringIO()
    _print_report(the_drill.report, Console(file=out, width=200))
    assert "round 1: rows lost / wrong not counted" in out.getvalue() and "run 1 failed (exit 7)" in out.getvalue(), out.getvalue()
    assert the_drill.report.verdict == "FAIL"


def test_a_drill_stopped_early_is_resumed_with_the_rest_of_its_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--resume``: the second sitting makes exactly the kills the first one did not (the seed's
    plan, from where it stopped), in the same workdir on new rounds, and the report counts both
    sittings; its printed table says so. Runs and verification are faked (no JVM): what is tested
    is which kills each sitting makes and what the one report says."""
    import io

    from rich.console import Console

    from cli.drill import _print_report
    from materializer.tools.drill import DrillError, Plan, RunRecord, TableCheck, Verification

    cfg_path = pipeline(tmp_path)
    points = ["after-log-commit", "mid-apply"]
    made: list[list[str]] = [[]]

    def fake_run(self: Drill, plan: Plan, extra_args: tuple[str, ...] = ()) -> RunRecord:
        self._index += 1
        self._runs_in_round += 1
        drain = plan.kind == "drain"
        record = RunRecord(round=self.round_no, index=self._index, plan=plan.label, kind=plan.kind, point=plan.point,
                           exit_code=0 if drain else -9, outcome="finished" if drain else "killed", landed="" if drain else "apply")
        if not drain:
            made[-1].append(plan.label)
        self.report.runs.append(record)
        return record

    def fake_verify(self: Drill) -> Verification:
        result = Verification(round=self.round_no, last_epoch=3, tables=[TableCheck(binding="docs", table="t", verified=True)])
        self.report.rounds.append(result)
        return result

    monkeypatch.setattr(Drill, "run", fake_run)
    monkeypatch.setattr(Drill, "verify_round", fake_verify)
    whole = Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "whole", kills=9, seed=5, points=points), None).plans()
    assert len(whole) == 11

    report_path = tmp_path / "drill.json"
    first = Drill(DrillOptions(config=cfg_path, workdir=tmp_path / "work", kills=9, seed=5, points=points, report=report_path), None)
    ticks = [0]

    def tick() -> None:  # SIGUSR1 after the fourth kill: the kill in progress ends, then drain and verify
        ticks[0] += 1
        if ticks[0] == 4:
            first.stop_requested = True

    stopped = first.execute(tick)
    assert stopped.stopped_early and stopped.plans_done == 4 and made[0] == [p.label for p in whole[:4]]
    saved = json.loads(report_path.read_text())
    assert saved["kills_total"] == 4 and saved["planned_kills"] == 11 and saved["verdict"] == "pass"

    # A report written before the drill kept its count and plan: counted from its kills, and the
    # command line must plan what it planned.
    older = tmp_path / "older.json"
    older.write_text(json.dumps({k: v for k, v in saved.items() if k not in ("plans_done", "kill_plan", "sittings")}))
    assert Drill(DrillOptions(config=cfg_path, kills=9, points=points, resume=older), None).report.plans_done == 4
    with pytest.raises(DrillError, match="it planned 11 kills, these options plan 10"):
        Drill(DrillOptions(config=cfg_path, kills=8, points=points, resume=older), None)

    # Resumed: the plan comes from the report (its --kills and --points), not this command line.
    made.append([])
    resumed = Drill(DrillOptions(config=cfg_path, kills=1, resume=report_path), None)
    assert resumed.planned() == 11 + 1 - 4
    done = resumed.execute()
    assert made[1] == [p.label for p in whole[4:]]  # the rest of the same plan, in order, once each
    again = json.loads(report_path.read_text())
    assert (again["kills_total"], again["plans_done"], again["stopped_early"], again["verdict"]) == (11, 11, False, "pass")
    assert [s["kills"] for s in again["sittings"]] == [4, 7]
    assert [r["round"] for r in again["rounds"]] == [1, 2] and (tmp_path / "work" / "round-002").is_dir()
    indices = [r["index"] for r in again["runs"]]
    assert indices == sorted(set(indices))  # run numbers go on; no log file of the first sitting is overwritten
    out = io.StringIO()
    _print_report(done, Console(file=out, width=200))
    assert "sittings (resumed)" in out.getvalue() and "4 kills from" in out.getvalue(), out.getvalue()

    # Nothing left to resume; and a report whose drill made its whole plan is refused by name.
    with pytest.raises(DrillError, match="was not stopped early"):
        Drill(DrillOptions(config=cfg_path, resume=report_path), None)
