"""The runtime's threads: Acknowledge of epoch N in the background while it reads N+1, and the
keep-alive of the driver's Spark sessions."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from materializer.protocol import Acknowledged, DriverCheckpoint

log = logging.getLogger(__name__)


class BackgroundApply:
    """Acknowledge on a thread of its own (seed 000's pipelining): epoch N is applied while the
    runtime reads N+1. At most one apply is under way; :meth:`wait` is the Acknowledged.
    Not pipelined (``transaction.pipelined: false``), :meth:`start` waits for the apply itself."""

    def __init__(self, acknowledge: Callable[[int, DriverCheckpoint, bool], Acknowledged], *, pipelined: bool) -> None:
        self._acknowledge = acknowledge
        self._pipelined = pipelined
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="materializer-apply")
        self._running: tuple[Future[Acknowledged], Callable[[Acknowledged], None]] | None = None

    @property
    def running(self) -> bool:
        """An Acknowledge was started and not waited for."""
        return self._running is not None

    def start(self, epoch: int, checkpoint: DriverCheckpoint, *, first: bool, report: Callable[[Acknowledged], None]) -> None:
        """Acknowledge ``epoch``; ``report`` gets its Acknowledged when it is waited for."""
        assert self._running is None, "one apply at a time (DESIGN invariant 2)"
        self._running = (self._executor.submit(self._acknowledge, epoch, checkpoint, first), report)
        if not self._pipelined:
            self.wait()

    def wait(self) -> None:
        """Acknowledged: wait for the running Acknowledge, if any; its error, if any, is raised here."""
        if self._running is None:
            return
        (future, report), self._running = self._running, None
        report(future.result())

    def close(self) -> None:
        """Leaving (on an error too): let a running apply finish (a committed epoch), quietly."""
        if self._running is not None:
            future, self._running = self._running[0], None
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - the error already being raised wins
                pass
        self._executor.shutdown(wait=True)


class KeepAlive:
    """A daemon thread that calls ``touch`` every ``seconds`` for as long as a run lasts.

    A Spark Connect server closes a session that has made no call for its timeout (an hour by
    default). A run's sessions are not all busy at once: the apply sessions are idle while a long
    epoch is read and staged, and every session is idle while a following run waits for input.
    Touching them on a clock, not between the loop's steps, keeps them open through both. A failed
    touch is not an error of the run: the next real call says what is wrong."""

    def __init__(self, touch: Callable[[], None], seconds: float) -> None:
        self._touch = touch
        self._seconds = seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="materializer-keep-alive", daemon=True)

    def start(self) -> "KeepAlive":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop touching (before the driver closes its sessions)."""
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._seconds):
            try:
                self._touch()
            except Exception as exc:  # noqa: BLE001 - see the class's docstring
                log.debug("keep-alive failed: %s", exc)
