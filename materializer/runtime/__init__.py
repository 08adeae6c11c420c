"""The runtime: the transaction loop of DESIGN.md, driving a driver through the seed's phases.

::

    validate    the driver checks the configuration (before the log, so nothing is fenced)
    Open        read the log's last commit (epoch N); publish a fencing entry
    Opened      the driver checks the tables against the log, deletes orphaned staged files
    loop:
      Acknowledge N                   apply epoch N, on a background thread (on the first loop:
                                      the re-apply after Open)
      meanwhile: read the sources' next batch; combine and prestage the rows of bindings that
                 need no loads (they do not depend on the table)
      Acknowledged                    wait for the apply; if there was no batch: stop (or wait,
                                      with --follow)
      Load* / Flush -> Flushed        current rows of the batch's keys (standard mode, reductions)
      Store*                          the reduced rows of epoch N+1
      StartCommit -> StartedCommit    the driver stages them durably
      commit entry N+1 = {runtime checkpoint, driver checkpoint} to the recovery log

This is seed 000's pipelining: the driver applies epoch N in the background while the runtime
reads and combines N+1; Flush (so every load) and the log commit of N+1 wait for Acknowledged,
which keeps loads read-committed and the log one epoch ahead of the tables at most. With
``transaction.pipelined: false`` the apply runs in the foreground, before the next read.

:class:`BackgroundApply` is the apply thread; :class:`EpochStager` is one epoch's staging (read,
Load*/Flush, Store*, StartCommit, verify), which ``recover`` reuses to re-stage a lost epoch.

The package, one job a module (each imports only those listed after it):

* :mod:`~materializer.runtime.templated`: :class:`TemplatedRuntime`, rounds of :class:`Runtime` over
  the bindings templates make; ``open_runtime`` (which loop a pipeline runs); ``as_recorded``;
* :mod:`~materializer.runtime.loop`: :class:`Runtime`, the loop above;
* :mod:`~materializer.runtime.stager`: :class:`EpochStager`, one epoch's staging;
* :mod:`~materializer.runtime.apply`: :class:`BackgroundApply`, the apply thread;
* :mod:`~materializer.runtime.summary`: ``RunSummary`` and ``EpochSummary``, what a run did.

Every name the CLI, the tools, the Databricks job, tests and docs import is re-exported here.
"""

from __future__ import annotations

from materializer.runtime.apply import BackgroundApply
from materializer.runtime.loop import Runtime
from materializer.runtime.stager import EpochStager, advanced
from materializer.runtime.summary import EpochSummary, RunSummary
from materializer.runtime.templated import TemplatedRuntime, as_recorded, open_runtime

__all__ = [
    "BackgroundApply",
    "EpochStager",
    "EpochSummary",
    "RunSummary",
    "Runtime",
    "TemplatedRuntime",
    "advanced",
    "as_recorded",
    "open_runtime",
]
