"""A real Spark Connect server with Delta, on loopback, for the Connect tests.

Started from pyspark's own distribution (``pyspark/bin/spark-submit`` and the ``spark-connect``
jar that ships in ``pyspark/jars``) with the Delta jars that :func:`materializer.spark.session_jars` gives
every local session (the release paired with the installed pyspark, resolved once into the
project's Ivy cache). The server binds port 0 on
127.0.0.1 (the OS picks a free port, so parallel runs never collide); its log says which port.
It runs ``local[2]`` and shares this machine's file system with the tests, so local staging, log
and table folders are the same paths on both sides, as a Databricks volume is.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import long_lived_jvm_env

STARTED = re.compile(r"Spark Connect server started at: [^\s]*:(\d+)")


@dataclass(frozen=True)
class ConnectServer:
    url: str
    """``sc://127.0.0.1:<port>``"""
    pid: int
    log: Path


SESSION_TIMEOUT = "spark.connect.session.manager.defaultSessionTimeout"
"""How long the server keeps a session that receives no RPC (default 60 min), then closes it: a
later call on it fails with INVALID_HANDLE.SESSION_CLOSED. The test server keeps sessions for
ever (-1): one client session serves every Connect test of a run, and in a full run more than an
hour of classic tests may pass between two of them (it did once the run took 80 minutes)."""


def start(
    workdir: Path, *, timeout: float = 600, conf: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], ConnectServer]:
    """Start a Connect server; returns when it listens (raises with its log if it does not).
    ``conf``: server settings over the defaults here."""
    import pyspark

    from materializer.spark import BASE_CONF, session_jars

    home = Path(pyspark.__file__).parent
    if not list((home / "jars").glob("spark-connect_*.jar")):
        pytest.skip(f"no spark-connect jar in {home / 'jars'}")
    extra = conf or {}
    conf = dict(BASE_CONF)
    conf.update(
        {
            SESSION_TIMEOUT: "-1",
            # Delta's jars as every session of ours gets them (materializer.jars: resolved once, under
            # a lock), not spark.jars.packages: Spark's own Ivy run, beside another worker's
            # resolution into the same fresh cache, failed with "download failed" on a new machine.
            "spark.jars": ",".join(session_jars(False)),
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.warehouse.dir": str(workdir / "warehouse"),
            "spark.log.level": "INFO",  # the "started at" line is logged at INFO
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={workdir}",
            **extra,
        }
    )
    # What pyspark's JVMs get from PYSPARK_SUBMIT_ARGS (the test-only settings file: tests/conftest.py).
    submit = [a for a in shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "")) if a != "pyspark-shell"]
    args = [str(home / "bin" / "spark-submit"), *submit, "--master", "local[2]"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]
    env = long_lived_jvm_env(dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1"))
    env.pop("SPARK_REMOTE", None)
    log = workdir / "connect-server.log"
    with open(log, "wb") as out:
        # A process group of its own: stopping it stops the JVM that spark-submit execs.
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = STARTED.search(log.read_text(errors="replace"))
        if found:
            return process, ConnectServer(f"sc://127.0.0.1:{found.group(1)}", process.pid, log)
        if process.poll() is not None:
            break
        time.sleep(0.5)
    stop(process)
    raise RuntimeError(f"the Spark Connect server did not start; its log ({log}):\n{log.read_text(errors='replace')[-4000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    process, server = start(tmp_path_factory.mktemp("connect-server"))
    try:
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="session")
def _connect_session(connect_server: ConnectServer) -> Iterator[object]:
    from materializer.spark import remote_session

    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    session = remote_session(connect_server.url)
    _restore(before)  # Connect mode only while a Connect test runs (see connect_spark)
    yield session
    try:
        session.stop()
    except Exception:  # noqa: BLE001 - the server may be gone already
        pass


@pytest.fixture
def connect_spark(_connect_session: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The Connect session, with this process in Connect mode for the test.

    pyspark decides per process whether ``functions.col`` & co. build classic or Connect columns
    (``SPARK_CONNECT_MODE_ENABLED``); the other tests of the run share the process and a classic
    session, so Connect mode is switched on for each Connect test only.
    """
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return _connect_session


def _restore(value: str | None) -> None:
    if value is None:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    else:
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = value
