"""The pipeline on a real Spark standalone cluster: a master and two workers on loopback.

They are started with the pyspark package's own ``bin/spark-class`` (no Spark install needed), the
CLI runs ``materializer run --master spark://…`` in a subprocess, so the staging writes and the
MERGE run in executor JVMs on the workers, and the table must equal the plain-Python oracle. Local
paths work because the driver and the workers share this machine's file system. Every process is
stopped afterwards, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers import REPO, assert_tables_equal_oracle, binding, write_config, write_jsonl

pytestmark = pytest.mark.spark

STARTUP_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.webui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",  # the master and workers only schedule
            "PYSPARK_PYTHON": sys.executable,  # executors' Python = this venv's
        }

    def _start(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.processes.append(
            subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group, so stop() also reaches the executors a worker forked.
                start_new_session=True,
            )
        )

    def start(self) -> None:
        self._start(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port),
        )
        self._wait(lambda state: True, "the master to answer")
        for i in (1, 2):
            work = self.folder / f"worker-{i}"
            work.mkdir()
            self._start(
                f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.master_url,
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()), "--work-dir", str(work),
            )
        self._wait(lambda state: len([w for w in state.get("workers", []) if w.get("state") == "ALIVE"]) == 2, "two workers")

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"a cluster process exited with {proc.returncode}: {self.logs()}")
            try:
                if ready(self.state()):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"waited {STARTUP_TIMEOUT:.0f}s for {what}: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(self.folder.glob("*.log")))

    def stop(self) -> None:
        for proc in reversed(self.processes):  # workers first, then the master
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for proc in self.processes:
            try:  # anything the group left behind (executors)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    folder = tmp_path / "cluster"
    folder.mkdir()
    running = Cluster(folder)
    try:
        running.start()
        yield running
    finally:
        running.stop()


# Installed in the driver's Python only (sitecustomize on its PYTHONPATH): any open() of a file in
# the source folder fails, so a driver that read the documents itself would stop the run.
FORBID_SOURCE_READS = """
import os, sys
_folder = os.environ["MATERIALIZER_TEST_FORBIDDEN"]
def _hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(_folder + os.sep) and not os.path.isdir(path):
            raise PermissionError(f"the driver opened a data file: {path}")
sys.addaudithook(_hook)
"""


@pytest.mark.slow
def test_pipeline_on_a_standalone_cluster_equals_the_oracle(spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_jsonl(source / "orders-001.jsonl", [{"id": i, "status": "new", "total": i * 10} for i in range(1, 9)])
    write_jsonl(source / "orders-002.jsonl", [
        {"id": 3, "status": "paid", "total": 31},
        {"id": 5, "_meta": {"op": "d"}},
        {"id": 9, "status": "new", "total": 90},
        {"id": 1, "status": "shipped", "total": 11},
    ])
    table = tmp_path / "tables" / "orders"
    # The driver's Python may not open a data file (an audit hook makes such a read fail), and its
    # JVM is traced from outside (strace, where the machine has it): the executors read them.
    hook = tmp_path / "driver-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FORBID_SOURCE_READS)
    trace = tmp_path / "driver.strace"
    prefix = (
        ["strace", "-f", "--seccomp-bpf", "-e", "trace=open,openat,openat2", "-o", str(trace)]
        if shutil.which("strace") else []
    )
    config = write_config(
        tmp_path, [binding("orders", source, table, max_files=1)], pipeline_id="orders-cluster",
        spark={
            "master": "local[2]",  # overridden by --master below
            "conf": {
                "spark.sql.shuffle.partitions": "2",
                "spark.executor.memory": "512m",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
            },
        },
    )
    env = {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "MATERIALIZER_TEST_FORBIDDEN": str(source.resolve()),
        "PYTHONPATH": os.pathsep.join([str(hook), str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "materializer_cli", "run", "--config", str(config), "--master", cluster.master_url, "--json"],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:] + cluster.logs()
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["last_epoch"] == 2  # two files, one per epoch (max_files: 1)
    if prefix:
        # Every open by the driver's processes (its Python and the JVM it started): none of a
        # data file. The executors, children of the workers, are not traced.
        opened = [
            line for line in trace.read_text(errors="replace").splitlines()
            if str(source.resolve()) + "/" in line and "O_DIRECTORY" not in line  # listing the folder is fine
        ]
        assert opened == [], opened[:5]
        seen = trace.read_text(errors="replace")
        assert "sitecustomize" in seen and "delta-spark" in seen  # it saw the driver's Python and JVM open files

    # The work ran on the cluster: the application registered with the master and got executors
    # on both workers (standalone apps stay listed as completed after the driver stops).
    apps = cluster.state().get("completedapps", []) + cluster.state().get("activeapps", [])
    assert [app["name"] for app in apps] == ["materializer"]
    executor_dirs = [d for w in (1, 2) for d in (tmp_path / "cluster" / f"worker-{w}").glob("app-*/*") if d.is_dir()]
    assert len(executor_dirs) >= 2, cluster.logs()

    assert_tables_equal_oracle(spark, config)
