"""The ``neighbours`` scenario's maintainer: Delta maintenance (``OPTIMIZE``, ``ZORDER``, ``VACUUM``,
auto compaction turned on) run at the seed's random times on the round's tables, beside the
pipeline's runs and kills, from a session of the drill's own JVM; and the record of each action
(when, which table, what it ran, the Delta versions it made)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from materializer.tools.drill.plan import DrillError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAINTENANCE = ("optimize", "zorder", "vacuum", "vacuum-0", "auto-compact")
"""What the maintainer can run (``--maintenance``): ``OPTIMIZE``; ``OPTIMIZE … ZORDER BY (key)``;
``VACUUM`` (the default retention, 7 days); ``VACUUM … RETAIN 0 HOURS`` (the retention check
turned off for the maintainer's session only); ``delta.autoOptimize.autoCompact`` set on the table
(the pipeline's own writes then compact it)."""

OPERATIONS = {
    "optimize": ("OPTIMIZE",),
    "zorder": ("OPTIMIZE",),
    "vacuum": ("VACUUM START", "VACUUM END"),
    "vacuum-0": ("VACUUM START", "VACUUM END"),
    "auto-compact": ("SET TBLPROPERTIES",),
}
"""The Delta history's operation of each commit an action makes (Delta 4.4: a VACUUM logs two)."""

USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
AUTO_COMPACT_MIN_FILES = "spark.databricks.delta.autoCompact.minNumFiles"
"""Set to 2 on the scratch copy's runs (unless the configuration sets it): Delta's default, 50
small files, is more than a drill's table ever has, so auto compaction would never run."""
GAP = (0.5, 4.0)
"""Seconds between two actions, drawn uniformly (while a round runs)."""


def check_operations(names: list[str] | None) -> list[str]:
    """``--maintenance``'s values (None: all), each known, in the order given."""
    if not names:
        return list(MAINTENANCE)
    unknown = [n for n in names if n not in MAINTENANCE]
    if unknown:
        raise DrillError(f"--maintenance {', '.join(unknown)}: unknown; give one or more of {', '.join(MAINTENANCE)}")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Planned:
    """One action of the seed's schedule."""

    index: int
    gap: float
    """Seconds of a running round after the previous action (or the round's start)."""
    operation: str
    pick: int
    """Which table: this modulo the round's bindings (in the configuration's order)."""


def schedule(seed: int, operations: list[str]) -> Iterator[Planned]:
    """The seed's actions, without end: same seed and operations, same gaps, actions and tables
    (a random of its own, so a seed's kill plan is the ``kills`` scenario's)."""
    rng = random.Random(f"neighbours:{seed}")
    index = 0
    while True:
        index += 1
        yield Planned(index, round(rng.uniform(*GAP), 2), rng.choice(operations), rng.randrange(1 << 16))


@dataclass
class MaintenanceAction:
    index: int
    round: int
    at: float
    """Seconds since the drill started."""
    utc: str
    binding: str
    table: str
    operation: str
    statement: str = ""
    outcome: str = ""
    """``done``; ``failed`` (the maintenance's own error, a conflict say: said, not a drill
    failure); ``no table`` (the round's first epoch had not created it yet: nothing ran)."""
    versions: list[int] = field(default_factory=list)
    """The Delta versions it made (found in the history by their ``userMetadata``)."""
    error: str = ""
    seconds: float = 0.0
    run: int | None = None
    """The pipeline's run going on when it began (None: between runs)."""


def statement(operation: str, table_sql: str, key: list[str]) -> str:
    from materializer.delta import quote

    if operation == "optimize":
        return f"OPTIMIZE {table_sql}"
    if operation == "zorder":
        return f"OPTIMIZE {table_sql} ZORDER BY ({', '.join(quote(k) for k in key)})"
    if operation == "vacuum":
        return f"VACUUM {table_sql}"
    if operation == "vacuum-0":
        return f"VACUUM {table_sql} RETAIN 0 HOURS"
    if operation == "auto-compact":
        return f"ALTER TABLE {table_sql} SET TBLPROPERTIES ('delta.autoOptimize.autoCompact' = 'true')"
    raise DrillError(f"unknown maintenance {operation!r}")


class Maintainer:
    """A thread of the drill's process that runs the schedule on the tables of the round going on.

    ``session()`` gives the drill's SparkSession (started on first use); the maintainer works in
    a session of its own on the same JVM (``newSession``: its own SQL settings, so the retention
    check it turns off and the ``userMetadata`` it tags commits with are never the verification's,
    and never the pipeline's, which runs in another process). It acts only while a round is
    active (:meth:`activate`); :meth:`pause` waits for the action going on to end.
    """

    def __init__(
        self, session: Callable[[], "SparkSession"], seed: int, operations: list[str],
        round_tables: Callable[[], tuple[int, list[Any]]], live_run: Callable[[], int | None], started: float,
    ) -> None:
        self._session = session
        self._spark: "SparkSession | None" = None
        self.operations = operations
        self.round_tables = round_tables
        self.live_run = live_run
        self.started = started
        self.plan = schedule(seed, operations)
        self.actions: list[MaintenanceAction] = []
        self.drawn: list[Planned] = []
        """The schedule drawn so far (the report prints it: gap, action, table pick of each)."""
        self.crashed = ""
        """The maintainer's own error, if it stopped (the drill fails: the schedule was not run)."""
        self._lock = threading.Lock()
        self._active = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="drill-maintainer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def activate(self) -> None:
        self._active.set()

    def pause(self) -> None:
        """No action from now until :meth:`activate`; returns when the one going on has ended."""
        self._active.clear()
        with self._lock:
            pass

    def stop(self) -> None:
        self._stop.set()
        self._active.set()  # (wakes a paused loop so it sees the stop)
        self._thread.join(timeout=600)

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds`` of active rounds; False when stopped."""
        left = seconds
        while left > 0:
            if self._stop.is_set():
                return False
            if not self._active.wait(timeout=0.5):
                continue
            step = min(0.1, left)
            if self._stop.wait(step):
                return False
            left -= step
        return not self._stop.is_set()

    def _loop(self) -> None:
        try:
            for planned in self.plan:
                self.drawn.append(planned)
                if not self._wait(planned.gap):
                    return
                with self._lock:
                    if self._stop.is_set():
                        return
                    if not self._active.is_set():
                        continue  # paused while the gap ended: this action is not made (said by its index)
                    self.actions.append(self._perform(planned))
        except Exception as exc:  # noqa: BLE001 - said in the report; the drill fails
            self.crashed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:500] if str(exc) else ''}"

    def spark(self) -> "SparkSession":
        if self._spark is None:
            spark = self._session().newSession()
            # Its jobs are a few small tables': fewer shuffle tasks than the drill's session
            # (a VACUUM's listing took a minute on two busy cores with one task a core).
            spark.conf.set("spark.sql.shuffle.partitions", "1")
            spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "1")
            self._spark = spark
        return self._spark

    def _perform(self, planned: Planned) -> MaintenanceAction:
        from materializer.delta import sql_name, table_version
        from materializer.tables import TableRef

        spark = self.spark()
        round_no, bindings = self.round_tables()
        binding = bindings[planned.pick % len(bindings)]
        ref = TableRef(binding.table)
        action = MaintenanceAction(
            index=planned.index, round=round_no, at=round(time.monotonic() - self.started, 2),
            utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), binding=binding.name, table=str(ref),
            operation=planned.operation, run=self.live_run(),
        )
        before = table_version(spark, ref)
        if before is None:
            action.outcome = "no table"
            return action
        action.statement = statement(planned.operation, sql_name(ref), list(binding.key))
        tag = f"materializer-drill maintenance #{planned.index}"
        began = time.monotonic()
        spark.conf.set(USER_METADATA, tag)
        if planned.operation == "vacuum-0":
            spark.conf.set(RETENTION_CHECK, "false")
        try:
            spark.sql(action.statement).collect()
            action.outcome = "done"
        except Exception as exc:  # noqa: BLE001 - the neighbour's own failure (a conflict): said
            action.outcome = "failed"
            from materializer.delta import error_condition
            from materializer.merge.failures import cause

            condition = error_condition(exc)
            action.error = (f"{condition}: " if condition and condition not in cause(exc) else "") + cause(exc)
        finally:
            spark.conf.unset(USER_METADATA)
            spark.conf.unset(RETENTION_CHECK)
        action.seconds = round(time.monotonic() - began, 2)
        rows = spark.sql(f"DESCRIBE HISTORY {sql_name(ref)}").select("version", "operation", "userMetadata").collect()
        action.versions = sorted(
            int(r["version"]) for r in rows
            if r["version"] > before and r["userMetadata"] == tag and r["operation"] in OPERATIONS[planned.operation]
        )
        return action
