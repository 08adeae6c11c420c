"""Crash injection for tests and drills: ``MATERIALIZER_CRASH_AT=<point>`` or ``<point>:<epoch>``.

At the named point the process SIGKILLs its children (the Spark JVM) and then itself, as a power
cut would: no ``finally``, no flush, no clean-up. ``mid-apply`` and ``mid-load`` fire while the
Spark operation of the MERGE (or of the load join) is under way (:func:`crash_during_spark_job`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENV = "MATERIALIZER_CRASH_AT"

POINTS = (
    "after-stage",  # staged files written, StartedCommit not yet sent
    "after-started-commit",  # runtime has the driver checkpoint, log entry not yet written
    "mid-log-commit",  # entry durable in a temp file, not yet published
    "after-log-commit",  # entry committed, nothing applied
    "mid-apply",  # inside the Spark job of the MERGE
    "after-apply",  # one binding's MERGE committed, others not yet (side by side: maybe mid-MERGE)
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
    for child in _children():
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _children() -> list[int]:
    """This process's descendants (the local Spark JVM), deepest last; psutil if it is there."""
    try:
        import psutil

        return [c.pid for c in psutil.Process().children(recursive=True)]
    except ImportError:  # the tools' extra is not installed: read /proc (Linux)
        pass
    found: list[int] = []
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    kids = [int(k) for k in handle.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def armed(point: str, epoch: int) -> bool:
    target = _target()
    return target is not None and target[0] == point and target[1] in (None, epoch)


def crash_point(point: str, epoch: int) -> None:
    """Die here if ``MATERIALIZER_CRASH_AT`` names this point (and epoch)."""
    if armed(point, epoch):
        kill_now()


IN_FLIGHT_SECONDS = 0.2
"""Without a table folder to watch: how long the operation must have been running before the
watcher fires (Spark Connect has no status tracker; this is after the request was sent and before
its answer came back, so inside the operation)."""


def data_files(location: str) -> set[str]:
    """The table's data files (everything outside ``_delta_log``), for local and S3 tables."""
    from materializer.storage import is_s3, local_path, open_store

    if is_s3(location):
        return {f.path for f in open_store(location).list() if not f.path.startswith("_delta_log/")}
    root = local_path(location)
    if root is None or not os.path.isdir(root):
        return set()
    out = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        out.update(os.path.join(folder, f) for f in files)
    return out


@contextmanager
def crash_during_spark_job(point: str, epoch: int, spark: "SparkSession", tag: str, *, watch: str | None = None) -> Iterator[None]:
    """Within the block, die while the Spark operation tagged ``tag`` is under way, if armed.

    With ``watch`` (a table's location), the watcher fires when the operation's first new data
    file appears there: the MERGE (or append) is writing and has not committed. Otherwise it fires
    once the operation has been running :data:`IN_FLIGHT_SECONDS`. No status tracker, no
    ``sparkContext``: the same on classic Spark and Spark Connect. On Spark Connect the operation
    runs on the server, which a client's death does not stop; so the watcher first interrupts the
    tagged operation (as the loss of the whole cluster would end it), then dies.
    """
    if not armed(point, epoch):
        yield
        return
    from materializer.spark import is_connect

    stop = threading.Event()
    before = data_files(watch) if watch else set()
    started = time.monotonic()

    def fire() -> None:
        if is_connect(spark):
            try:
                spark.interruptTag(tag)
            except Exception:  # noqa: BLE001 - dying anyway
                pass
        kill_now()

    def watcher() -> None:
        while not stop.is_set():
            if watch is not None:
                if data_files(watch) - before:
                    fire()
            elif time.monotonic() - started >= IN_FLIGHT_SECONDS:
                fire()
            time.sleep(0.005)

    thread = threading.Thread(target=watcher, name=f"crash-{point}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
    # The operation finished before the watcher fired (a skipped MERGE writes no file; tiny jobs
    # are quick): die now, still before anything after the Spark operation happens.
    kill_now()
