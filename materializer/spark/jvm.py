"""A local session's JVM: the Java checked, its log4j quieted, its output relayed, its failure said."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from materializer import redact
from materializer.errors import StartupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


MIN_JAVA = 17
"""Spark 4 runs on Java 17 or 21."""


# Spark's own loggers at WARN, and the ones that warn about nothing a user can act on at ERROR.
QUIET_LOG4J2 = """\
# Written by materializer (materializer.spark): Spark's start-up chatter off the terminal; `-v` shows it.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.metrics.name = org.apache.hadoop.metrics2
logger.metrics.level = error
logger.plans.name = org.apache.spark.util.SparkStringUtils
logger.plans.level = error
logger.checkpoint.name = org.apache.spark.rdd.MapPartitionsRDD
logger.checkpoint.level = error
# Deprecation notices about SQL our code generates (a user cannot act on them; `-v` shows them).
logger.functions.name = org.apache.spark.sql.catalyst.analysis.FunctionResolution
logger.functions.level = error
# A batch read of a glob path (materializer.delta reads a table's `_delta_log/*.json` at every Open) makes Spark
# look for a streaming sink's metadata folder under the glob, which is no folder: a WARN with a Java
# stack trace (~90 lines) per read, about nothing wrong. (The log folder cannot be read as a folder
# with a name filter instead: Spark skips paths whose names start with "_", `_delta_log` too.)
logger.sinkmeta.name = org.apache.spark.sql.execution.streaming.sinks.FileStreamSink
logger.sinkmeta.level = error
logger.sinkmeta40.name = org.apache.spark.sql.execution.streaming.FileStreamSink
logger.sinkmeta40.level = error
# The bench's Structured Streaming peer: Spark turns adaptive execution off for a stream and says so.
# (Spark 4.2 moved both classes into sinks/ and runtime/; the second name of each is Spark 4.0's.)
logger.stream.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream
logger.stream.level = error
logger.stream40.name = org.apache.spark.sql.execution.streaming.ResolveWriteToStream
logger.stream40.level = error
# The apply threads' FAIR pools are made on first use, with the defaults we want, not from a file.
logger.fair.name = org.apache.spark.scheduler.FairSchedulableBuilder
logger.fair.level = error
# A refused line is found by numbering its file's lines in one partition, on purpose (a window
# without partitions; materializer.sources.documents.reader): Spark warns of it right above our error.
logger.window.name = org.apache.spark.sql.execution.window.WindowExec
logger.window.level = error
# A staging job the checks refuse fails its tasks while they write their shuffle (the combine's
# window sorts after the exchange, not before): Spark warns that it could not delete the temporary
# files a failed task never created, right above our error.
logger.shuffletmp.name = org.apache.spark.storage.DiskBlockObjectWriter
logger.shuffletmp.level = error
# A task that fails on a document's value (a declared type's cast, in the staging job) is what our
# own error then names by file and line: Spark's report of the failed task (its Java stack trace,
# thrice, ~100 lines) says the same in other words. Any other failure's cause is in our error too.
logger.task.name = org.apache.spark.executor.Executor
logger.task.level = fatal
logger.taskset.name = org.apache.spark.scheduler.TaskSetManager
logger.taskset.level = fatal
logger.writejob.name = org.apache.spark.sql.execution.datasources.FileFormatWriter
logger.writejob.level = fatal
"""


# Lines printed straight to stderr (not through log4j): the JVM's notice for the module Spark adds
# to every JVM it starts, and the SLF4J 1.x the AWS SDK bundle shades (hadoop-aws) saying it has no
# binding. Neither is anything a user can act on; `-v` shows them.
_JVM_NOTICES = (b"WARNING: Using incubator modules", b"SLF4J: ")

# A Python worker whose task Spark cancelled (another task of its job failed: a refused document's
# cast, say) finds its socket closed, and pyspark's daemon prints the broken pipe as a traceback of
# its own frames. The run's error says what failed; this says nothing a user can act on (`-v`
# shows it). Any other line inside such a block lets the whole block through.
_WORKER_TRACEBACK = b"Traceback (most recent call last):"
_WORKER_FRAME = re.compile(rb'^  File ".*pyspark/daemon\.py", line \d+, in \w+\r?\n$')
_WORKER_ERROR = re.compile(rb"^(BrokenPipeError|ConnectionResetError): \[Errno \d+\] [^\r\n]*\r?\n$")


def java_command() -> str:
    """The ``java`` Spark's launcher will run: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if not java.is_file():
            raise StartupError(
                f"JAVA_HOME is set to {home}, which has no bin/java: Spark starts its Java virtual machine from "
                f"there. Point JAVA_HOME at a Java {MIN_JAVA} or 21 installation (the folder that contains bin/java), "
                "or unset it to use the `java` on PATH; then run again. Nothing was started."
            )
        return str(java)
    found = shutil.which("java")
    if found is None:
        from materializer.jars import java_missing_message

        raise StartupError(java_missing_message("java on PATH; JAVA_HOME is not set"))
    return found


def java_major_version(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for ``1.8.0_x``), None if it says nothing we know."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartupError(
            f"{java} could not be run ({exc}): Spark needs a working Java {MIN_JAVA} or 21. Repair or reinstall "
            "it, or point JAVA_HOME at another installation; then run again. Nothing was started."
        ) from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> str:
    """The java to start Spark with, after checking it runs Spark 4 (StartupError otherwise)."""
    java = java_command()
    major = java_major_version(java)
    if major is not None and major < MIN_JAVA:
        raise StartupError(
            f"{java} is Java {major}, but Spark 4 needs Java {MIN_JAVA} or 21. Install one (e.g. `apt-get install "
            "openjdk-17-jre-headless`, or from adoptium.net) and set JAVA_HOME to its folder (or put its bin first "
            "on PATH); then run again. Nothing was started."
        )
    return java


def quiet_log4j_file(cache: Path) -> Path:
    """The log4j2 configuration for quiet sessions, written into the cache folder when it differs."""
    path = cache / "log4j2-quiet.properties"
    if not path.is_file() or path.read_text() != QUIET_LOG4J2:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # per process: two first runs may race here
        tmp.write_text(QUIET_LOG4J2)
        os.replace(tmp, path)
    return path


def start_jvm(start: "Callable[[], SparkSession]", *, verbose: bool, env: dict[str, str]) -> "SparkSession":
    """Start the JVM with its stdout and stderr on a pipe that a thread forwards to our stderr.

    The JVM inherits our file descriptors: its stdout must not be ours (``--json`` output, pipes),
    and the one notice the JVM itself prints at start (not log4j's) is dropped unless ``verbose``.
    What it says while starting is held back until it has started: if it fails, the StartupError
    quotes it instead.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    relay = _Relay(read_end, verbose)
    saved_out, saved_err = os.dup(1), os.dup(2)
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    try:
        session = start()
    except Exception as exc:
        _restore(saved_out, saved_err, saved_env, write_end)
        if not _gateway_exited(exc):
            relay.release()
            raise
        raise _startup_failure(relay.held(wait=True)) from exc
    _restore(saved_out, saved_err, saved_env, write_end)
    relay.release()
    return session


def end_jvm(timeout: float = 30.0) -> bool:
    """End the JVM this process launched, its session first if one still runs, and wait for it.

    PySpark never waits for the JVM it launches: the JVM exits when our process ends and its stdin
    closes, after our process is gone. So a command returned while its JVM was still shutting
    down (Spark's shutdown hooks delete its scratch folders), and the JVM's CPU, most of a run's,
    was not the command's to the operating system (``time``, ``wait4``): an orphan's CPU goes to
    whoever reaps it. Closing its stdin is how PySpark's gateway server is told to exit
    (``PythonGatewayServer`` reads it until EOF); waiting reaps it, with the Python workers it
    started, and a later session in this process starts a JVM of its own. Call it only where the
    JVM is ours (the CLI; :func:`materializer.spark.stop_session`), never in a host's process
    (Databricks, a notebook). False when there was none or it did not exit in ``timeout`` seconds
    (then it is left to exit by itself, as before).
    """
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:  # a Connect-only client's pyspark (databricks-connect, pyspark-client): no JVM
        return False

    gateway = getattr(SparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return False  # no JVM launched here (Spark Connect, or never started)
    session = getattr(SparkSession, "_instantiatedSession", None)
    try:
        if session is not None:
            session.stop()
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - a gateway already closed: the JVM is exiting anyway
        pass
    SparkContext._gateway = None  # the next session launches a JVM of its own
    SparkContext._jvm = None  # (SparkConf() would use the old one's handle)
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return True


def _restore(saved_out: int, saved_err: int, saved_env: dict[str, str | None], write_end: int) -> None:
    os.dup2(saved_out, 1)
    os.dup2(saved_err, 2)
    os.close(saved_out)
    os.close(saved_err)
    os.close(write_end)
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class _Relay:
    """Reads the JVM's output for its lifetime (so it never blocks on a full pipe) and copies it to
    our stderr; lines written while the JVM starts are held until :meth:`release`."""

    def __init__(self, read_end: int, verbose: bool) -> None:
        self.verbose = verbose
        self._lock = threading.Lock()
        self._pending: list[bytes] | None = []
        self._block: list[bytes] = []
        self._open = 0
        self._thread = threading.Thread(target=self._run, args=(read_end,), name="materializer-jvm-output", daemon=True)
        self._thread.start()

    def _emit(self, line: bytes) -> None:
        if not self.verbose:
            if line.startswith(_JVM_NOTICES):
                return
            if self._worker_block(line):
                return
        self._write(line)

    def _worker_block(self, line: bytes) -> bool:
        """Whether ``line`` is held as part of a cancelled Python worker's traceback (dropped when
        the block ends as one: tracebacks of two workers may interleave line by line)."""
        if line.startswith(_WORKER_TRACEBACK):
            self._block.append(line)
            self._open += 1
            return True
        if self._block and (_WORKER_FRAME.match(line) or line.startswith(b"    ")):  # a frame, its source line
            self._block.append(line)
            return True
        if self._block and _WORKER_ERROR.match(line):
            self._open -= 1
            if self._open:
                self._block.append(line)
            else:
                self._block = []  # every traceback held ended as a cancelled worker's: dropped
            return True
        if self._block:  # something else: what was held was not only that
            held, self._block, self._open = self._block, [], 0
            for kept in held:
                self._write(kept)
        return False

    @staticmethod
    def _write(line: bytes) -> None:
        # The JVM's own lines are redacted too (docs: 'Secrets'): a Kafka client logs its config.
        line = redact.text(line.decode("utf-8", "replace")).encode("utf-8")
        try:
            os.write(2, line)
        except OSError:  # stderr closed: keep draining all the same
            pass

    def _run(self, read_end: int) -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            for line in iter(pipe.readline, b""):
                with self._lock:
                    if self._pending is not None:
                        self._pending.append(line)
                        continue
                self._emit(line)
        with self._lock:
            held, self._block = self._block, []  # the JVM's output ended inside a block: say it
            for line in held:
                self._write(line)

    def release(self) -> None:
        with self._lock:
            pending, self._pending = self._pending or [], None
            for line in pending:
                self._emit(line)

    def held(self, *, wait: bool) -> str:
        if wait:
            self._thread.join(timeout=5)  # the JVM has exited: the pipe ends
        with self._lock:
            return b"".join(self._pending or []).decode(errors="replace")


def _gateway_exited(exc: BaseException) -> bool:
    """pyspark's error for a JVM that exited before its gateway answered (by its error class)."""
    get_class = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    return get_class is not None and get_class() == "JAVA_GATEWAY_EXITED"


def _startup_failure(output: str) -> StartupError:
    """A StartupError quoting what the JVM said before it exited while starting."""
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("WARNING: Using incubator")]
    said = " | ".join(lines[-6:]) or "nothing"
    return StartupError(
        f"Spark's Java process exited while starting (it said: {said}). Check that JAVA_HOME or the `java` on "
        f"PATH is a complete Java {MIN_JAVA} or 21 installation and that the options in the config's spark.conf "
        "are valid; `materializer -v …` shows Spark's own log. Nothing was started."
    )
