"""Start-up: jars resolved once (Maven Central or a named mirror only, nothing pyspark ships), a
quiet terminal, and one clear paragraph with exit code 10 for each start-up failure."""

from __future__ import annotations

import functools
import http.server
import json
import os
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from materializer import jars
from materializer.errors import StartupError
from materializer.spark import DELTA_PACKAGE
from tests.helpers import binding, cli_env, run_cli, write_config, write_jsonl

# --- what gets resolved (no JVM) ------------------------------------------------------------------


def test_the_modules_pyspark_ships_are_excluded_by_name() -> None:
    shipped = jars.shipped_modules()
    # The second copies Spark's own resolver added beside pyspark's (Hadoop 3.4.2, Parquet 1.16).
    assert {"hadoop-client-api", "hadoop-client-runtime", "parquet-hadoop", "parquet-column", "slf4j-api"} <= shipped
    assert {"log4j-core", "log4j-slf4j2-impl", "jackson-databind", "snappy-java", "zstd-jni"} <= shipped
    assert "delta-spark_4.2_2.13" not in shipped and "delta-storage" not in shipped


def test_the_generated_ivy_settings_name_one_repository_and_no_local_maven(tmp_path: Path) -> None:
    settings = jars._ivy_settings(tmp_path, "https://mirror.example/maven2")
    assert settings.count("<ibiblio ") == 1 and 'root="https://mirror.example/maven2/"' in settings
    assert ".m2" not in settings and "local" not in settings and "<chain" not in settings


def test_the_mirror_setting_and_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MATERIALIZER_MAVEN_REPO", raising=False)
    assert jars.maven_repo() == "https://repo1.maven.org/maven2"
    monkeypatch.setenv("MATERIALIZER_MAVEN_REPO", "http://nexus.local/repository/maven/")
    assert jars.maven_repo() == "http://nexus.local/repository/maven"


def test_a_manifest_starts_the_session_without_resolving(tmp_path: Path) -> None:
    jar = tmp_path / "cache" / "x.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK")
    key = jars.manifest_key([DELTA_PACKAGE], sorted(jars.shipped_modules()), jars.MAVEN_CENTRAL)
    (tmp_path / f"manifest-{key}.json").write_text(json.dumps({"jars": [str(jar)]}))
    # No java at all: a resolution would fail; the manifest needs none.
    found = jars.resolve([DELTA_PACKAGE], tmp_path, java="/nonexistent/java", repo=jars.MAVEN_CENTRAL)
    assert found.jars == [str(jar)] and not found.fetched
    # A jar deleted from the cache makes the manifest stale: resolved again (here: no java).
    jar.unlink()
    with pytest.raises(StartupError, match="Java was not found"):
        jars.resolve([DELTA_PACKAGE], tmp_path, java="/nonexistent/java", repo=jars.MAVEN_CENTRAL)


# --- a real resolution against a mirror on loopback (Ivy in a JVM, no network) -------------------


def _artifact(repo: Path, group: str, name: str, version: str, deps: list[tuple[str, str, str]], jar: bool = True) -> None:
    folder = repo / group.replace(".", "/") / name / version
    folder.mkdir(parents=True, exist_ok=True)
    dependencies = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>" for g, a, v in deps
    )
    (folder / f"{name}-{version}.pom").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>{group}</groupId><artifactId>{name}</artifactId><version>{version}</version>"
        f"<dependencies>{dependencies}</dependencies></project>"
    )
    if jar:
        with zipfile.ZipFile(folder / f"{name}-{version}.jar", "w") as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[str]:
    """A Maven repository served over HTTP on loopback: test.mat:a depends on test.mat:b and on
    hadoop-client-api (which pyspark ships, so the mirror does not even have it)."""
    repo = tmp_path / "mirror"
    _artifact(repo, "test.mat", "a", "1.0", [("test.mat", "b", "1.0"), ("org.apache.hadoop", "hadoop-client-api", "3.4.2")])
    _artifact(repo, "test.mat", "b", "1.0", [])
    handler = functools.partial(_QuietHandler, directory=str(repo))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def test_a_first_resolution_reads_only_the_mirror_and_skips_what_pyspark_ships(tmp_path: Path, mirror: str) -> None:
    # A ~/.m2 with b's pom but not its jar: Ivy's default chain would take the pom from there and
    # then fail with "download failed" (the issue's slf4j-api case). Ours never looks there.
    home = tmp_path / "home"
    m2 = home / ".m2" / "repository"
    _artifact(m2, "test.mat", "b", "1.0", [], jar=False)
    env_before = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"-Duser.home={home}"
    lines: list[str] = []
    try:
        found = jars.resolve(["test.mat:a:1.0"], tmp_path / "cache", repo=mirror, report=lines.append)
    finally:
        if env_before is None:
            os.environ.pop("JAVA_TOOL_OPTIONS")
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = env_before
    names = sorted(Path(j).name for j in found.jars)
    assert names == ["a-1.0.jar", "b-1.0.jar"] and found.fetched
    assert all(str(tmp_path / "cache") in j for j in found.jars)
    # One line says what is fetched and where the report is; the last says what it came to.
    assert lines[0].startswith("fetching jars (test.mat:a:1.0) from " + mirror)
    assert "fetched 2 jars" in lines[-1]
    assert "resolving dependencies" in (tmp_path / "cache" / "resolve.log").read_text()
    # The second time: from the manifest, nothing printed, no JVM.
    again: list[str] = []
    started = time.monotonic()
    second = jars.resolve(["test.mat:a:1.0"], tmp_path / "cache", repo=mirror, report=again.append, java="/nonexistent")
    assert second.jars == found.jars and not second.fetched and again == []
    assert time.monotonic() - started < 1


def test_two_first_runs_at_once_resolve_once(tmp_path: Path, mirror: str) -> None:
    lines: list[str] = []
    results: list[jars.Resolution] = []

    def first_run() -> None:
        results.append(jars.resolve(["test.mat:a:1.0"], tmp_path / "cache", repo=mirror, report=lines.append))

    threads = [threading.Thread(target=first_run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 2 and results[0].jars == results[1].jars
    assert sorted(r.fetched for r in results) == [False, True]  # the second waited, then used the manifest
    assert sum(line.startswith("fetching") for line in lines) == 1


# --- start-up failures: one paragraph, exit code 10 (the CLI in a subprocess) ----------------------


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1}])
    return write_config(tmp_path, [binding("items", tmp_path / "src", tmp_path / "tables" / "items")])


def _assert_paragraph(result: Any, *needles: str) -> None:
    assert result.returncode == 10, result.stderr[-3000:]
    err = result.stderr.strip()
    assert "Traceback" not in err and "JAVA_GATEWAY_EXITED" not in err
    assert len(err.splitlines()) <= 3, err  # one paragraph (and at most the fetch line before it)
    for needle in needles:
        assert needle in err, err


def test_no_java_on_path_names_the_cause_and_the_fix(pipeline: Path, tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path / "empty"), "JAVA_HOME": ""}
    result = run_cli("run", "--config", str(pipeline), env=env, timeout=120, jvm=False)
    _assert_paragraph(result, "Java was not found", "JAVA_HOME", "Nothing was started")


def test_java_home_without_java_names_the_folder(pipeline: Path, tmp_path: Path) -> None:
    fake = tmp_path / "not-a-jdk"
    fake.mkdir()
    result = run_cli("run", "--config", str(pipeline), env={"JAVA_HOME": str(fake)}, timeout=120, jvm=False)
    _assert_paragraph(result, f"JAVA_HOME is set to {fake}, which has no bin/java")


def test_a_java_too_old_names_its_version(pipeline: Path, tmp_path: Path) -> None:
    java = tmp_path / "jdk8" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\necho \'java version "1.8.0_392"\' >&2\n')
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    result = run_cli("run", "--config", str(pipeline), env={"JAVA_HOME": str(java.parent.parent)}, timeout=120, jvm=False)
    _assert_paragraph(result, "is Java 8, but Spark 4 needs Java 17 or 21")


@pytest.mark.slow
@pytest.mark.subprocess  # Ivy runs in a JVM
def test_jars_not_reachable_on_a_first_run(pipeline: Path, tmp_path: Path) -> None:
    # A fresh cache and a mirror nobody listens on: the first run's fetch fails, as with no network.
    env = {"MATERIALIZER_IVY_CACHE": str(tmp_path / "fresh-cache"), "MATERIALIZER_MAVEN_REPO": "http://127.0.0.1:9/maven2"}
    result = run_cli("run", "--config", str(pipeline), env=env, timeout=300)
    _assert_paragraph(
        result, "could not be fetched from http://127.0.0.1:9/maven2", "MATERIALIZER_MAVEN_REPO", "resolve.log"
    )
    assert not (tmp_path / "log").exists()  # nothing was started: no recovery log


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_jvm_that_exits_while_starting_is_quoted_not_a_traceback(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": 1}])
    config = write_config(
        tmp_path,
        [binding("items", tmp_path / "src", tmp_path / "tables" / "items")],
        spark={"master": "local[1]", "conf": {"spark.driver.memory": "1k"}},
    )
    result = run_cli("run", "--config", str(config), timeout=300)
    _assert_paragraph(result, "Spark's Java process exited while starting", "Too small maximum heap")


def test_the_jvm_relay_drops_only_its_known_notices(capfd: pytest.CaptureFixture[str]) -> None:
    from materializer.spark import jvm

    read_end, write_end = os.pipe()
    relay = jvm._Relay(read_end, verbose=False)
    os.write(write_end, b"WARNING: Using incubator modules: jdk.incubator.vector\nSLF4J: Defaulting to no-operation\n")
    os.write(write_end, b"Exception in thread main: a real error\n")
    relay.release()  # the JVM has started: what it held back is let through, filtered
    os.write(write_end, b"26/11/21 WARN Something: later\n")
    os.close(write_end)
    relay._thread.join(timeout=10)
    assert capfd.readouterr().err == "Exception in thread main: a real error\n26/11/21 WARN Something: later\n"


def test_the_jvm_relay_drops_a_cancelled_python_workers_broken_pipe_and_nothing_else(capfd: pytest.CaptureFixture[str]) -> None:
    """A task cancelled because another task of its job failed (a refused document) leaves its
    Python worker with a closed socket, and pyspark's daemon prints that as a traceback of its own
    frames: dropped, also when two workers' tracebacks interleave. A traceback with any other line
    (another frame, another error) passes whole and in order; -v shows everything."""
    from materializer.spark import jvm

    daemon = '  File "/x/pyspark.zip/pyspark/daemon.py", line {}, in {}\n'
    cancelled = "Traceback (most recent call last):\n" + daemon.format(262, "manager") + daemon.format(95, "worker") + "BrokenPipeError: [Errno 32] Broken pipe\n"
    other = (
        "Traceback (most recent call last):\n" + daemon.format(262, "manager")
        + '  File "/x/materializer/sources/documents/check.py", line 9, in run\n    raise RuntimeError(MISSING)\n'
        + "RuntimeError: msgspec is missing\n"
    )
    interleaved = "".join(a + b for a, b in zip(cancelled.splitlines(True), cancelled.splitlines(True)))
    source_lines = (
        "Traceback (most recent call last):\n" + daemon.format(262, "manager") + "    code = worker(sock, authenticated)\n"
        + "           ^^^^^^^^^^^^^^^^^^^^^^^^^^\n" + daemon.format(95, "worker") + "ConnectionResetError: [Errno 104] Connection reset by peer\n"
    )
    for verbose, expected in ((False, "before\n" + other + "after\n"), (True, "before\n" + cancelled + interleaved + other + source_lines + "after\n")):
        read_end, write_end = os.pipe()
        relay = jvm._Relay(read_end, verbose=verbose)
        relay.release()
        for text in ("before\n", cancelled, interleaved, other, source_lines, "after\n"):
            os.write(write_end, text.encode())
        os.close(write_end)
        relay._thread.join(timeout=10)
        assert capfd.readouterr().err == expected


# --- a quiet start (a real session in a subprocess) -----------------------------------------------


@pytest.mark.subprocess
def test_a_warm_start_prints_nothing_of_ivy_or_log4j_and_verbose_shows_them(pipeline: Path, tmp_path: Path) -> None:
    prom = tmp_path / "metrics.prom"
    result = run_cli("run", "--config", str(pipeline), "--events", "jsonl", "--metrics-file", str(prom))
    assert result.returncode == 0, result.stderr[-3000:]
    # stdout carries the JSON lines only: opened, epoch 1's progress record, finished.
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["event"] for e in events] == ["opened", "progress", "finished"]
    assert events[1]["epoch"] == 1 and events[1]["inserted"] == 1 and events[-1]["last_epoch"] == 1
    assert 'materializer_epochs_total{pipeline="test-pipeline"} 1.0' in prom.read_text()
    err = result.stderr
    # Only our own lines: no Ivy report, no log4j warnings, no JVM notice.
    for noise in (":: loading settings", ":: resolving", "found io.delta", "WARN", "INFO", "log4j", "SparkContext"):
        assert noise not in err, err
    assert err.splitlines()[0].startswith(("opened pipeline", "fetching jars")), err
    # Refused lines: our error (file:line, what to do), and not Spark's warnings of the query
    # that numbers the file's lines to find it (a window over one partition, on purpose), nor its
    # report of the staging task that failed on a value the declared type cannot hold.
    (tmp_path / "refused" / "src").mkdir(parents=True)
    (tmp_path / "refused" / "src" / "b.jsonl").write_text('{"id": 2, "n": 99999999999}\n{not json\n')
    schema = "id BIGINT, n INT"
    declared = write_config(tmp_path / "refused", [binding("items", tmp_path / "refused" / "src", tmp_path / "refused" / "items", schema=schema)])
    refused = run_cli("run", "--config", str(declared))
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert "b.jsonl:1: a value does not fit" in refused.stderr and "b.jsonl:2: not valid JSON" in refused.stderr, refused.stderr[-3000:]
    for noise in ("WARN", "INFO", "ERROR", "Exception", "Traceback", "\tat "):
        assert noise not in refused.stderr, refused.stderr
    verbose = run_cli("-v", "run", "--config", str(pipeline))
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "WARN NativeCodeLoader" in verbose.stderr  # Spark's own log4j defaults
    assert "WARNING: Using incubator modules" in verbose.stderr


def test_end_jvm_closes_the_gateways_stdin_and_reaps_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What end_jvm does to PySpark's gateway, on a stand-in that, like PythonGatewayServer, exits
    at the end of its stdin (`cat`): the gateway shut, its process reaped, PySpark's handles cleared."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from materializer.spark import end_jvm

    class Gateway:
        shut = False

        def __init__(self) -> None:
            self.proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)

        def shutdown(self) -> None:
            self.shut = True

    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)
    monkeypatch.setattr(SparkContext, "_gateway", None)
    assert end_jvm() is False  # no JVM launched here
    gateway = Gateway()
    monkeypatch.setattr(SparkContext, "_gateway", gateway)
    monkeypatch.setattr(SparkContext, "_jvm", object())
    assert end_jvm(timeout=10) is True
    assert gateway.shut and gateway.proc.returncode == 0
    assert SparkContext._gateway is None and SparkContext._jvm is None


def _processes_with(marker: str) -> list[int]:
    """The processes whose environment holds ``marker`` (ours: /proc/PID/environ is readable)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # gone, or not ours
    return found


@pytest.mark.subprocess
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_command_ends_after_its_jvm_and_the_jvms_cpu_is_the_commands(pipeline: Path, tmp_path: Path) -> None:
    """PySpark never waits for the JVM it launches: it exited after our process, unreaped by it, so
    `time materializer run` counted the Python's CPU only (about a second of a run's 10-30) and the
    command returned while its JVM still ran. Now the CLI ends its JVM and reaps it."""
    marker = f"MATERIALIZER_TEST_MARK={os.getpid()}-{time.monotonic_ns()}"
    key, value = marker.split("=")
    err = tmp_path / "stderr.txt"
    with err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "materializer_cli", "run", "--config", str(pipeline)],
            env=cli_env({key: value}), stdout=subprocess.DEVNULL, stderr=stderr,
        )
        _, status, usage = os.wait4(process.pid, 0)  # the CLI's rusage: it and every child it reaped
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    assert process.returncode == 0, err.read_text()[-3000:]
    assert _processes_with(marker) == []  # no JVM, no Python worker of the run outlives it
    # A JVM's start and a Delta write cost several CPU seconds; the CLI's Python alone about one.
    assert usage.ru_utime + usage.ru_stime > 3.0, usage


@pytest.mark.spark
def test_a_local_session_has_its_jars_on_the_class_path_and_copies_none(spark: Any) -> None:
    """A local session (the shared one is made by build_session, as a run's is) gets the Delta
    jars on its JVM's class path, not as spark.jars: Spark would copy those into the session's
    scratch folder at its first task (686 MB for S3's SDK bundle)."""
    from pyspark import SparkFiles

    from materializer.spark import session_jars

    delta_jars = [j for j in session_jars(False) if "delta-spark" in Path(j).name]
    assert delta_jars
    class_path = spark.sparkContext._jvm.java.lang.System.getProperty("java.class.path").split(os.pathsep)
    assert set(delta_jars) <= set(class_path)
    assert not spark.sparkContext.getConf().get("spark.jars", "")
    spark.range(4).repartition(2).count()  # a task, which would fetch spark.jars
    assert not list(Path(SparkFiles.getRootDirectory()).glob("*.jar"))
