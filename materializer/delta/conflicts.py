"""Delta's errors told apart by type or error class: a commit that lost to a concurrent one."""

from __future__ import annotations


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
