"""The pipeline on a real Spark Connect server (tests/connect_server.py), as on Databricks.

Spark Connect is what Databricks serverless jobs and standard-access clusters give a Python
program: no ``sparkContext``, no ``newSession``, no JVM in the client. The same scenarios as the
classic tests (standard and delta-updates modes, replays skipped, reductions with loads) run here
in-process on a Connect session, and one real SIGKILL inside the MERGE of a ``--remote`` CLI run.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from materializer.config import load_config
from materializer.delta import TXN_APP_ID, TableRef, history, table_state
from materializer.progress import ListCollector
from materializer.runtime import Runtime
from tests.random_collections import generate
from tests.connect_server import ConnectServer
from tests.helpers import REPO, assert_tables_equal_oracle, binding, delta_rs_list, run_cli, table_rows, write_config, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.connect]


def epochs(spark: Any, table: Path) -> list[int]:
    return [h["tag"]["epoch"] for h in history(spark, TableRef(str(table))) if h["tag"]]


def test_the_session_is_a_connect_one_and_the_code_never_reaches_for_the_jvm(connect_spark: Any) -> None:
    from materializer.spark import is_connect

    assert is_connect(connect_spark)
    with pytest.raises(Exception, match="JVM_ATTRIBUTE_NOT_SUPPORTED|not supported"):
        connect_spark.sparkContext  # noqa: B018 - what the old code called on every apply
    offenders = []
    for path in sorted((REPO / "materializer").rglob("*.py")):
        if path.parent.name in ("bench", "drill") and path.parent.parent.name == "tools":
            continue  # tools' packages; their classic-only extras are guarded
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\bsparkContext\b|_jdt|\._jvm\b|py4j|delta\.tables|newSession\(\)", code) and "``" not in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    # isolated_session's newSession() is the classic branch, behind is_connect; end_jvm resets
    # PySpark's handle of the local JVM it launched and waited for (none on Connect: no gateway);
    # build_session sets a secret's Hadoop settings in the local JVM it has just started.
    allowed = ("spark.newSession()", "SparkContext._jvm = None", "session.sparkContext._jsc.hadoopConfiguration()")
    assert [o for o in offenders if not any(a in o for a in allowed)] == []


def test_standard_and_delta_updates_equal_the_oracle_and_a_rerun_is_skipped(connect_spark: Any, tmp_path: Path) -> None:
    spark = connect_spark
    events = ListCollector()
    docs = generate(tmp_path / "src", seed=1, documents=90, keys=20, files=3)
    config = load_config(
        write_config(
            tmp_path,
            [
                # One file per epoch: the documents source takes whole files (30 documents each).
                binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1, view="default.items_live"),
                binding("items_log", tmp_path / "src", tmp_path / "tables" / "items_log", mode="delta_updates", max_files=1),
            ],
            max_documents=30,
        )
    )
    runtime = Runtime(config, spark, events)
    # cloneSession (pyspark 4.1+): the txn confs live apart; pyspark 4.0's client shares the session.
    assert (runtime.driver.apply_spark is not spark) == hasattr(spark, "cloneSession")
    summary = runtime.run()
    assert summary.last_epoch == 3
    assert_tables_equal_oracle(spark, config)
    for table in ("items", "items_log"):
        assert epochs(spark, tmp_path / "tables" / table) == [1, 2, 3]
        assert table_state(spark, TableRef(str(tmp_path / "tables" / table)), config.pipeline_id).txn_version == 3
    assert [e["status"] for e in events.named("applied")] == ["applied"] * 6
    # The live-row view, made over Connect in the server's catalog, shows what delta-rs reads.
    shown = sorted(repr(sorted(r.asDict().items())) for r in spark.table("default.items_live").collect())
    assert shown == sorted(repr(sorted(r.items())) for r in delta_rs_list(tmp_path / "tables" / "items"))
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []

    # A second run re-applies the last epoch: found recorded, skipped, no new Delta version.
    version = table_state(spark, TableRef(str(tmp_path / "tables" / "items")), config.pipeline_id).version
    again = Runtime(config, spark).run()
    assert again.epochs == [] and again.reapplied is not None
    assert [r.status for r in again.reapplied.results] == ["skipped", "skipped"]
    assert table_state(spark, TableRef(str(tmp_path / "tables" / "items")), config.pipeline_id).version == version

    # A following run's read ahead of a table's snapshot (in a session cloned for it) works over Connect.
    from materializer.merge import SnapshotWarmer

    warmer = SnapshotWarmer(events)
    warmer.warm(spark, TableRef(str(tmp_path / "tables" / "items")), 3, "items")
    warmer.close()
    assert [(e["epoch"], e["ok"]) for e in events.named("span") if e["name"] == "warm_snapshot"] == [(3, True)]


@pytest.mark.slow
def test_a_forced_replay_merge_is_skipped_by_delta_and_the_txn_confs_stay_in_the_apply_session(
    connect_spark: Any, tmp_path: Path
) -> None:
    from materializer.protocol import Acknowledge
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store

    spark = connect_spark
    generate(tmp_path / "src", seed=4, documents=30, keys=10, files=1)
    config = load_config(write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")], max_documents=30))
    runtime = Runtime(config, spark)
    runtime.run()
    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    assert entry is not None and entry.driver_checkpoint is not None
    table = TableRef(str(tmp_path / "tables" / "items"))
    version = table_state(spark, table, config.pipeline_id).version
    driver = runtime.driver
    source = driver.apply_spark.createDataFrame([(999, "x", "u")], "id long, name string, _op string")
    props = driver.writer.properties(config.bindings[0].name, entry.epoch)
    with driver.writer.transaction(props):
        # Set on the apply session only: other work on the main session commits under no txn id.
        assert driver.apply_spark.conf.get(TXN_APP_ID) == config.pipeline_id
        if hasattr(spark, "cloneSession"):
            assert spark.conf.get(TXN_APP_ID, None) is None
        assert driver.writer.write(config.bindings[0], table, props, source, True) is None  # Delta skipped it
    result = driver.acknowledge(Acknowledge(epoch=entry.epoch, driver_checkpoint=entry.driver_checkpoint))
    assert [r.status for r in result.results] == ["skipped"]
    assert table_state(spark, table, config.pipeline_id).version == version
    assert (999,) not in table_rows(spark, tmp_path / "tables" / "items", ["id"])


@pytest.mark.slow
def test_reductions_with_loads(connect_spark: Any, tmp_path: Path) -> None:
    spark = connect_spark
    docs = [{"counter": f"c{i % 3}", "n": i, "hits": 1} for i in range(12)]
    for part in range(3):  # one file per epoch (the documents source takes whole files)
        write_jsonl(tmp_path / "src" / f"counters-{part}.jsonl", docs[4 * part : 4 * part + 4])
    rules = {"n": "sum", "hits": "sum"}
    events = ListCollector()
    config = load_config(
        write_config(tmp_path, [binding("counters", tmp_path / "src", tmp_path / "counters", key=["counter"], reductions=rules, max_files=1)], max_documents=4)
    )
    Runtime(config, spark, events).run()
    assert len(events.named("load")) >= 2  # epochs 2 and 3 load the current sums
    rows = {r["counter"]: (r["n"], r["hits"]) for r in spark.read.format("delta").load(str(tmp_path / "counters")).collect()}
    expected: dict[str, tuple[int, int]] = {}
    for d in docs:
        n, hits = expected.get(d["counter"], (0, 0))
        expected[d["counter"]] = (n + d["n"], hits + 1)
    assert rows == expected
    assert epochs(spark, tmp_path / "counters") == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.crash
def test_cli_on_connect_killed_mid_merge_restarts_to_the_oracle(
    connect_server: ConnectServer, connect_spark: Any, tmp_path: Path
) -> None:
    """A real SIGKILL of ``materializer run --remote`` while the server runs the MERGE of epoch 2."""
    spark = connect_spark
    docs = generate(tmp_path / "src", seed=11, documents=60, keys=20, files=3)
    config = write_config(
        tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1)], max_documents=20
    )
    table = TableRef(str(tmp_path / "tables" / "items"))
    killed = run_cli("run", "--config", str(config), "--remote", connect_server.url, env={"MATERIALIZER_CRASH_AT": "mid-apply:2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    # Killed inside the MERGE: its data files were being written, nothing was committed.
    assert table_state(spark, table, "test-pipeline").txn_version == 1
    assert epochs(spark, tmp_path / "tables" / "items") == [1]
    written = {p for p in (tmp_path / "tables" / "items").glob("*.parquet")}
    assert written, "no data files at all"

    final = run_cli("run", "--config", str(config), "--remote", connect_server.url, "--json")
    assert final.returncode == 0, final.stderr[-3000:]
    summary = json.loads(final.stdout)
    assert summary["opened_at_epoch"] == 2 and summary["last_epoch"] == 3
    assert_tables_equal_oracle(spark, config)
    assert epochs(spark, tmp_path / "tables" / "items") == [1, 2, 3]  # epoch 2 applied once, by the restart
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []


@pytest.mark.slow
def test_an_old_clients_merge_still_running_when_the_restart_reapplies_its_epoch_lands_once(
    connect_spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Spark Connect the driver that dies is only the client: its MERGE of epoch N runs on in the
    server while the restarted run opens the log and re-applies N. Here the old client's apply of
    epoch 2 starts the moment the restart's MERGE of epoch 2 does: each on its own server session,
    both tagged with epoch 2. Exactly one commit of epoch 2 lands, the table equals the oracle, the
    old client is fenced, and no staged file is left behind."""
    import threading

    from materializer.errors import FencedError
    from materializer.events import Collector, Event, SpanStarted
    from materializer.protocol import Acknowledge
    from materializer.recovery_log import RecoveryLog
    from materializer.storage import open_store
    from tests.helpers import InProcessCrash

    spark = connect_spark
    generate(tmp_path / "src", seed=7, documents=60, keys=20, files=2)
    config = load_config(write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items", max_files=1)]))
    crash = InProcessCrash(monkeypatch, "after-log-commit:2")
    old = Runtime(config, spark)
    frozen = crash.run(old.run)  # epoch 2 committed to the log, not applied: the old client "dies" here
    crash.disarm()
    entry = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read().last_commit
    assert entry is not None and entry.epoch == 2 and entry.driver_checkpoint is not None

    restart_merging = threading.Event()

    class StartsTheOldMerge(Collector):
        def emit(self, event: Event) -> None:
            if isinstance(event, SpanStarted) and event.name == "merge" and event.epoch == 2:
                restart_merging.set()

    outcome: dict[str, Any] = {}

    def old_apply() -> None:
        restart_merging.wait(300)
        try:
            outcome["results"] = old.driver.acknowledge(Acknowledge(epoch=2, driver_checkpoint=entry.driver_checkpoint)).results
        except Exception as exc:  # noqa: BLE001 - what the old client met is the point of the test
            outcome["error"] = exc

    old_thread = threading.Thread(target=old_apply, name="old-client-apply", daemon=True)
    old_thread.start()
    summary = Runtime(config, spark, StartsTheOldMerge()).run()
    old_thread.join(300)
    crash.thaw()
    frozen.join(60)
    assert restart_merging.is_set() and not old_thread.is_alive()
    assert summary.opened_at_epoch == 2 and summary.last_epoch == 2
    # Two MERGEs of epoch 2 ran at once: one commit of it landed; the other was skipped (Delta's
    # txn record), lost its commit to the first, or was fenced, and wrote nothing.
    assert epochs(spark, tmp_path / "tables" / "items") == [1, 2]
    # The old client never acknowledges: fenced after its apply, or stopped by a staged file the
    # restart had deleted once the epoch was applied.
    error = outcome.get("error")
    assert error is not None, outcome
    assert isinstance(error, FencedError) or "items" in str(error), repr(error)
    assert_tables_equal_oracle(spark, config)
    assert table_state(spark, TableRef(str(tmp_path / "tables" / "items")), config.pipeline_id).txn_version == 2
    assert [f for f in (tmp_path / "staging").rglob("*") if f.is_file()] == []


@pytest.mark.slow
@pytest.mark.crash
def test_a_drill_on_connect_kills_the_client_only_and_every_table_stays_exact(connect_server: ConnectServer, tmp_path: Path) -> None:
    """`materializer drill --remote`: every run is a Connect client, the random SIGKILLs end it
    (the server's operations run on), restarts cost a Python start; the drill chose epoch sizes
    from the six files and the tables, read by delta-rs, equal the oracle."""
    from tests.test_drill import _assert_clean, make_collection

    source = make_collection(tmp_path / "source", files=6, per_file=10)
    (tmp_path / "prod").mkdir()
    config = write_config(tmp_path / "prod", [binding("items", source, tmp_path / "prod" / "t")], pipeline_id="drill-connect")
    report = tmp_path / "report.json"
    result = run_cli(
        "drill", "--config", str(config), "--remote", connect_server.url, "--points", "none", "--kills", "3", "--seed", "3",
        "--reader", "deltalake", "--workdir", str(tmp_path / "w"), "--report", str(report),
        env={"MATERIALIZER_CREATION_WAIT_SECONDS": "3"},
    )
    assert report.exists(), result.stderr[-3000:]
    data = json.loads(report.read_text())
    assert result.returncode == 0 and data["verdict"] == "pass", (result.stdout[-3000:], result.stderr[-3000:])
    _assert_clean(data)
    assert data["kills_total"] + len(data["missed"]) == 3, data["kills"]
    assert data["epoch_sizes"][-1].startswith("set max_files 1 so a round has at least 5 epochs"), data["epoch_sizes"]
    assert "remote: sc://" in (tmp_path / "w" / "round-001" / "pipeline.yaml").read_text()
    # The killed clients' sessions (and their apply clones) were released, not left on the server.
    assert data["released_sessions"] >= data["kills_total"], data["released_sessions"]


def test_a_runs_clones_have_ids_derived_from_its_session_and_released_sessions_are_closed(
    connect_server: ConnectServer,
) -> None:
    """What lets `materializer drill --remote` free the sessions of the clients it kills: a run's
    session id can be chosen (the URL's session_id) and its apply clones' ids follow from it; a
    released session is closed on the server (a call on it fails), and releasing it again, or an id
    the server never saw, frees nothing."""
    import uuid

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from materializer.spark.connect import clone_session_id, isolated_session, release_sessions, session_ids_of, with_session_id

    session_id = str(uuid.uuid4())
    spark = ConnectSession.builder.remote(with_session_id(connect_server.url, session_id)).create()
    clones: list[Any] = []
    try:
        assert spark.session_id == session_id
        clones += [isolated_session(spark), isolated_session(spark)]
        assert [c.session_id for c in clones] == [clone_session_id(session_id, 0), clone_session_id(session_id, 1)]
        assert clones[1].range(3).count() == 3
        assert release_sessions(connect_server.url, session_ids_of(session_id)) == 3
        with pytest.raises(Exception, match="SESSION_CLOSED"):
            spark.range(1).count()
        assert release_sessions(connect_server.url, session_ids_of(session_id)) == 0
    finally:
        for client in (spark, *clones):
            client.client.close()


def test_the_test_servers_sessions_never_expire_between_connect_tests(connect_spark: Any) -> None:
    """One client session serves every Connect test of a run; a full run may pass more than an hour
    (the server's default session timeout) between two of them. With the default, the server closed
    the idle session and the txn-version tests that came last met INVALID_HANDLE.SESSION_CLOSED
    (the full run that took 80 minutes). The test server keeps sessions for ever."""
    from tests.connect_server import SESSION_TIMEOUT

    assert connect_spark.conf.get(SESSION_TIMEOUT) in ("-1", "-1ms")


SHORT_TIMEOUT_SECONDS = 10
"""The session timeout of the server of the test below (Spark's default: an hour)."""


@pytest.fixture(scope="module")
def short_timeout_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Connect server of its own that closes a session idle for SHORT_TIMEOUT_SECONDS, checked
    every second, for the test below."""
    from tests.connect_server import SESSION_TIMEOUT, start, stop

    process, server = start(
        tmp_path_factory.mktemp("short-timeout-server"),
        conf={SESSION_TIMEOUT: f"{SHORT_TIMEOUT_SECONDS}s", "spark.connect.session.manager.maintenanceInterval": "1s"},
    )
    try:
        yield server
    finally:
        stop(process)


@contextmanager
def _own_session(url: str) -> Iterator[Any]:
    """A client of its own, and the run's shared session stays the default (getOrCreate would
    return that one whatever the URL; create() makes the new one the default)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    shared = ConnectSession._get_default_session()
    session = ConnectSession.builder.remote(url).create()
    try:
        yield session
    finally:
        session.stop()  # no longer the default either
        if shared is not None:
            ConnectSession._set_default_and_active_session(shared)


@pytest.mark.slow
def test_a_run_keeps_its_connect_sessions_open_while_it_stages(
    short_timeout_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark Connect server closes a session that makes no call for its timeout (an hour by
    default; 10 s here), and the next call fails with SESSION_CLOSED. A run leaves its sessions
    idle that long while a long epoch is read and staged (the apply session; here the run's too, for
    12 s before the epoch's first call) and while ``run --follow`` has nothing to read. The runtime
    touches them on a clock (KEEP_ALIVE_SECONDS, 2 s here), whatever the loop is doing: the epoch
    applies, both sessions still answer afterwards, and a next run lands a new file.

    Beside it, over the same time, what would happen otherwise (and what the test server's
    setting above prevents): a session that makes no call for longer than the timeout is closed
    by the server, and its next call fails with SESSION_CLOSED, as the txn-version tests' calls did."""
    import time

    from materializer.runtime import Runtime, loop
    from tests.helpers import binding, table_rows, write_jsonl
    from tests.test_holes import config_with

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    monkeypatch.setattr(loop, "KEEP_ALIVE_SECONDS", 2.0)  # where Runtime.run looks it up
    # The run's session made first: the active one, as in a run (pyspark reads a setting from the
    # active session at its first function call in a process).
    with _own_session(short_timeout_server.url) as session, _own_session(short_timeout_server.url) as idle:
        assert idle.sql("SELECT 1 AS one").collect()[0]["one"] == 1  # then not a call until the end
        began = time.monotonic()
        table = tmp_path / "tables" / "items"
        write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1, "v": 1}])
        config = config_with(tmp_path, [binding("items", tmp_path / "src", table)], transaction={"max_documents": 1000})
        rt = Runtime(config, session)
        read = rt.stager.read

        def slow_read(*args: Any, **kwargs: Any) -> Any:
            time.sleep(SHORT_TIMEOUT_SECONDS + 2)  # neither session makes a call meanwhile
            return read(*args, **kwargs)

        monkeypatch.setattr(rt.stager, "read", slow_read)
        summary = rt.run(max_epochs=1)
        assert [e.epoch for e in summary.epochs if e.acknowledged is not None] == [1]
        assert session.sql("SELECT 1 AS one").collect()[0]["one"] == 1
        assert rt.driver.apply_spark.sql("SELECT 1 AS one").collect()[0]["one"] == 1  # type: ignore[attr-defined]
        write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": 2, "v": 2}])
        Runtime(config, session).run()
        assert sorted(key[0] for key in table_rows(session, table, ["id"])) == [1, 2]
        assert time.monotonic() - began > SHORT_TIMEOUT_SECONDS + 2
        with pytest.raises(Exception, match="SESSION_CLOSED"):
            idle.sql("SELECT 1 AS one").collect()
