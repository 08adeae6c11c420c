"""An epoch's bindings side by side: one piece of work per binding, a few threads at a time.

The driver stages, checks and applies an epoch's bindings with :func:`run_each`
(``transaction.parallel_bindings`` threads). What the exactly-once argument needs from it:

* a failure stops the epoch: no further binding starts, the ones in flight run to their end (a
  Delta commit is whole or absent, a staged dataset is named only once written), and only then is
  the failure raised: of the earliest binding in binding order that failed, so the message names
  it and nothing of this epoch is still running when the caller reacts (deleting staged files,
  stopping the run);
* the caller's ``after_each`` runs on the calling thread after each success while other items
  are unfinished: the crash point between tables (``after-apply``);
* each running item holds a *slot* (0 … workers-1) of its own, so per-worker resources (an apply
  SparkSession, whose txn confs are session-wide) are never shared by two items at once.

With one worker (or one item) the items run one after another on the calling thread, in order:
exactly the sequential loop this replaced.
"""

from __future__ import annotations

import math
import os
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_each(
    items: Sequence[T],
    work: Callable[[T, int], R],
    *,
    workers: int,
    name: str = "materializer-binding",
    after_each: Callable[[T, R, int], None] | None = None,
    label: Callable[[T], str] | None = None,
) -> list[R]:
    """``work(item, slot)`` for every item, at most ``workers`` at once; the results in item order.

    ``after_each(item, result, unfinished)`` is called on this thread after each item that
    succeeded, with the number of items not finished yet (in flight or not started); it is not
    called once an item has failed. See the module docstring for what a failure does.
    ``label(item)`` names the item in a note added to an error that is not the materializer's own
    (whose messages name their binding already).
    """
    if label is not None:
        work = _noting(work, label)
    if workers <= 1 or len(items) <= 1:
        results: list[R] = []
        for index, item in enumerate(items):
            result = work(item, 0)
            results.append(result)
            if after_each is not None:
                after_each(item, result, len(items) - index - 1)
        return results

    todo = deque(enumerate(items))
    free = list(range(min(workers, len(items))))
    running: dict[Future[R], tuple[int, int]] = {}
    done_results: dict[int, R] = {}
    failures: dict[int, BaseException] = {}
    pool = ThreadPoolExecutor(max_workers=len(free), thread_name_prefix=name)
    try:
        while todo or running:
            while todo and free and not failures:
                index, item = todo.popleft()
                slot = free.pop(0)
                running[pool.submit(work, item, slot)] = (index, slot)
            if not running:
                break  # a failure left items unstarted: they stay so
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=lambda f: running[f][0]):
                index, slot = running.pop(future)
                free.append(slot)
                error = future.exception()
                if error is not None:
                    failures[index] = error
                    continue
                done_results[index] = future.result()
                if after_each is not None and not failures:
                    after_each(items[index], done_results[index], len(todo) + len(running))
    finally:
        # Also when after_each raised: the items in flight end before anything else happens.
        pool.shutdown(wait=True, cancel_futures=True)
    if failures:
        raise failures[min(failures)]
    return [done_results[index] for index in range(len(items))]


def _noting(work: Callable[[T, int], R], label: Callable[[T], str]) -> Callable[[T, int], R]:
    from materializer.errors import MaterializerError

    def noted(item: T, slot: int) -> R:
        try:
            return work(item, slot)
        except Exception as exc:
            if not isinstance(exc, MaterializerError):
                exc.add_note(f"while working on {label(item)}")
            raise

    return noted


MOST_BY_DEFAULT = 8
"""``transaction.parallel_bindings: auto`` never picks more threads than this."""


def machine_cores() -> int:
    """The cores this process may use: its CPU affinity, bounded by a cgroup v2 CPU quota (a
    container's ``--cpus``, a Kubernetes pod's CPU limit) where one is set, as the JVM counts them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def workers_for(setting: "int | str", *, connect: bool, cores: Callable[[], int] = machine_cores) -> int:
    """The threads ``transaction.parallel_bindings`` asks for. ``auto``: half the driver machine's
    cores (an apply's planning and Delta's commit are the driver's work, and the next epoch's
    reading takes its share), at least 1 and at most :data:`MOST_BY_DEFAULT`; over Spark Connect
    1, since the client cannot see the server's cores."""
    if setting != "auto":
        return int(setting)
    if connect:
        return 1
    return max(1, min(MOST_BY_DEFAULT, cores() // 2))
