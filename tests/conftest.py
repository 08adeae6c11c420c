"""Test tiers, and one SparkSession for every integration test of the run (JVM start-up is the slow part).

Every test belongs to one tier, chosen from what it uses, so nobody has to remember a marker:

* no marker: **unit**, no JVM at all (a Python subprocess, ``run_cli(..., jvm=False)``, is fine);
* ``spark``: the shared in-process SparkSession (the ``spark`` fixture);
* ``subprocess``: starts a JVM in another process: the CLI through ``run_cli``, a Spark Connect
  server, a Kafka broker, a standalone cluster; ``crash`` (a real SIGKILL) is one of these.

``spark``, ``connect``, ``kafka`` and ``subprocess`` are added here by fixture use; ``run_cli`` and
the unit-tier guard below fail a test that starts a JVM its markers do not admit, so a test
cannot slip into the wrong tier. Tiers: ``pytest -m "not spark and not subprocess"`` (unit),
``pytest -m "spark and not subprocess"`` (in-process), ``pytest -m subprocess``.

Runs (docs/tests.md has their times): the **quick default** ``pytest`` leaves out ``slow``, ``drill``
and ``long`` (pyproject's addopts); the **full** run, CI's, is ``pytest -m "not drill and not long" -n 2
--dist loadgroup`` (a ``-m`` on the command line replaces addopts'; two pytest-xdist workers);
``pytest -m "drill or long"`` the rest. ``slow`` is
written on a test (the quick run keeps at least one integration test of each module, one SIGKILL of
the CLI, one Connect and one Kafka round trip) and added here to every case but the first of a
parametrised integration test. Every JVM the tests start through spark-submit gets the test-only
options ``TEST_JVM_OPTIONS`` below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

# Before anything imports gRPC (Spark Connect's client): its fork handlers restart its poller in a
# forked child, which crashed the child before its exec when a worker that had run a Connect test
# started the shared session's JVM (a CI run's 281 errors, 2026-11-29; grpc issue 43055). The
# product sets the same where it opens a Connect session (materializer.spark.connect).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest  # noqa: E402
from hypothesis import settings

from tests import cds, helpers

# The servers' fixtures, defined once here for the whole run. A session fixture imported into each
# test module that uses it is a fixture of each module: pytest kept one broker per module (ten Kafka
# brokers alive at once in the full run) and one Connect server per module (three).
from tests.connect_server import _connect_session, connect_server, connect_spark  # noqa: E402,F401
from tests.kafka_broker import broker  # noqa: E402,F401
from tests.s3server import s3_bucket, s3_env, s3_server  # noqa: E402,F401

# CI draws the same examples every run (a verdict is reproducible, a red CI names a real failure);
# a developer's run draws new ones each time, and a failure prints its blob to reproduce it.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Test-only JVM options for every JVM the tests start through spark-submit: the shared in-process
# session, each CLI subprocess (run_cli inherits this environment), the Connect server; the Kafka
# broker sets the same itself (tests/kafka_broker.py). The tests' JVMs live seconds to minutes on
# tiny data: C1 alone compiles what they run sooner and at a fraction of C2's CPU, which two cores
# shared with Spark's own threads feel; the serial collector spares the parallel one's threads on
# small heaps. Users' JVMs keep the JDK's defaults (materializer.spark sets none of these). A
# developer's own SPARK_SUBMIT_OPTS wins; MATERIALIZER_TEST_JVM_OPTIONS="" turns them off (to compare).
# Not the shared in-process session's JVM: it lives the whole run (an hour for the full run) and
# runs the heaviest jobs, where C1-only code made the full run 80 min instead of 48 (the model's
# pipeline test 616 s instead of 233). So only the short-lived JVMs get them: the launcher here, each
# CLI subprocess in tests.helpers.run_cli.
TEST_JVM_OPTIONS = os.environ.get("MATERIALIZER_TEST_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
if TEST_JVM_OPTIONS:
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", TEST_JVM_OPTIONS)  # spark-class's launcher JVM

# Spark's scratch folders (`spark-<uuid>`: its block manager's files, and the jars a cluster or
# Connect session copies into its userFiles) for every JVM of this process's tests, in one folder
# removed when the run ends. Spark removes its own at a clean exit; a JVM the tests SIGKILL leaves
# them behind, and under /tmp they piled up (0.7 GB per full run while local sessions still copied
# their jars, the AWS SDK bundle among them). A developer's own SPARK_LOCAL_DIRS wins (and is left alone).
SPARK_SCRATCH: Path | None = None
if "SPARK_LOCAL_DIRS" not in os.environ:
    import tempfile

    SPARK_SCRATCH = Path(tempfile.mkdtemp(prefix="materializer-tests-spark-"))
    os.environ["SPARK_LOCAL_DIRS"] = str(SPARK_SCRATCH)


def pytest_unconfigure(config: pytest.Config) -> None:
    if SPARK_SCRATCH is not None:  # every server and session fixture has stopped by now
        import shutil

        shutil.rmtree(SPARK_SCRATCH, ignore_errors=True)

# Test-only Spark settings (tests/spark-conf/spark-defaults.conf: no generated code, no adaptive
# re-planning, Delta's log cache capped, a 3 GiB driver heap), read by spark-submit for the same JVMs
# as its --properties-file (pyspark passes PYSPARK_SUBMIT_ARGS on; tests/connect_server.py too). Not
# as SPARK_CONF_DIR: spark-submit puts that folder on the JVM's class path, and Java's class-data
# sharing refuses a class path with a non-empty folder (tests/cds.py), so SPARK_CONF_DIR is an empty one.
# A developer's own SPARK_CONF_DIR or PYSPARK_SUBMIT_ARGS wins; MATERIALIZER_TEST_SPARK_DEFAULTS=0
# leaves Spark's defaults (to compare).
SPARK_DEFAULTS = Path(__file__).parent / "spark-conf" / "spark-defaults.conf"
if os.environ.get("MATERIALIZER_TEST_SPARK_DEFAULTS", "1") != "0" and not {"SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS"} & set(os.environ):
    import shlex

    cds.EMPTY_CONF.mkdir(parents=True, exist_ok=True)
    os.environ["SPARK_CONF_DIR"] = str(cds.EMPTY_CONF)
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(str(SPARK_DEFAULTS))} pyspark-shell"

# fixture -> markers it implies
FIXTURE_TIERS: dict[str, tuple[str, ...]] = {
    "spark": ("spark",),
    "connect_server": ("connect", "subprocess"),
    "connect_spark": ("connect", "subprocess"),
    "broker": ("kafka", "subprocess"),
    "cluster": ("subprocess",),
}
JVM_TIERS = ("spark", "subprocess", "crash", "connect", "kafka")


# First of the hooks: pytest-xdist's own (in each worker) reads the xdist_group markers added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, markers in FIXTURE_TIERS.items():
            if fixture in names:
                for marker in markers:
                    if not item.get_closest_marker(marker):
                        item.add_marker(marker)
        # A SIGKILLed CLI, a Connect server, a broker: each a JVM in another process (a parametrised
        # fixture may take the Connect session by getfixturevalue, out of sight of fixturenames).
        if any(item.get_closest_marker(m) for m in ("crash", "connect", "kafka")) and not item.get_closest_marker("subprocess"):
            item.add_marker("subprocess")
        # The quick default run takes a parametrised integration test's first case; its other cases
        # are `slow` (the full run has them all): one JVM-backed check per behaviour, not per input.
        callspec = getattr(item, "callspec", None)
        if callspec is not None and any(item.get_closest_marker(m) for m in JVM_TIERS):
            if any(index != 0 for index in callspec.indices.values()) and not item.get_closest_marker("slow"):
                item.add_marker("slow")
        # Under pytest-xdist (`-n 2 --dist loadgroup`, the full run's: docs/tests.md) each worker is a process
        # with its own SparkSession and session fixtures: the tests of the Connect server, and those
        # of the broker, go to one worker each (one server, one broker: two Connect servers resolving
        # Delta's jars into one fresh Ivy cache at once broke both), and a file's tests that share a
        # module fixture to one worker (built once); every other test goes wherever a worker is free.
        group = next((server for server in ("connect", "kafka") if item.get_closest_marker(server)), None)
        if group is None and _uses_module_fixture(item):
            group = item.nodeid.split("::")[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


# A run with few subprocess tests (the quick one has seven) maps the CLI runs' CDS archive if this
# machine has one, and does not make one: making it costs more than those few runs would save.
CDS_WORTH_MAKING = 15


def pytest_collection_finish(session: pytest.Session) -> None:
    cds.make = sum(1 for item in session.items if item.get_closest_marker("subprocess")) >= CDS_WORTH_MAKING


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope == "module" for chain in defs for d in chain)


@pytest.fixture(autouse=True)
def _tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tell ``run_cli`` which tiers this test is in; in the unit tier, forbid starting Spark here."""
    node = request.node
    markers = {m for m in JVM_TIERS if node.get_closest_marker(m)}
    helpers.current_tiers = markers
    if "subprocess" in markers and TEST_JVM_OPTIONS and helpers.OWN_SUBMIT_OPTS is None:
        # Every JVM this test's processes start through spark-submit (a CLI run, the drill's runs, a
        # SIGKILLed run) gets the short-lived JVMs' options, and maps the class-data sharing archive
        # (tests/cds.py; made on the first such test of the machine). Not the shared session's or the
        # Connect server's JVM: they start with helpers.long_lived_jvm_env.
        options = TEST_JVM_OPTIONS
        if os.environ.get("SPARK_CONF_DIR") == str(cds.EMPTY_CONF) and os.environ.get("MATERIALIZER_TEST_CDS", "1") != "0":
            options = f"{options} {cds.archive_options(TEST_JVM_OPTIONS)}".strip()
        monkeypatch.setenv("SPARK_SUBMIT_OPTS", options)
    if not markers:
        try:
            from pyspark.sql import SparkSession
        except ImportError:  # the core install: nothing can start a JVM
            pass
        else:

            def refuse(self: object, *args: object, **kwargs: object) -> None:
                pytest.fail(f"{node.nodeid} starts a SparkSession: use the `spark` fixture (it marks the test `spark`)")

            monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refuse)
    yield
    helpers.current_tiers = None


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from materializer.spark import build_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    # Spark's Kafka connector only when a selected test needs it (one JVM, its jars fixed at start).
    kafka = any(item.get_closest_marker("kafka") for item in request.session.items)
    with pytest.MonkeyPatch.context() as env:  # a long-lived JVM: not the CLI runs' C1-only options
        options = helpers.long_lived_jvm_env(dict(os.environ)).get("SPARK_SUBMIT_OPTS")
        if options is None:
            env.delenv("SPARK_SUBMIT_OPTS", raising=False)
        else:
            env.setenv("SPARK_SUBMIT_OPTS", options)
        session = build_session(
            "local[2]",
            {"spark.sql.shuffle.partitions": "2", "spark.sql.warehouse.dir": str(warehouse)},
            app_name="materializer-tests",
            kafka=kafka,
        )
    yield session
    session.stop()


# --- where the run's time goes: MATERIALIZER_TEST_CPU_LOG=FILE ----------------------------------------
# One JSON line per test: its wall seconds (setup, call and teardown) and the CPU seconds the whole
# machine spent meanwhile (/proc/stat), which counts every process a test makes work: the shared
# session's JVM, a CLI subprocess and its JVM, the broker, the Connect server. Meant for an otherwise
# idle machine (docs/tests.md, "Where the time goes"); off unless the variable is set.
_CPU_LOG = os.environ.get("MATERIALIZER_TEST_CPU_LOG")


def _machine_cpu_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    user, nice, system = (int(v) for v in fields[:3])
    irq, softirq = (int(v) for v in fields[5:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds() -> float:
    """CPU seconds of this process and every process below it, live or already waited for.

    Unlike the machine's figure, this one is the test's own under two xdist workers: its process, the
    shared session's JVM, a CLI run and its JVM, a server it started (not one that left the tree).
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    me = os.getpid()
    below, frontier = {me}, [me]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in below:
                below.add(pid)
                frontier.append(pid)
    return sum(times.get(pid, 0) for pid in below) / tick


def _own_cpu_seconds() -> float:
    """This Python process's own CPU seconds (pytest, the test's code, py4j's client, delta-rs)."""
    times = os.times()
    return times.user + times.system


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        import json
        import time

        wall, cpu, tree, own = time.monotonic(), _machine_cpu_seconds(), _tree_cpu_seconds(), _own_cpu_seconds()
        yield
        record = {
            "test": item.nodeid, "start": round(time.time() - (time.monotonic() - wall), 1),
            "wall": round(time.monotonic() - wall, 2), "cpu": round(_machine_cpu_seconds() - cpu, 2),
            "tree_cpu": round(_tree_cpu_seconds() - tree, 2), "python_cpu": round(_own_cpu_seconds() - own, 2), "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "markers": sorted({m.name for m in item.iter_markers()} & {"spark", "subprocess", "crash", "slow"}),
        }
        with open(_CPU_LOG, "a") as log:
            log.write(json.dumps(record) + "\n")
