"""The settings every session the materializer builds carries, held to what they are for."""

from __future__ import annotations

from typing import Any

import pytest


def test_building_a_column_costs_no_call_site_round_trips(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PySpark's DataFrame debugging (on by default) records each Column function's Python call
    site in the JVM: about seven py4j round trips more per function, more than half of an epoch's
    calls to the JVM. The sessions we build turn it off (``BASE_CONF``)."""
    import py4j.clientserver
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    sent: list[str] = []
    original = py4j.clientserver.ClientServerConnection.send_command

    def counted(self: Any, command: str) -> Any:
        sent.append(command)
        return original(self, command)

    F.when(F.col("a").isNull(), F.lit(1)).otherwise(F.col("b"))  # warm: classes looked up once
    monkeypatch.setattr(py4j.clientserver.ClientServerConnection, "send_command", counted)
    for _ in range(10):
        F.when(F.col("a").isNull(), F.lit(1)).otherwise(F.col("b"))
    monkeypatch.undo()
    # Six functions an expression: with the call sites recorded, 54 commands each; without, 14.
    assert len(sent) <= 10 * 20, f"{len(sent) / 10:.0f} py4j commands per expression of six functions"
