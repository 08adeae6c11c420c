"""The materialization protocol of seed 000: messages between the runtime and a driver.

Runtime messages are imperative (``Acknowledge``), driver responses past tense (``Acknowledged``).
One transaction runs::

    Acknowledge -> Acknowledged       epoch N (durable in the recovery log) is applied to the store;
                                      the runtime reads epoch N+1 meanwhile (pipelining)
    Load* -> Flush -> Loaded* Flushed current rows for epoch N+1's keys (read-committed: after N)
    Store*                            the reduced documents of epoch N+1, as DataFrames
    StartCommit -> StartedCommit      the driver stages them durably; its checkpoint goes to the log

The checkpoints are plain models: the runtime checkpoint is opaque to the driver, the driver
checkpoint is opaque to the runtime, and both are committed together in one recovery-log entry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


# --- checkpoints -------------------------------------------------------------------------------

RuntimeCheckpoint = dict[str, Any]
"""Per binding name, where its source stands (documents: file and line; cdcv2: frontier)."""


class StagedFile(Model):
    """One binding's staged output of one epoch."""

    uri: str
    """Staging-store path of the staged Parquet dataset (relative to the staging root)."""
    rows: int
    """Rows in it."""
    bytes: int
    """Total size of its data files; a different size at apply time means damage."""
    files: int
    """Number of data files in it."""
    key_bounds: dict[str, list[str]] | None = None
    """Least and greatest key of its rows per key column (:mod:`materializer.bounds`), added to the
    MERGE condition so Delta skips the table's files outside them; None: not known."""


class DriverCheckpoint(Model):
    """What the driver must still do for an epoch: per binding, the file to apply (None: no rows)."""

    epoch: int
    staged: dict[str, StagedFile | None] = Field(default_factory=dict)
    rewind: RuntimeCheckpoint | None = None
    """Where the sources stood before this epoch: lets a recovery re-stage it from the source."""
    written: list[str] = Field(default_factory=list)
    """Bindings whose tables hold rows of an earlier epoch: their tables must exist."""
    dead_letters: dict[str, StagedFile] = Field(default_factory=dict)
    """Per binding with ``on_invalid: dead_letter``: the epoch's rejected documents, staged, for
    its dead-letter table (applied with the same txn id and epoch as its table)."""
    truncate: list[str] = Field(default_factory=list)
    """Bindings whose table this epoch's apply empties first (``backfill --truncate``), in a
    ``DELETE`` carrying the epoch's txn id, so a replay does not delete again."""
    skipped: dict[str, str] = Field(default_factory=dict)
    """Bindings whose rows of this epoch were set aside by ``recover --skip-epoch``: where they
    were kept. The epoch is recorded on those tables without their rows."""
    templated: dict[str, str] = Field(default_factory=dict)
    """Bindings made from templates that this epoch covers, each with what it was made from
    (``topic:<name>`` or ``folder:<path>``): a replay covers the same set, and a run that no
    longer finds one stops (or drops it) only after applying it. Empty without templates."""
    tables: dict[str, str] = Field(default_factory=dict)
    """Per binding, the table it wrote to (as configured): a binding removed from the configuration
    while this epoch is unapplied is checked against its table at the next Open, so its staged rows
    are never dropped without a word. Empty in older entries."""
    recorded: dict[str, int] | None = None
    """Per binding, the last epoch up to this one whose apply commits to its table (rows staged, dead
    letters, a backfill's truncate, rows set aside by ``recover``): the epoch its table records once
    this one is applied. A binding with nothing for an epoch gets no commit on its table (an empty commit
    per idle table per epoch cost a Delta commit each). None in older entries, whose apply made an
    empty commit on every table, so each recorded every epoch."""
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per binding, the options its rows were staged with that shape its table
    (:func:`materializer.option_changes.table_options`): the next Open compares the configuration
    with them (docs: 'Changing options on a table that exists'). Empty in older entries."""

    def commits_to(self, name: str) -> bool:
        """Whether this epoch's apply commits to binding ``name``'s table (an older entry: to every one)."""
        return (
            self.recorded is None or self.staged.get(name) is not None or name in self.dead_letters
            or name in self.truncate or name in self.skipped
        )

    def table_records(self, name: str) -> int:
        """The epoch binding ``name``'s table records once this epoch is applied (0: none)."""
        return self.epoch if self.recorded is None else self.recorded.get(name, 0)

    @staticmethod
    def carried(before: "DriverCheckpoint | None", epoch: int, commits: "Iterable[str]") -> dict[str, int]:
        """:attr:`recorded` for ``epoch``, whose apply commits to the tables of ``commits``, after
        ``before`` (the previous entry's checkpoint; an older entry's tables recorded its epoch)."""
        if before is None:
            out: dict[str, int] = {}
        elif before.recorded is None:
            # (the tables that existed: an older apply committed to every one of them)
            out = {name: before.epoch for name in {*(n for n, f in before.staged.items() if f is not None), *before.written}}
        else:
            out = dict(before.recorded)
        out.update({name: epoch for name in commits})
        return out


# --- messages ----------------------------------------------------------------------------------


class Open(Model):
    pipeline_id: str
    last_epoch: int
    """Last epoch committed to the recovery log (0: none)."""
    driver_checkpoint: DriverCheckpoint | None
    """The driver checkpoint of that epoch."""


class Opened(Model):
    runtime_checkpoint: RuntimeCheckpoint | None = None
    """An alternative checkpoint to restart from (None: the recovery log's)."""
    orphans_deleted: int = 0


class Acknowledge(Model):
    epoch: int
    driver_checkpoint: DriverCheckpoint


class ApplyResult(Model):
    binding: str
    table: str
    status: Literal["applied", "skipped", "empty", "missing"]
    """applied: a Delta commit was made; skipped: Delta already recorded the epoch (a replay)."""
    rows: int = 0
    delta_version: int | None = None
    metrics: dict[str, int] = Field(default_factory=dict)
    conflicts_retried: int = 0
    """Attempts that lost the race to a concurrent commit and were retried (Delta's conflict rules)."""


class Acknowledged(Model):
    epoch: int
    results: list[ApplyResult]


class Load(Model):
    binding: str
    keys: Any
    """A DataFrame of the epoch's distinct keys for the binding."""


class Flush(Model):
    pass


class Loaded(Model):
    binding: str
    rows: Any
    """A DataFrame of the current rows for the requested keys that exist."""


class Flushed(Model):
    loaded: list[Loaded] = Field(default_factory=list)


class Store(Model):
    binding: str
    documents: Any
    """A DataFrame of the epoch's fully reduced (standard) or combined (delta-updates) rows,
    with the operation in column ``_op`` ('u' upsert, 'd' delete); None: no row this epoch (every
    document a dead letter), its table is not written."""
    rejected: Any = None
    """``on_invalid: dead_letter``: a DataFrame of the epoch's invalid documents (None: none)."""


class StartCommit(Model):
    epoch: int
    runtime_checkpoint: RuntimeCheckpoint
    rewind: RuntimeCheckpoint | None = None


class StartedCommit(Model):
    driver_checkpoint: DriverCheckpoint


# --- the driver side ---------------------------------------------------------------------------


class Driver(ABC):
    """A materialization driver following the "Recovery Log with Idempotent Apply" pattern."""

    def validate(self) -> None:  # noqa: B027 - optional
        """Before Open, so a wrong configuration fences no running writer: the checks of the
        configuration against the session and the catalog that need no recovery log."""

    @abstractmethod
    def open(self, message: Open) -> Opened:
        """Connect; check the tables against the last committed entry; delete staged files that no
        committed entry references."""

    @abstractmethod
    def acknowledge(self, message: Acknowledge) -> Acknowledged:
        """Idempotently apply the committed epoch's staged files; reply once applied."""

    @abstractmethod
    def load(self, message: Load) -> None:
        """Queue keys to load; evaluated at Flush, never before Acknowledged."""

    @abstractmethod
    def flush(self, message: Flush) -> Flushed:
        """Evaluate queued loads (read-committed) and return every row that exists."""

    @abstractmethod
    def store(self, message: Store) -> None:
        """Take the epoch's rows for one binding."""

    @abstractmethod
    def start_commit(self, message: StartCommit) -> StartedCommit:
        """Stage the stored rows durably; return the checkpoint that references them."""

    def prestage(self, message: Store, epoch: int) -> None:  # noqa: B027 - optional
        """Optionally start staging rows that do not depend on the table, before Acknowledged.

        The runtime calls it while the previous epoch is being acknowledged, for bindings with no
        loads, and later sends a Store of the same rows; a driver that ignores it stages at
        StartCommit as usual.
        """

    def discard_prestaged(self) -> None:  # noqa: B027 - optional
        """Drop what :meth:`prestage` staged for a transaction that will not be committed."""

    def keep_alive(self) -> None:  # noqa: B027 - optional
        """Keep what the driver holds open (a Spark Connect server closes a session that has made
        no call for its timeout, an hour by default). Called on a clock from a thread of the
        runtime's own, while the run works and while a following run waits for input."""

    def idle(self) -> None:  # noqa: B027 - optional
        """A following run (``materializer run --follow``) found no new input and waits for some;
        every epoch is applied. A driver may use the wait to get ready for the next epoch, in the
        background (:meth:`close` ends what it started)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; nothing durable depends on it (a crash skips it)."""


def dataframe(value: Any) -> "DataFrame":
    """Narrow a message's DataFrame-valued field for type checkers."""
    return value
