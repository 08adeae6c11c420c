"""The SparkSession: the cluster's own when one exists, else a local one with Delta's jars.

The Delta (and, for S3, hadoop-aws) jars are resolved once from Maven Central (``materializer.jars``)
into a cache folder that outlives the run (``~/.cache/materializer/ivy`` unless
``MATERIALIZER_IVY_CACHE`` says otherwise); later sessions start from the cached jar paths. The JVM
logs through a log4j2 file that keeps Spark's start-up chatter off the terminal (``verbose`` shows it).

This module holds the builders (:func:`session_for`, the one every session comes through;
:func:`config_session`, :func:`build_session`, :func:`active_session`); the package, one job a module
(none imports another):

* :mod:`~materializer.spark.packages`: the Delta release paired with the installed Spark, hadoop-aws,
  Kafka's connector, and their jars (:func:`session_jars`);
* :mod:`~materializer.spark.jvm`: the Java checked, :data:`QUIET_LOG4J2`, the JVM started with its output relayed;
* :mod:`~materializer.spark.connect`: Spark Connect sessions, :func:`is_connect`, :func:`isolated_session`;
* :mod:`~materializer.spark.settings`: :data:`BASE_CONF`, and s3a's settings from the AWS environment.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable

from materializer.spark.connect import is_connect, isolated_session, remote_session
from materializer.spark.jvm import (
    MIN_JAVA,
    QUIET_LOG4J2,
    check_java,
    end_jvm,
    java_command,
    java_major_version,
    quiet_log4j_file,
    start_jvm,
)
from materializer.spark.packages import (
    DEFAULT_SPARK_VERSION,
    DELTA_FOR_SPARK,
    DELTA_PACKAGE,
    DELTA_VERSION,
    HADOOP_AWS_PACKAGE,
    HADOOP_AWS_VERSION,
    KAFKA_PACKAGE,
    KAFKA_TOKEN_PROVIDER,
    SCALA_VERSION,
    SPARK_VERSION,
    delta_package,
    installed_spark_version,
    ivy_cache,
    session_jars,
)
from materializer import redact
from materializer.spark.settings import BASE_CONF, S3A_CREDENTIALS_PROVIDERS, s3a_conf, s3a_secrets, secret_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from materializer.config import PipelineConfig

__all__ = [
    "BASE_CONF", "DEFAULT_SPARK_VERSION", "DELTA_FOR_SPARK", "DELTA_PACKAGE", "DELTA_VERSION", "HADOOP_AWS_PACKAGE",
    "HADOOP_AWS_VERSION", "KAFKA_PACKAGE", "KAFKA_TOKEN_PROVIDER", "MIN_JAVA", "QUIET_LOG4J2",
    "S3A_CREDENTIALS_PROVIDERS", "SCALA_VERSION", "SPARK_VERSION", "active_session", "build_session", "check_java",
    "config_session", "delta_package", "end_jvm", "installed_spark_version", "is_connect", "isolated_session", "ivy_cache",
    "java_command", "java_major_version", "quiet_log4j_file", "remote_session", "s3a_conf", "session_for",
    "session_jars", "start_jvm", "stop_session",
]


def active_session() -> "SparkSession | None":
    """The session a host (Databricks, a notebook, a test) already runs, if any."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None and os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        # On Databricks the session exists but may not be "active" in this thread: take it as
        # it is, with the cluster's own Delta and storage settings, never our jars.
        return SparkSession.builder.getOrCreate()
    return active


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
    jars = session_jars(s3, kafka=kafka, java=java, verbose=verbose, report=report)
    java_options = [] if verbose else [f"-Dlog4j2.configurationFile={quiet_log4j_file(ivy_cache()).as_uri()}"]
    env: dict[str, str] = {}
    if master.startswith("local") and not _spark_env_script():
        # One JVM is the driver and the executors: the jars go on its class path, after Spark's
        # own (spark-submit appends SPARK_DIST_CLASSPATH). As spark.jars, Spark would copy each
        # into the run's scratch folder at its first task (S3's SDK bundle alone is 686 MB:
        # about 2 s a start, and a folder that a killed run leaves behind) and load them
        # through a class loader of its own.
        env["SPARK_DIST_CLASSPATH"] = os.pathsep.join(filter(None, [os.environ.get("SPARK_DIST_CLASSPATH"), *jars]))
    else:
        settings["spark.jars"] = ",".join(jars)
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
    # A secret of spark.conf is set once the JVM runs, never on its command line (docs: 'Secrets').
    user_conf, secret = secret_conf(conf or {}, _is_secret)
    settings.update(user_conf)
    user_options = settings.get("spark.driver.extraJavaOptions", "")
    settings["spark.driver.extraJavaOptions"] = " ".join(java_options + ([user_options] if user_options else []))
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = start_jvm(builder.getOrCreate, verbose=verbose, env=env)
    hadoop = {k.removeprefix("spark.hadoop."): v for k, v in secret.items() if k.startswith("spark.hadoop.")}
    if s3 and not master.startswith("local"):
        # A cluster's executors do not inherit our environment: they get the keys with each job.
        hadoop.update(s3a_secrets())
    if hadoop:
        hadoop_conf = session.sparkContext._jsc.hadoopConfiguration()
        for key, value in hadoop.items():
            hadoop_conf.set(key, value)
    for key, value in secret.items():
        if not key.startswith("spark.hadoop."):
            session.conf.set(key, value)
    return session


def _is_secret(key: str, value: str) -> bool:
    """Whether the spark.conf entry ``key: value`` holds a secret (:mod:`materializer.redact`'s rule)
    that can be set once the JVM runs: a Hadoop setting, or a SQL one. A secret in another Spark
    setting (fixed at start-up) goes on the command line: give those in spark-defaults.conf."""
    secret = bool(redact.SECRET_KEY.search(key)) or redact.text(value) != value
    return secret and key.startswith(("spark.hadoop.", "spark.sql.", "spark.databricks."))


def _spark_env_script() -> bool:
    """Whether spark-submit will source a ``spark-env.sh`` (which may set SPARK_DIST_CLASSPATH
    itself, as Hadoop-free Spark builds do): then the jars go as ``spark.jars``, as on a cluster."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    return os.path.exists(os.path.join(conf_dir, "spark-env.sh"))


def stop_session(session: "SparkSession") -> None:
    """Stop a session this process started (never a host's: Databricks, a notebook), and the JVM
    it ran on when we launched one (:func:`materializer.spark.jvm.end_jvm`); quietly."""
    try:
        session.stop()
    except Exception:  # noqa: BLE001 - a JVM already gone: nothing left to stop
        pass
    if not is_connect(session):
        end_jvm()


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
