"""The jars a local session needs: Delta for the installed Spark, hadoop-aws, Kafka's connector."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


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


def ivy_cache() -> Path:
    return Path(os.environ.get("MATERIALIZER_IVY_CACHE", Path.home() / ".cache" / "materializer" / "ivy"))


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
