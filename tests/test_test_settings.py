"""The test-only Spark settings (tests/spark-conf/spark-defaults.conf) reach the shared session.

They are read by spark-submit only if PYSPARK_SUBMIT_ARGS names them before the session's JVM starts; a
session started earlier (or a conftest change) would silently run the tests on Spark's defaults,
with Delta's 10,000-table log cache filling the heap over the full run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DEFAULTS = Path(__file__).parent / "spark-conf" / "spark-defaults.conf"


def _settings() -> dict[str, str]:
    out = {}
    for line in DEFAULTS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split(None, 1)
            out[key] = value.strip()
    return out


def test_the_shared_session_carries_the_test_only_settings(spark) -> None:  # type: ignore[no-untyped-def]
    if os.environ.get("MATERIALIZER_TEST_SPARK_DEFAULTS", "1") == "0":
        pytest.skip("MATERIALIZER_TEST_SPARK_DEFAULTS=0: Spark's defaults on purpose")
    if os.environ.get("PYSPARK_SUBMIT_ARGS") != f"--properties-file {shlex.quote(str(DEFAULTS))} pyspark-shell":
        pytest.skip(f"a PYSPARK_SUBMIT_ARGS or SPARK_CONF_DIR of the developer's own: {os.environ.get('PYSPARK_SUBMIT_ARGS')}")
    settings = _settings()
    assert "spark.databricks.delta.delta.log.cacheSize" in settings
    for key, value in settings.items():
        if key == "spark.driver.memory":
            got = spark.sparkContext.getConf().get(key)
        else:
            got = spark.conf.get(key)
        assert got == value, f"{key}: the shared session has {got!r}, {DEFAULTS.name} says {value!r}"


def test_the_full_runs_xdist_groups_reach_the_scheduler() -> None:
    """CI's full run (`-n 2 --dist loadgroup`) sends a file's tests that share a module fixture to one
    worker, and the Connect and broker tests to one worker each (tests/conftest.py). pytest-xdist
    reads the groups from renamed test ids (`…@group`); when a pytest release stops that (9.2:
    pytest-dev/pytest-xdist#1386) the groups vanish without a word, so this runs a file where two
    of three tests share a module fixture under two workers and looks."""
    pytest.importorskip("xdist")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
         "-o", "addopts=", "tests/test_bundle.py"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d)\].* PASSED (tests/test_bundle.py::\S+)", done.stdout, re.M)
    assert len(ran) == 3, done.stdout[-3000:]
    grouped = [(worker, test) for worker, test in ran if test.endswith("@tests/test_bundle.py")]
    assert len(grouped) == 2, f"the two tests of the module fixture `validator` are not grouped: {ran}"
    assert len({worker for worker, _ in grouped}) == 1, f"one group, several workers: {grouped}"


def test_the_shared_session_runs_the_long_lived_jvms_collector(spark) -> None:  # type: ignore[no-untyped-def]
    """The shared session's JVM gets LONG_LIVED_JVM_OPTIONS (tests/helpers.py), not the CLI runs' C1-only ones."""
    from tests import helpers

    if helpers.OWN_SUBMIT_OPTS is not None or helpers.LONG_LIVED_JVM_OPTIONS != "-XX:+UseParallelGC":
        pytest.skip("a SPARK_SUBMIT_OPTS or MATERIALIZER_TEST_LONG_JVM_OPTIONS of the developer's own")
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" not in arguments, arguments
