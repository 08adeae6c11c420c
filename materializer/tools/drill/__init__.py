"""Recovery drills: kill the real ``materializer run`` over and over, then prove nothing was lost.

A drill never touches the pipeline it is given. It copies the configuration into a scratch folder
(``--workdir``, a temp folder by default) with the recovery log, the staging store and every table
rewritten to live there; the sources are only read (their files are immutable). Then:

``kills`` (the default scenario)
    runs ``python -m materializer_cli run --config <scratch>`` in its own process group, once per planned
    kill: first one kill at each named failure point (``MATERIALIZER_CRASH_AT``, so successive
    restarts chain through the points on one pipeline), then ``--kills`` random SIGKILLs of the
    whole group (the JVM included), most of them timed after an epoch's log commit so they land
    while the MERGE runs. It restarts until a run exits 0 (sources drained). If the sources drain
    before the plan is done, the round is verified and a fresh round starts.
``zombie``
    two runs of one pipeline at once: A is paused (SIGSTOP) right after committing an epoch, B
    opens (fencing A), runs to the end; A is resumed (SIGCONT) and must stop with FencedError
    (exit 4) having applied nothing more.
``damage``
    damages the recovery log (a torn entry, a corrupted one) and the staging store (a staged file
    deleted, one truncated) right before their apply; each must stop the next run with its error
    (exit 5 / 6, never a silent skip), then ``materializer recover`` must repair it, and the final
    tables must equal the oracle.
``neighbours``
    the ``kills`` plan with a maintainer beside it (a thread of the drill with a session of the
    drill's own JVM): ``OPTIMIZE``, ``OPTIMIZE … ZORDER BY (key)``, ``VACUUM`` (the default
    retention, and ``RETAIN 0 HOURS`` with the retention check off for its session only) and
    ``delta.autoOptimize.autoCompact`` turned on, on the round's tables at the seed's random
    times; each action is reported with the Delta versions it made, and a run that stops with an
    error instead of being killed or finishing is a FAIL naming the action before it.

Every round is verified the same way (:func:`verify`): each table against the oracle (rows lost,
duplicated or wrong, by key), each epoch at most once in each table's Delta history, the epoch the
table records against the recovery log's, no orphaned staged file, and a log that reads back whole.

The package, one job a module (each imports only those listed after it):

* :mod:`~materializer.tools.drill.scenarios`: the :class:`Drill`: rounds, and the three scenarios;
* :mod:`~materializer.tools.drill.resume`: a drill stopped early, read back from its report to go on;
* :mod:`~materializer.tools.drill.report`: the drill's events and its report, with the verdict;
* :mod:`~materializer.tools.drill.kill`: one run of the real CLI, followed by its events and killed;
* :mod:`~materializer.tools.drill.verification`: a round checked against the oracle, with delta-rs or Spark;
* :mod:`~materializer.tools.drill.damage`: the harm the ``damage`` scenario does to log and staging;
* :mod:`~materializer.tools.drill.maintenance`: the ``neighbours`` scenario's maintainer and its actions;
* :mod:`~materializer.tools.drill.plan`: options, kill plans, windows, the scratch copy, epoch sizes.
"""

from __future__ import annotations

from materializer.tools.drill.damage import DAMAGES, do_damage
from materializer.tools.drill.kill import (
    KILLED,
    REPO,
    RUN_EVENTS,
    Child,
    RunPhase,
    RunRecord,
    child_env,
    kill_live,
    read_event,
    run_once,
)
from materializer.tools.drill.maintenance import MAINTENANCE, Maintainer, MaintenanceAction, check_operations, schedule
from materializer.tools.drill.plan import (
    BETWEEN_BINDINGS,
    BETWEEN_EPOCHS,
    OVERLAP,
    SCENARIOS,
    WINDOWS,
    DrillError,
    DrillOptions,
    EpochSizes,
    Plan,
    epoch_sizes,
    known_bindings,
    scratch_config,
    scratch_notes,
    unreachable_points,
)
from materializer.tools.drill.report import (
    Damaged,
    DrillReport,
    RoundStarted,
    RunEnded,
    RunStarted,
    Verified,
    Verifying,
)
from materializer.tools.drill.scenarios import Drill
from materializer.tools.drill.verification import TableCheck, Verification, verify

__all__ = [
    "BETWEEN_BINDINGS", "BETWEEN_EPOCHS", "DAMAGES", "KILLED", "MAINTENANCE", "Maintainer", "MaintenanceAction",
    "check_operations", "schedule", "OVERLAP", "REPO", "RUN_EVENTS", "SCENARIOS", "WINDOWS",
    "Child", "Damaged", "Drill", "DrillError", "DrillOptions", "DrillReport", "EpochSizes", "Plan", "RoundStarted",
    "RunEnded", "RunPhase", "RunRecord", "RunStarted", "TableCheck", "Verification", "Verified", "Verifying",
    "child_env", "do_damage", "epoch_sizes", "kill_live", "read_event", "run_once", "scratch_config",
    "unreachable_points", "verify", "known_bindings", "scratch_notes",
]
