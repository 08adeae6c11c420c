"""The SparkSession: the cluster's own when one exists, else a local one with Delta's jars.

The Delta (and, for S3, hadoop-aws) jars are resolved once from Maven Central (``materializer.jars``)
into a cache folder that outlives the run (``~/.cache/materializer/ivy`` unless
``MATERIALIZER_IVY_CACHE`` says otherwise); later sessions start from the cached jar paths. The JVM
logs through a log4j2 file that keeps Spark's start-up chatter off the terminal (``verbose`` shows it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from materializer.errors import StartupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from materializer.config import PipelineConfig

SCALA_VERSION = "2.13"
# The Delta release paired with each supported Spark minor version (the pairs the docs list
# and tests/compat.sh tests). Delta 4.0's jar has no Spark version in its name; later ones do.
DELTA_FOR_SPARK = {
    "4.0": ("io.delta:delta-spark_2.13", "4.0.1"),
    "4.2": (f"io.delta:delta-spark_4.2_{SCALA_VERSION}", "4.4.0"),
}
DEFAULT_SPARK_VERSION = "4.2"


def installed_spark_version() -> str:
    """The installed pyspark's minor version (``4.2``), or the default pair's without pyspark."""
    try:
        from pyspark import __version__
    except ImportError:
        return DEFAULT_SPARK_VERSION
    return ".".join(__version__.split(".")[:2])


def delta_package(spark_version: str | None = None) -> str:
    """The Maven coordinates of the Delta jar that matches the installed (or given) Spark."""
    version = spark_version or installed_spark_version()
    if version not in DELTA_FOR_SPARK:
        from materializer.errors import ConfigError

        supported = ", ".join(sorted(DELTA_FOR_SPARK))
        raise ConfigError(
            f"pyspark {version} has no tested Delta release here (supported Spark: {supported}); "
            "install the pinned pair with `pip install 'delta-materializer[local]'`, or run on a Spark "
            "Connect server or cluster that has Delta (--remote / --master)"
        )
    artifact, delta = DELTA_FOR_SPARK[version]
    return f"{artifact}:{delta}"


SPARK_VERSION = installed_spark_version()
DELTA_VERSION = DELTA_FOR_SPARK.get(SPARK_VERSION, DELTA_FOR_SPARK[DEFAULT_SPARK_VERSION])[1]


def _bundled_hadoop_version(default: str = "3.5.0") -> str:
    """The Hadoop version of the jars pyspark ships (hadoop-aws must match it exactly)."""
    try:
        import pyspark

        jars = Path(pyspark.__file__).parent / "jars"
        for jar in jars.glob("hadoop-client-api-*.jar"):
            return jar.name[len("hadoop-client-api-") : -len(".jar")]
    except ImportError:  # pragma: no cover - pyspark is a dependency
        pass
    return default


# hadoop-aws is compiled against one Hadoop release: a different version than Spark's own
# hadoop-client jars fails at run time with NoSuchMethodError / ClassNotFoundException. pyspark
# 4.2.0 ships Hadoop 3.5.0, whose hadoop-aws pulls the AWS SDK v2 bundle (~690 MB, cached once).
HADOOP_AWS_VERSION = _bundled_hadoop_version()
DELTA_PACKAGE = f"{DELTA_FOR_SPARK.get(SPARK_VERSION, DELTA_FOR_SPARK[DEFAULT_SPARK_VERSION])[0]}:{DELTA_VERSION}"
HADOOP_AWS_PACKAGE = f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}"

# --- Kafka (issue 17): the connector's jars when a binding reads a topic --------------------------
# One separate spot for whoever moves package resolution elsewhere (jars.py): the connector matches
# pyspark's exact version. Its dependency spark-token-provider-kafka-0-10 is published on Maven
# Central only up to 4.0.0 as this registry serves it (4.2.0's pom and jar are 404): the connector's
# resolution leaves it out (jars.py excludes org.apache.spark's modules from transitive
# dependencies), and its 4.0.0 jar (the same classes: KafkaConfigUpdater, KafkaTokenUtil) is
# resolved on its own, without dependencies. Where 4.2.0 resolves, drop KAFKA_TOKEN_PROVIDER.
def _pyspark_version(default: str = "4.2.0") -> str:
    try:
        import pyspark

        return pyspark.__version__
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return default


KAFKA_PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_VERSION}:{_pyspark_version()}"
KAFKA_TOKEN_PROVIDER = ("org.apache.spark", f"spark-token-provider-kafka-0-10_{SCALA_VERSION}", "4.0.0")


# Settings every session we build carries. Schema auto-merge lets a MERGE add columns that new
# documents bring; the txn confs are set per apply by the driver, never here.
BASE_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.schema.autoMerge.enabled": "true",
    "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
    # Delta's defaults (50 snapshot partitions) suit clusters; small local tables pay per task.
    "spark.databricks.delta.snapshotPartitions": str(max(2, os.cpu_count() or 2)),

    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # An epoch's bindings run side by side (transaction.parallel_bindings), each apply session in a
    # pool of its own (``spark.scheduler.pool``, a session conf Spark hands to the jobs of each SQL
    # execution): FAIR shares the cores between the pools instead of first come, first served.
    "spark.scheduler.mode": "FAIR",
}

MIN_JAVA = 17
"""Spark 4 runs on Java 17 or 21."""

# Spark's own loggers at WARN, and the ones that warn about nothing a user can act on at ERROR.
QUIET_LOG4J2 = """\
# Written by materializer (spark.py): Spark's start-up chatter off the terminal; `-v` shows it.
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
# A batch read of a glob path (delta.py reads a table's `_delta_log/*.json` at every Open) makes Spark
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
"""

# Lines printed straight to stderr (not through log4j): the JVM's notice for the module Spark adds
# to every JVM it starts, and the SLF4J 1.x the AWS SDK bundle shades (hadoop-aws) saying it has no
# binding. Neither is anything a user can act on; `-v` shows them.
_JVM_NOTICES = (b"WARNING: Using incubator modules", b"SLF4J: ")


def ivy_cache() -> Path:
    return Path(os.environ.get("MATERIALIZER_IVY_CACHE", Path.home() / ".cache" / "materializer" / "ivy"))


def active_session() -> "SparkSession | None":
    """The session a host (Databricks, a notebook, a test) already runs, if any."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None and os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        # On Databricks the session exists but may not be "active" in this thread: take it as
        # it is, with the cluster's own Delta and storage settings, never our jars.
        return SparkSession.builder.getOrCreate()
    return active


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


def session_jars(
    s3: bool,
    *,
    kafka: bool = False,
    java: str = "java",
    verbose: bool = False,
    report: "Callable[[str], None] | None" = None,
) -> list[str]:
    """Paths of the jars a local session needs (resolved on the first run only)."""
    from materializer.jars import resolve

    from materializer.jars import shipped_modules

    packages = [delta_package()] + ([HADOOP_AWS_PACKAGE] if s3 else [])
    jars = resolve(packages, ivy_cache(), java=java, verbose=verbose, report=report).jars
    if kafka:
        # The connector is a Spark module itself: resolved leaving out only what pyspark ships and
        # the token provider, which is then resolved alone (see KAFKA_TOKEN_PROVIDER).
        group, provider, version = KAFKA_TOKEN_PROVIDER
        excludes = sorted(shipped_modules() | {provider})
        jars += resolve([KAFKA_PACKAGE], ivy_cache(), java=java, verbose=verbose, report=report, excludes=excludes, spark_modules=True).jars
        jars += resolve([f"{group}:{provider}:{version}"], ivy_cache(), java=java, verbose=verbose, report=report, excludes=[], transitive=False).jars
    return list(dict.fromkeys(jars))


def build_session(
    master: str = "local[*]",
    conf: dict[str, str] | None = None,
    *,
    app_name: str = "materializer",
    s3: bool = False,
    kafka: bool = False,
    verbose: bool = False,
    report: "Callable[[str], None] | None" = None,
) -> "SparkSession":
    """Return the active session, or start one with Delta (and hadoop-aws when ``s3``, Spark's
    Kafka connector when ``kafka``).

    ``verbose`` lets Ivy's report and Spark's INFO logs through; ``report`` receives the one line
    (and progress) of a first-run jar download. Raises StartupError for no Java, a Java too old,
    and jars that cannot be fetched.
    """
    existing = active_session()
    if existing is not None:
        return existing
    from pyspark.sql import SparkSession

    java = check_java()
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = dict(BASE_CONF)
    settings["spark.jars"] = ",".join(session_jars(s3, kafka=kafka, java=java, verbose=verbose, report=report))
    java_options = [] if verbose else [f"-Dlog4j2.configurationFile={quiet_log4j_file(ivy_cache()).as_uri()}"]
    env: dict[str, str] = {}
    if master.startswith("local") or os.environ.get("SPARK_LOCAL_IP"):
        # Bind to loopback: a local run needs no network (and this host's name may not resolve).
        host = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.host"] = host
        settings["spark.driver.bindAddress"] = host
        env["SPARK_LOCAL_IP"] = host  # else the JVM warns that the host name resolves to loopback
    if master.startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        # Spark's Python workers (mapInArrow: the documents source's validator) run this
        # interpreter, which has the wheel's dependencies; Spark's default, the `python3` on PATH,
        # may not (PySpark reads the variable when the session starts).
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if s3:
        settings.update(s3a_conf())
    settings.update(conf or {})
    user_options = settings.get("spark.driver.extraJavaOptions", "")
    settings["spark.driver.extraJavaOptions"] = " ".join(java_options + ([user_options] if user_options else []))
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = _start_jvm(builder.getOrCreate, verbose=verbose, env=env)
    return session


def stop_session(session: "SparkSession") -> None:
    """Stop a session this process started (never a host's: Databricks, a notebook); quietly."""
    try:
        session.stop()
    except Exception:  # noqa: BLE001 - a JVM already gone: nothing left to stop
        pass


def _start_jvm(start: "Callable[[], SparkSession]", *, verbose: bool, env: dict[str, str]) -> "SparkSession":
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
        self._thread = threading.Thread(target=self._run, args=(read_end,), name="materializer-jvm-output", daemon=True)
        self._thread.start()

    def _emit(self, line: bytes) -> None:
        if not self.verbose and line.startswith(_JVM_NOTICES):
            return
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


def remote_session(url: str, conf: dict[str, str] | None = None) -> "SparkSession":
    """A Spark Connect session to ``url`` (``sc://host:port``); the server brings Delta.

    Only SQL settings can be given to a Connect session (the server's own settings are fixed
    when it starts), so ``conf`` keys other than ``spark.sql.*`` / ``spark.databricks.*`` are
    refused rather than silently ignored.
    """
    from materializer.errors import ConfigError

    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError as exc:
        raise ConfigError(
            f"--remote {url}: the Spark Connect client is not installed ({exc}); "
            "install it with `pip install 'delta-materializer[connect]'`"
        ) from None
    fixed = sorted(k for k in (conf or {}) if not k.startswith(("spark.sql.", "spark.databricks.")))
    if fixed:
        raise ConfigError(
            f"spark.conf {fixed} cannot be set from a Spark Connect client: set them where the "
            f"server at {url} is started"
        )
    # As pyspark's own builder does for a remote session: from now on this process is in Connect
    # mode, so ``functions.col`` & co. build Connect columns (classic ones need a local JVM).
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = ConnectSession.builder.remote(url).getOrCreate()
    _close_at_exit(session)
    for key, value in (conf or {}).items():
        session.conf.set(key, value)
    return session


def _close_at_exit(session: "SparkSession") -> "SparkSession":
    """Release a Connect session (and close its gRPC channel) when the process exits normally.

    Left to ``SparkSession.__del__`` during interpreter shutdown, closing the channel can wait
    forever in gRPC (measured: ``materializer run --remote`` finished its work, then never exited).
    """
    import atexit

    def close() -> None:
        try:
            session.stop()
        except Exception:  # noqa: BLE001 - a clone lacks some of stop()'s attributes: close it directly
            try:
                session.client.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - best effort at exit
                pass

    atexit.register(close)
    return session


def session_for(
    master: str,
    conf: dict[str, str] | None = None,
    *,
    remote: str | None = None,
    app_name: str = "materializer",
    s3: bool = False,
    kafka: bool = False,
    verbose: bool = False,
    report: "Callable[[str], None] | None" = None,
) -> "SparkSession":
    """The one session builder (the CLI, the Databricks job, the drill and bench come through here):
    a Spark Connect one when ``remote`` is given, else :func:`build_session`.

    On Spark Connect the server brings its jars (Delta, hadoop-aws, the Kafka connector): none are
    resolved here, and ``app_name``/``s3``/``kafka``/``report`` only matter for a local JVM.
    """
    if remote:
        return remote_session(remote, conf)
    return build_session(master, conf, app_name=app_name, s3=s3, kafka=kafka, verbose=verbose, report=report)


def is_connect(spark: "SparkSession") -> bool:
    """Is ``spark`` a Spark Connect session (Databricks serverless / standard access mode)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def isolated_session(spark: "SparkSession") -> "SparkSession":
    """A session sharing ``spark``'s cluster but not its SQL settings, for the session-wide txn confs.

    Classic: ``newSession()`` (same SparkContext, its own SQL conf). Spark Connect has no
    ``newSession`` (it raises ``JVM_ATTRIBUTE_NOT_SUPPORTED``): ``cloneSession()`` (pyspark 4.1+)
    makes a server-side copy over the same connection and credentials. Where neither exists
    (pyspark 4.0's Connect client) the session is shared; that is still safe for our own work,
    because nothing else we run commits to Delta while the txn confs are set (prestaging writes
    plain Parquet, loads only read), but another program's Delta writes in that same session
    would carry our txn id: give the job a session of its own there.
    """
    if not is_connect(spark):
        return spark.newSession()
    clone = getattr(spark, "cloneSession", None)
    if clone is not None:
        try:
            # The server creates a session at its first request, and cannot clone one it has not
            # seen (SESSION_NOT_FOUND): make sure it has.
            spark.conf.get("spark.sql.session.timeZone")
            return _close_at_exit(clone())
        except Exception:  # noqa: BLE001 - a server without CloneSession (older than 4.1)
            pass
    return spark


# s3a's credential chain, in the order boto3 looks: explicit keys in the environment (with a session
# token if there is one), then the SDK v2 default chain (AWS_PROFILE and ~/.aws files, web identity,
# container and instance roles). hadoop-aws 3.4+ is built on the AWS SDK v2, so the v1 class names
# (com.amazonaws.auth.*) of older guides are only remapped aliases; these are the v2/s3a names.
S3A_CREDENTIALS_PROVIDERS = (
    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
)


def s3a_conf(environ: "dict[str, str] | None" = None) -> dict[str, str]:
    """s3a settings that follow the standard AWS environment, as boto3 does."""
    env = os.environ if environ is None else environ
    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.aws.credentials.provider": ",".join(S3A_CREDENTIALS_PROVIDERS),
    }
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        # Also as plain s3a keys: the executors of a cluster do not inherit the driver's
        # environment, but they do get the job's Hadoop configuration.
        conf["spark.hadoop.fs.s3a.access.key"] = env["AWS_ACCESS_KEY_ID"]
        conf["spark.hadoop.fs.s3a.secret.key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            conf["spark.hadoop.fs.s3a.session.token"] = env["AWS_SESSION_TOKEN"]
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https")).lower()
        # With a custom endpoint the SDK cannot infer the region and s3a would probe for it.
        region = region or "us-east-1"
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf


def config_session(
    config: "PipelineConfig",
    *,
    master: str | None = None,
    remote: str | None = None,
    app_name: str | None = None,
    verbose: bool = False,
    report: "Callable[[str], None] | None" = None,
) -> "SparkSession":
    """The session a pipeline's config asks for (:func:`session_for` with the config's settings): the
    CLI's, the Databricks job's outside Databricks, and the drill's.

    ``--master`` picks a classic master over the config's remote; ``--remote`` a server over both.
    hadoop-aws when a table, the staging area or a source is on S3; Spark's Kafka connector when a
    binding reads Kafka.
    """
    from materializer.storage import is_s3

    remote = remote or (None if master else config.spark.remote)
    uris = [config.staging] + [b.table for b in config.bindings]
    uris += [b.source.path for b in config.bindings if b.source.path is not None]  # kafka sources have none
    # Binding templates: their tables' and folders' URIs as written, placeholders and all (the scheme is what counts).
    uris += [t.table for t in config.templates] + [t.source.folders_in for t in config.templates if t.source.folders_in]
    kafka = any(b.source.format == "kafka" for b in [*config.bindings, *config.templates])
    extra = {"app_name": app_name} if app_name else {}
    return session_for(
        master or config.spark.master,
        dict(config.spark.conf),
        remote=remote,
        s3=any(is_s3(u) for u in uris),
        kafka=kafka,
        verbose=verbose,
        report=report,
        **extra,
    )
