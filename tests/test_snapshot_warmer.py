"""The read ahead of a following run's snapshots (materializer.merge.warm), without a JVM: a fake
session whose ``sql`` records the statement and can be held, to see the queue from outside."""

from __future__ import annotations

import threading
from typing import Any

from materializer.delta import TableRef
from materializer.events import Span
from materializer.merge import SnapshotWarmer
from materializer.progress import ListCollector
from materializer.spark.settings import INTERPRETED
from tests.helpers import FakeConf


class Session:
    """A classic session's stand-in: ``newSession`` gives a sibling sharing ``ran`` and ``hold``."""

    def __init__(self, ran: list[str] | None = None, hold: threading.Event | None = None) -> None:
        self.conf = FakeConf()
        self.ran = [] if ran is None else ran
        self.hold = hold or threading.Event()
        self.siblings: list[Session] = []

    def newSession(self) -> "Session":  # noqa: N802 - pyspark's name
        sibling = Session(self.ran, self.hold)
        self.siblings.append(sibling)
        return sibling

    def sql(self, statement: str) -> Any:
        self.ran.append(statement)
        self.hold.wait(10)
        failed = "nowhere" in statement
        text = "Error occurred during query planning: \n[DELTA_TABLE_NOT_FOUND] no table" if failed else "== Physical Plan =="

        class Rows:
            def collect(self) -> list[tuple[str]]:
                return [(text,)]

        return Rows()


def _spans(collector: ListCollector) -> list[tuple[str | None, bool]]:
    return [(s.binding, s.ok) for s in collector.of(Span) if s.name == "warm_snapshot"]


def _started(spark: Session) -> None:
    for _ in range(500):
        if spark.ran:
            return
        threading.Event().wait(0.01)


def test_warms_run_one_at_a_time_and_a_table_waiting_is_queued_once() -> None:
    spark, collector = Session(), ListCollector()
    warmer = SnapshotWarmer(collector)
    for name in ("a", "b", "b", "c"):
        warmer.warm(spark, TableRef(f"/t/{name}"), 1, name)  # type: ignore[arg-type]
    _started(spark)
    assert spark.ran == ["EXPLAIN SELECT * FROM delta.`/t/a`"]  # the others wait their turn
    spark.hold.set()
    for _ in range(500):  # (close would drop those not started)
        if len(_spans(collector)) == 3:
            break
        threading.Event().wait(0.01)
    warmer.close()
    assert spark.ran == [f"EXPLAIN SELECT * FROM delta.`/t/{n}`" for n in "abc"]
    assert _spans(collector) == [("a", True), ("b", True), ("c", True)]
    # In a session of its own, interpreted; the applying session's settings untouched.
    (own,) = spark.siblings
    assert own.conf.values == INTERPRETED and spark.conf.values == {}


def test_an_epochs_applies_drop_the_warms_not_started() -> None:
    spark, collector = Session(), ListCollector()
    warmer = SnapshotWarmer(collector)
    for name in ("a", "b", "c"):
        warmer.warm(spark, TableRef(f"/t/{name}"), 1, name)  # type: ignore[arg-type]
    _started(spark)
    warmer.drop_queued()  # what DeltaDriver.acknowledge does first
    spark.hold.set()
    warmer.close()
    assert spark.ran == ["EXPLAIN SELECT * FROM delta.`/t/a`"] and _spans(collector) == [("a", True)]


def test_a_failure_is_a_failed_span_and_a_closed_warmer_takes_no_more() -> None:
    spark, collector = Session(), ListCollector()
    spark.hold.set()
    warmer = SnapshotWarmer(collector)
    warmer.warm(spark, TableRef("/t/nowhere"), 2, "gone")  # type: ignore[arg-type]
    warmer.close()
    warmer.warm(spark, TableRef("/t/a"), 3, "a")  # type: ignore[arg-type]
    assert _spans(collector) == [("gone", False)]
    assert spark.ran == ["EXPLAIN SELECT * FROM delta.`/t/nowhere`"]
