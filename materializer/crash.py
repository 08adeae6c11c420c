"""Crash injection for tests and drills: ``MATERIALIZER_CRASH_AT=<point>`` or ``<point>:<epoch>``.

At the named point the process SIGKILLs its children (the Spark JVM) and then itself, as a power
cut would: no ``finally``, no flush, no clean-up. ``mid-apply`` and ``mid-load`` fire while the
Spark job of the MERGE (or of the load join) is running.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pyspark import SparkContext

ENV = "MATERIALIZER_CRASH_AT"

POINTS = (
    "after-stage",  # staged files written, StartedCommit not yet sent
    "after-started-commit",  # runtime has the driver checkpoint, log entry not yet written
    "mid-log-commit",  # entry durable in a temp file, not yet published
    "after-log-commit",  # entry committed, nothing applied
    "mid-apply",  # inside the Spark job of the MERGE
    "after-apply",  # one binding's MERGE committed, the next binding not yet applied
    "after-ack-before-gc",  # every binding applied, staged files not yet deleted
    "mid-load",  # inside the Spark job that loads current rows
)


def parse(value: str | None) -> tuple[str, int | None] | None:
    if not value:
        return None
    point, _, epoch = value.partition(":")
    if point not in POINTS:
        raise ValueError(f"{ENV}={value!r}: unknown point {point!r}; known points: {', '.join(POINTS)}")
    return point, (int(epoch) if epoch else None)


def _target() -> tuple[str, int | None] | None:
    return parse(os.environ.get(ENV))


def kill_now() -> None:
    """SIGKILL the JVM and every other child, then this process."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except ImportError:  # pragma: no cover - psutil is a dependency
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def armed(point: str, epoch: int) -> bool:
    target = _target()
    return target is not None and target[0] == point and target[1] in (None, epoch)


def crash_point(point: str, epoch: int) -> None:
    """Die here if ``MATERIALIZER_CRASH_AT`` names this point (and epoch)."""
    if armed(point, epoch):
        kill_now()


@contextmanager
def crash_during_spark_job(point: str, epoch: int, sc: "SparkContext", job_group: str) -> Iterator[None]:
    """Within the block, die as soon as a Spark job of ``job_group`` is running, if armed."""
    if not armed(point, epoch):
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        tracker = sc.statusTracker()
        while not stop.is_set():
            for job_id in tracker.getJobIdsForGroup(job_group):
                info = tracker.getJobInfo(job_id)
                if info is not None and info.status == "RUNNING":
                    kill_now()
            time.sleep(0.005)

    thread = threading.Thread(target=watch, name=f"crash-{point}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
    # The job finished before the watcher saw it run (tiny jobs can): die now, still before
    # anything after the Spark job happens.
    kill_now()
