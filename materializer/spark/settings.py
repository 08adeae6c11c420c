"""The Spark settings every session we build carries (``BASE_CONF``), and s3a's from the AWS environment."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


TABLE_WRITES = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
"""How a table's data files are written, set around each of our commits (on a session we are
handed too) and carried by the sessions we build: a ``TIMESTAMP`` as INT64 microseconds, Delta's
own type, where Spark's default is INT96, which delta-rs and Arrow read as nanoseconds (a value
before 1677 or after 2262 came back wrong, without a word)."""


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
    # PySpark's DataFrame debugging records the Python call site of every Column function in the
    # JVM (about seven py4j round trips more per function: the active session, the origin
    # class, a conf read, the origin set and reset, plus a failed IPython import). An epoch builds
    # its plans from a few hundred such functions, so it cost about two thirds of the driver's
    # py4j calls (docs, Performance). Its only use is naming a user's Python line in an analysis
    # error, and our plans are ours; a config's spark.conf may turn it back on.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # A TIMESTAMP as INT64 microseconds in the tables' files, not Spark's INT96.
    **TABLE_WRITES,
}


ARROW_BATCHES_BY_RECORDS = {"spark.sql.execution.arrow.maxBytesPerBatch": "2147483647"}
"""For jobs whose Arrow input is a files epoch's lines (the documents' arrow validator, its
``mapInArrow``): batches bounded by records (``spark.sql.execution.arrow.maxRecordsPerBatch``,
10,000 by default) and by the task's split of the files (``spark.sql.files.maxPartitionBytes``,
128 MiB), not also by bytes. With a byte limit set (64 MiB by default) Spark measures the batch
after every row it adds, which for a row holding a struct walks every vector of it: about 0.3 JVM
CPU s per million documents here (docs, Performance), for a bound the split already gives. The
value is Spark's own "no limit" (``Int.MaxValue``), the one that skips the measuring."""


INTERPRETED = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
"""How a small epoch's queries are planned and run (its staging jobs, and its MERGE below
``transaction.interpreted_below_bytes``): without adaptive re-planning (which runs each shuffle
stage as a job of its own and plans again between them) and without generated code (whose
compiling, by Janino and then the JIT, is most of a query's CPU on a few thousand rows). The same
plan's results either way; Spark's defaults for the rest (docs, Performance: 'Small applies')."""


@contextmanager
def session_confs(session: "SparkSession", values: dict[str, str]) -> Iterator[None]:
    """Within the block, ``session``'s conf holds ``values``; each is put back after, unset where
    it was unset, unless someone changed it meanwhile (two blocks on one session in two threads,
    however they interleave, leave it as it was before both). A conf the compute refuses (a
    serverless one, say) keeps its value: for settings of how queries run, never what they write."""
    conf = session.conf if values else None
    saved: dict[str, Any] = {}
    for key, value in values.items() if conf is not None else ():
        try:
            before = conf.get(key, None)
            conf.set(key, value)
        except Exception:  # noqa: BLE001
            continue
        saved[key] = before
    try:
        yield
    finally:
        for key, before in saved.items():
            assert conf is not None
            if conf.get(key, None) != values[key]:
                continue  # changed meanwhile: the one who changed it puts it back
            if before is None:
                conf.unset(key)
            else:
                conf.set(key, before)


def interpreted(session: "SparkSession", on: bool = True) -> AbstractContextManager[None]:
    """Within the block (when ``on``), ``session``'s queries run as :data:`INTERPRETED` says
    (:func:`session_confs`)."""
    return session_confs(session, INTERPRETED if on else {})


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
    """s3a settings that follow the standard AWS environment, as boto3 does.

    Never the keys themselves: what a session is started with becomes ``--conf`` arguments of
    spark-submit, on the JVM's command line (``/proc/<pid>/cmdline``, which every local user can
    read). The JVM inherits this process's environment, and s3a's chain reads
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` from it (the SDK v2
    ``EnvironmentVariableCredentialsProvider``); the executors of a cluster, which do not inherit
    it, get the keys in the driver's Hadoop configuration once the JVM runs (:func:`s3a_secrets`)."""
    env = os.environ if environ is None else environ
    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.aws.credentials.provider": ",".join(S3A_CREDENTIALS_PROVIDERS),
    }
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


def s3a_secrets(environ: "dict[str, str] | None" = None) -> dict[str, str]:
    """The AWS keys of the environment as s3a's Hadoop settings (``fs.s3a.access.key`` …), for a
    cluster's executors: set in the running driver's Hadoop configuration (never at start-up, see
    :func:`s3a_conf`), which Spark ships with each job's tasks."""
    env = os.environ if environ is None else environ
    if not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
        return {}
    out = {"fs.s3a.access.key": env["AWS_ACCESS_KEY_ID"], "fs.s3a.secret.key": env["AWS_SECRET_ACCESS_KEY"]}
    if env.get("AWS_SESSION_TOKEN"):
        out["fs.s3a.session.token"] = env["AWS_SESSION_TOKEN"]
    return out


def secret_conf(conf: "dict[str, str]", is_secret: "Callable[[str, str], bool]") -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` split into what a session may start with and what is set once its JVM runs (the
    entries ``is_secret(key, value)`` says hold a secret: on the command line, any local user could
    read them). Each of the second kind must be a ``spark.hadoop.*`` setting (set in the driver's
    Hadoop configuration) or one a running session takes (``spark.sql.*`` and the like)."""
    start, later = {}, {}
    for key, value in conf.items():
        (later if is_secret(key, value) else start)[key] = value
    return start, later
