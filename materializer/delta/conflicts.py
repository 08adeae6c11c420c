"""Delta's errors told apart by type or error class: a commit that lost to a concurrent one, the
commit that won, and whether a retry may write after it."""

from __future__ import annotations

from dataclasses import dataclass


_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")


def is_commit_conflict(exc: BaseException) -> bool:
    """Did a Delta commit lose to a concurrent one (so reading the table again and retrying helps)?

    By type (``delta.exceptions``: the classic client's conversion, and on Spark Connect
    ``delta.connect.exceptions``' subclasses of the same types, both registered by
    :class:`materializer.merge.DeltaWriter`), or by Delta's error class (a server error the
    client maps to no type), never by words in the message: a message quotes JVM stack frames
    from ``java.util.concurrent`` whatever the failure was.
    """
    try:
        import delta.exceptions as conflicts

        if isinstance(exc, tuple(getattr(conflicts, name) for name in conflicts.__all__)):
            return True
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        pass
    condition = error_condition(exc)
    return condition is not None and condition.startswith(_CONFLICT_CONDITIONS)


def error_condition(exc: BaseException) -> str | None:
    """Spark's/Delta's error class of ``exc`` (``getCondition``, or ``getErrorClass`` before
    Spark 4), on classic Spark and Spark Connect alike; None when it has none."""
    for getter in ("getCondition", "getErrorClass"):
        method = getattr(exc, getter, None)
        if method is None:
            continue
        try:
            condition = method()
        except Exception:  # noqa: BLE001 - an exception without an error class
            condition = None
        if condition:
            return str(condition)
    return None


# --- which commit won, and whether a retry may write after it ------------------------------------

ROW_OPERATIONS = frozenset({
    "WRITE", "DELETE", "UPDATE", "MERGE", "STREAMING UPDATE", "TRUNCATE", "COPY INTO", "RESTORE",
    "CREATE OR REPLACE TABLE", "CREATE OR REPLACE TABLE AS SELECT", "REPLACE TABLE", "REPLACE TABLE AS SELECT",
    "CREATE TABLE AS SELECT",
})
"""Operations that change rows, as ``DESCRIBE HISTORY`` names them (the same list as the driver's
check of others' commits at Open, ``materializer.driver.table_changes``): a compaction (OPTIMIZE,
REORG), VACUUM or an ALTER that wins a race against our MERGE changes no row the MERGE read."""


@dataclass(frozen=True)
class OtherCommit:
    """A commit made to the table after the version an apply read: what an error names."""

    version: int
    operation: str
    user_metadata: str | None = None
    engine_info: str | None = None
    pipeline: str | None = None
    """The pipeline whose tag (``userMetadata``) the commit carries; None for anyone else's."""

    @property
    def changes_rows(self) -> bool:
        return self.operation in ROW_OPERATIONS

    def shown(self) -> str:
        """``version 7 (UPDATE, engineInfo 'Apache-Spark/4.0 Delta-Lake/4.0', userMetadata 'x')``."""
        said = [self.operation or "an operation the history does not name"]
        if self.engine_info:
            said.append(f"engineInfo {self.engine_info!r}")
        if self.user_metadata:
            said.append(f"userMetadata {self.user_metadata!r}")
        return f"version {self.version} ({', '.join(said)})"


def conflict_name(exc: BaseException) -> str:
    """The conflict's name as Delta gives it: its ``delta.exceptions`` type (the classic client's
    ``ConcurrentDeleteReadException``), else its error class (``DELTA_CONCURRENT_DELETE_READ``)."""
    try:
        import delta.exceptions as conflicts

        for name in conflicts.__all__:
            if name != "DeltaConcurrentModificationException" and isinstance(exc, getattr(conflicts, name)):
                return name
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        pass
    return error_condition(exc) or type(exc).__name__


def blocking_commit(others: list[OtherCommit], *, pipeline: str, others_may_write: bool) -> OtherCommit | None:
    """Of the commits that won over an apply, the one a retry must not write after; None when a
    retry (the table read again, the MERGE planned again on it) is Delta's own answer.

    Every conflict Delta raises (Concurrent{Append,DeleteRead,DeleteDelete,Write,Transaction}Exception,
    Metadata/ProtocolChangedException) means only that the snapshot the MERGE read is stale. The
    staged rows do not depend on it, so the MERGE made again on the new snapshot lands them as it
    would have: over a compaction, a VACUUM, an ALTER (the rows are aligned to the new schema), a
    zombie of this pipeline (the table then records the epoch, and the retry is skipped), or a
    person's DELETE or UPDATE, which ``others_may_write: true`` makes part of the table. A retry
    cannot keep ``others_may_write: false``: its MERGE would write over rows someone else changed,
    the data conflict that binding stops at (as Open does for a commit made between runs)."""
    if others_may_write:
        return None
    return next((c for c in others if c.changes_rows and c.pipeline != pipeline), None)
