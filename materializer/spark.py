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

SPARK_VERSION = "4.2"
SCALA_VERSION = "2.13"
DELTA_VERSION = "4.4.0"


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
DELTA_PACKAGE = f"io.delta:delta-spark_{SPARK_VERSION}_{SCALA_VERSION}:{DELTA_VERSION}"
HADOOP_AWS_PACKAGE = f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}"

# --- Kafka (issue 17): the connector's jars when a binding reads a topic --------------------------
# One separate spot for whoever moves package resolution elsewhere (jars.py): the connector matches
# pyspark's exact version. Its dependency spark-token-provider-kafka-0-10 is published on Maven
# Central only up to 4.0.0 as this registry serves it (4.2.0's pom and jar are 404), so Ivy fails
# resolving the connector: the token provider is excluded from the resolve and its 4.0.0 jar (the
# same classes: KafkaConfigUpdater, KafkaTokenUtil) is fetched once with Spark's own Ivy jar into
# the same cache and put on the class path. Where 4.2.0 resolves, drop KAFKA_TOKEN_PROVIDER.
def _pyspark_version(default: str = "4.2.0") -> str:
    try:
        import pyspark

        return pyspark.__version__
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return default


KAFKA_PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_VERSION}:{_pyspark_version()}"
KAFKA_TOKEN_PROVIDER = ("org.apache.spark", f"spark-token-provider-kafka-0-10_{SCALA_VERSION}", "4.0.0")


def kafka_conf() -> dict[str, str]:
    """Settings that put Spark's Kafka connector on a session being built (beside ``KAFKA_PACKAGE``)."""
    import subprocess

    group, artifact, version = KAFKA_TOKEN_PROVIDER
    jar = ivy_cache() / "jars" / f"{group}_{artifact}-{version}.jar"
    if not jar.exists():
        import pyspark

        ivy_jar = next((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
        subprocess.run(
            ["java", "-jar", str(ivy_jar), "-cache", str(ivy_cache() / "cache"), "-dependency", group, artifact, version,
             "-notransitive", "-confs", "default", "-retrieve", str(ivy_cache() / "jars" / "[organisation]_[artifact]-[revision].[ext]")],
            stdout=sys.stderr, stderr=sys.stderr, check=True, timeout=600,
        )
    return {"spark.jars.excludes": f"{group}:{artifact}", "spark.jars": str(jar)}


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
    kafka: bool = False,
) -> "SparkSession":
    """Return the active session, or start one with Delta (and hadoop-aws when ``s3``, Spark's Kafka
    connector when ``kafka``)."""
    existing = active_session()
    if existing is not None:
        return existing
    from pyspark.sql import SparkSession

    packages = [DELTA_PACKAGE] + ([HADOOP_AWS_PACKAGE] if s3 else []) + ([KAFKA_PACKAGE] if kafka else [])
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
    kafka_settings = kafka_conf() if kafka else {}
    settings.update(kafka_settings)
    settings.update(conf or {})
    for key, value in kafka_settings.items():
        # A user's own spark.jars / spark.jars.excludes are kept beside the connector's, not in place of them.
        if key in (conf or {}) and value not in settings[key].split(","):
            settings[key] = f"{settings[key]},{value}"
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
    session.sparkContext.setLogLevel("ERROR")
    return session


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
