"""A class-data sharing (CDS) archive for the JVMs of the CLI runs the tests start.

Each CLI run (``tests.helpers.run_cli``, the drill's runs, the SIGKILL tests) starts a JVM that
loads and verifies some 20,000 classes (Spark, Delta, Hadoop) before its first epoch. Java's dynamic
CDS (JDK 13+) writes the classes one run loaded, parsed and verified, into an archive
(``-XX:ArchiveClassesAtExit``) that later JVMs map instead (``-XX:SharedArchiveFile``). Made once per
machine, at the first test of the ``subprocess`` tier (one CLI run of the shipped example pipeline,
under a lock: a second pytest-xdist worker waits for it), kept in ``~/.cache/materializer/test-cds``
(or ``MATERIALIZER_TEST_CDS_DIR``) under a name that changes with the pyspark jars and the Java;
``MATERIALIZER_TEST_CDS=0`` runs without it (to compare). tests/conftest.py puts the options in
``SPARK_SUBMIT_OPTS`` for the ``subprocess`` tier's tests, so every JVM their processes start
through spark-submit maps it, the long-lived ones excepted (the shared session, the Connect server).

Java refuses an archive for a class path that holds a non-empty folder, and spark-submit puts
``SPARK_CONF_DIR`` first on it: so the test JVMs get an empty ``SPARK_CONF_DIR`` (:data:`EMPTY_CONF`)
and read the test-only settings through ``--properties-file`` instead (``tests/conftest.py``).
A JVM that cannot use the archive (another Java, a changed class path) runs without it, as before:
never wrong, only slower; its CDS messages are off so that the CLI's output stays the same.
Users' JVMs never see any of this. Measured in docs/tests.md ("Test-only JVM options").
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = Path(os.environ.get("MATERIALIZER_TEST_CDS_DIR", Path.home() / ".cache" / "materializer" / "test-cds"))
EMPTY_CONF = ROOT / "spark-conf"  # stays empty: the test JVMs' SPARK_CONF_DIR
QUIET = "-Xlog:cds*=off"  # a JVM that cannot map the archive says so on stderr otherwise


@functools.lru_cache(maxsize=1)
def _key() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get("JAVA_HOME") else shutil.which("java")
    # (the Delta jars are on the class path since the runs pass them as SPARK_DIST_CLASSPATH: the
    # archive holds their classes too, and one made before does not)
    parts = [pyspark.__version__, str(jars), str(EMPTY_CONF), "SPARK_DIST_CLASSPATH"]
    parts += sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    if java:
        real = Path(java).resolve()
        parts += [str(real), str(real.stat().st_mtime_ns)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


_failed = False  # this process tried to make the archive and could not: it does not try again
# Whether this run has enough CLI runs to pay for making the archive (tests/conftest.py decides from
# the selected tests): making it costs about one CLI run and a half, and saves a quarter of each.
make = True


def archive_options(jvm_options: str) -> str:
    """The JVM options that map the archive, made first if this machine has none yet ("" if it cannot be).

    ``jvm_options``: the CLI runs' own (the archive is made by a JVM that runs with them)."""
    global _failed
    archive = ROOT / f"cli-{_key()}.jsa"
    if not archive.exists():
        if _failed or not make:
            return ""
        ROOT.mkdir(parents=True, exist_ok=True)
        with open(ROOT / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not archive.exists() and not _make(archive, jvm_options):
                _failed = True
                return ""
    return f"-XX:SharedArchiveFile={archive} {QUIET}"


def _make(archive: Path, jvm_options: str) -> bool:
    """One CLI run of the shipped example that writes the archive at its JVM's exit."""
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="materializer-cds-") as work:
        shutil.copytree(REPO / "conf" / "examples", Path(work) / "conf" / "examples")
        shutil.copy(REPO / "conf" / "orders-to-delta.yaml", Path(work) / "conf")
        # This process's environment without what a test may have set for its own run (a crash
        # point, a Connect server, S3 credentials): the example runs locally, to its end.
        run_env = {
            k: v for k, v in os.environ.items()
            if not (k.startswith(("AWS_", "SPARK_REMOTE")) or (k.startswith("MATERIALIZER_") and not k.startswith(("MATERIALIZER_TEST_", "MATERIALIZER_IVY"))))
        }
        run_env["SPARK_SUBMIT_OPTS"] = f"{jvm_options} -XX:ArchiveClassesAtExit={partial} {QUIET}"
        # A session of its own, so that the wait below covers the JVM: it writes the archive after
        # the CLI's Python has exited (pyspark does not wait for its JVM).
        process = subprocess.Popen(
            [sys.executable, "-m", "materializer_cli", "run", "-q"], cwd=work, env=run_env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        process.wait(timeout=600)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.killpg(process.pid, signal.SIGKILL)
    if process.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, archive)
    return True
