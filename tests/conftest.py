"""One SparkSession for every integration test of the run (JVM start-up is the slow part)."""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from materializer.spark import build_session

    warehouse = tmp_path_factory.mktemp("warehouse")
    # Spark's Kafka connector only when a selected test needs it (one JVM, its jars fixed at start).
    kafka = any(item.get_closest_marker("kafka") for item in request.session.items)
    session = build_session(
        "local[2]",
        {"spark.sql.shuffle.partitions": "2", "spark.sql.warehouse.dir": str(warehouse)},
        app_name="materializer-tests",
        kafka=kafka,
    )
    yield session
    session.stop()
