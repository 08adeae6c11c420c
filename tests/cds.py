"""A class-data sharing (CDS) archive for the JVMs of the CLI runs the tests start.

Each CLI run (``tests.helpers.run_cli``, the drill's runs, the SIGKILL tests) starts a JVM that
loads and verifies some 20,000 classes (Spark, Delta, Hadoop) before its first epoch. Java's dynamic
CDS (JDK 13+) writes the classes one run loaded, parsed and verified, into an archive
(``-XX:ArchiveClassesAtExit``) that later JVMs map instead (``-XX:SharedArchiveFile``). Made once per
machine, from the first test of the ``subprocess`` tier on (one CLI run of the shipped example
pipeline, in the background, under a lock: the tests go on meanwhile, and their CLI runs start
without the archive until it is there; a second pytest-xdist worker does not make another), kept in ``~/.cache/materializer/test-cds``
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

import atexit
import fcntl
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

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


# Whether this run has enough CLI runs to pay for making the archive (tests/conftest.py decides from
# the selected tests): making it costs about one CLI run and a half, and saves a quarter of each.
make = True


_making: threading.Thread | None = None  # this process's maker, once started
_maker: subprocess.Popen[bytes] | None = None  # its CLI run, while it runs


def archive_options(jvm_options: str) -> str:
    """The JVM options that map the archive; "" while this machine has none yet (or cannot make one).

    The first call without an archive starts making it in the background (:func:`_make`, under a
    lock that another process's maker holds instead), and the tests go on: a run a test starts before
    the archive is there runs without it, as with ``MATERIALIZER_TEST_CDS=0``. (Making it took about
    45 s; waited for, it held both workers of the full run at their first subprocess test, a Connect
    server's or a broker's among them, which never use it.)

    ``jvm_options``: the CLI runs' own (the archive is made by a JVM that runs with them)."""
    global _making
    archive = ROOT / f"cli-{_key()}.jsa"
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} {QUIET}"
    if make and _making is None:
        ROOT.mkdir(parents=True, exist_ok=True)
        lock = open(ROOT / ".lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process makes it: this one's tests take it when it is there
            lock.close()
            return ""
        _making = threading.Thread(target=_make_locked, args=(archive, jvm_options, lock), name="cds-archive", daemon=True)
        _making.start()
        atexit.register(_stop_maker)
    return ""


def _make_locked(archive: Path, jvm_options: str, lock: IO[str]) -> None:
    with lock:
        if not archive.exists():
            _make(archive, jvm_options)


def _stop_maker() -> None:
    """At this process's exit (a run shorter than the making): a maker still running is killed, and its
    partial archive removed (never renamed into place, so no later run maps it)."""
    maker = _maker
    if maker is not None and maker.poll() is None:
        try:
            os.killpg(maker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for partial in ROOT.glob(f"*.{os.getpid()}.partial"):
        partial.unlink(missing_ok=True)


def _make(archive: Path, jvm_options: str) -> bool:
    """One CLI run of the shipped example that writes the archive at its JVM's exit."""
    global _maker
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
        process = _maker = subprocess.Popen(
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
