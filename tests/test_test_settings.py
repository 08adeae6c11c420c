"""The test-only Spark settings (tests/spark-conf/spark-defaults.conf) reach the shared session.

They are read by spark-submit only if SPARK_CONF_DIR is set before the session's JVM starts; a
session started earlier (or a conftest change) would silently run the tests on Spark's defaults,
with Delta's 10,000-table log cache filling the heap over the full run."""

from __future__ import annotations

import os
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
    if Path(os.environ.get("SPARK_CONF_DIR", "")).resolve() != DEFAULTS.parent.resolve():
        pytest.skip(f"a SPARK_CONF_DIR of the developer's own: {os.environ.get('SPARK_CONF_DIR')}")
    settings = _settings()
    assert "spark.databricks.delta.delta.log.cacheSize" in settings
    for key, value in settings.items():
        if key == "spark.driver.memory":
            got = spark.sparkContext.getConf().get(key)
        else:
            got = spark.conf.get(key)
        assert got == value, f"{key}: the shared session has {got!r}, {DEFAULTS.name} says {value!r}"
