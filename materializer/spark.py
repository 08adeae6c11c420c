"""The SparkSession: the cluster's own when one exists, else a local one with Delta's jars.

The Delta (and, for S3, hadoop-aws) jars come from Maven Central through Spark's Ivy resolver into
a cache folder that outlives the run (``~/.cache/materializer/ivy`` unless ``MATERIALIZER_IVY_CACHE``
says otherwise), so only the first run on a machine downloads them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_VERSION = "4.2"
SCALA_VERSION = "2.13"
DELTA_VERSION = "4.4.0"
HADOOP_AWS_VERSION = "3.4.2"
DELTA_PACKAGE = f"io.delta:delta-spark_{SPARK_VERSION}_{SCALA_VERSION}:{DELTA_VERSION}"
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

    packages = [DELTA_PACKAGE] + ([HADOOP_AWS_PACKAGE] if s3 else [])
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
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def s3a_conf() -> dict[str, str]:
    """s3a settings that follow the standard AWS environment, as boto3 does."""
    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider,"
            "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
        ),
    }
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https")).lower()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    return conf
