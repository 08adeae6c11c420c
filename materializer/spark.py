"""The SparkSession: the cluster's own when one exists, else a local one with Delta's jars.

The Delta (and, for S3, hadoop-aws) jars come from Maven Central through Spark's Ivy resolver into
a cache folder that outlives the run (``~/.cache/materializer/ivy`` unless ``MATERIALIZER_IVY_CACHE``
says otherwise), so only the first run on a machine downloads them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCALA_VERSION = "2.13"
# The Delta release paired with each supported Spark minor version (the pairs the README lists
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
            "install the pinned pair with `pip install 'materializer[local]'`, or run on a Spark "
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
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
    # SparkContext.setLogLevel at start-up, without touching sparkContext (DESIGN invariant 11).
    "spark.log.level": "ERROR",
}


def ivy_cache() -> Path:
    return Path(os.environ.get("MATERIALIZER_IVY_CACHE", Path.home() / ".cache" / "materializer" / "ivy"))


def active_session() -> "SparkSession | None":
    """The session a host (Databricks, a notebook, a test) already runs, if any."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def build_session(
    master: str = "local[*]",
    conf: dict[str, str] | None = None,
    *,
    app_name: str = "materializer",
    s3: bool = False,
) -> "SparkSession":
    """Return the active session, or start one with Delta (and hadoop-aws when ``s3``)."""
    existing = active_session()
    if existing is not None:
        return existing
    from pyspark.sql import SparkSession

    packages = [delta_package()] + ([HADOOP_AWS_PACKAGE] if s3 else [])
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = dict(BASE_CONF)
    settings["spark.jars.packages"] = ",".join(packages)
    settings["spark.jars.ivy"] = str(ivy_cache())
    if master.startswith("local") or os.environ.get("SPARK_LOCAL_IP"):
        # Bind to loopback: a local run needs no network (and this host's name may not resolve).
        host = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.host"] = host
        settings["spark.driver.bindAddress"] = host
    if s3:
        settings.update(s3a_conf())
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    # The JVM inherits our stdout, and Spark's jar resolver prints its report there: start it with
    # stdout pointed at stderr, so our stdout stays ours (``--json`` output, pipes).
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        session = builder.getOrCreate()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return session


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
            "install it with `pip install 'materializer[connect]'`"
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
    master: str, conf: dict[str, str] | None = None, *, remote: str | None = None, s3: bool = False
) -> "SparkSession":
    """The run's session: a Spark Connect one when ``remote`` is given, else :func:`build_session`."""
    if remote:
        return remote_session(remote, conf)
    return build_session(master, conf, s3=s3)


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
