"""The one error family of the materializer.

Every error names what failed and what to do about it. The CLI maps the classes to exit codes and
prints the message without a traceback; nothing here is meant to be caught and ignored.
"""

from __future__ import annotations


class MaterializerError(Exception):
    """Base class: a user-facing failure with a message that says what to do."""

    exit_code = 1
    transient = False


class ConfigError(MaterializerError):
    """The configuration file is missing or invalid. Nothing was started."""

    exit_code = 2


class SourceError(MaterializerError):
    """Input could not be read or is malformed. Nothing from the transaction was applied."""

    exit_code = 3

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line


class FencedError(MaterializerError):
    """Another writer opened the pipeline; this one stopped and applied nothing more."""

    exit_code = 4


class RecoveryLogError(MaterializerError):
    """The recovery log cannot be read back (a torn or corrupted entry, a gap)."""

    exit_code = 5


class StagingError(MaterializerError):
    """A staged file referenced by a committed entry is missing or damaged."""

    exit_code = 6


class TableStateError(MaterializerError):
    """A Delta table records a state the recovery log cannot explain."""

    exit_code = 7


class StorageError(MaterializerError):
    """A store (local folder or S3) failed; ``transient`` says whether a retry may help."""

    exit_code = 8

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class UnsafePathError(StorageError):
    """A path handed to a store would leave its root (absolute, ``..``, a scheme, an encoded form) or
    pass through a symbolic link: refused before anything was deleted, nothing under a link touched."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class ApplyError(MaterializerError):
    """Delta refused a committed epoch's rows (not a concurrent commit): the pipeline is stuck on it
    until the table is fixed or the epoch is set aside with ``materializer recover --skip-epoch``."""

    exit_code = 9

    def __init__(self, message: str, *, epoch: int, binding: str) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.binding = binding


class StartupError(MaterializerError):
    """Spark could not be started: no Java, a Java it cannot run on, or its jars not reachable.

    Nothing was read or written; the message names the cause and the fix.
    """

    exit_code = 10


class TxnNotRecordedError(MaterializerError):
    """The compute does not record (or refuses) Delta's transaction id on our commits: replays
    would apply twice, so nothing more is applied (DESIGN invariant 13)."""

    exit_code = 11


class CommitConflictError(MaterializerError):
    """Other commits kept winning the race to commit an epoch's apply: retried as Delta's conflict
    rules allow, then stopped. The epoch stays committed in the recovery log, unapplied to this
    table: the next run applies it, once."""

    exit_code = 12
    transient = True

    def __init__(self, message: str, *, epoch: int, binding: str, version: int | None = None, operation: str | None = None) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.binding = binding
        self.version = version
        """The Delta version of the last commit that won (None: the table's history could not be read)."""
        self.operation = operation
