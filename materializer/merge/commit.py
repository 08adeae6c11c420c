"""One commit of ours: its properties (``CommitProperties``), Delta's conflicts raised as types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer.delta import user_metadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


CONCURRENT_RETRIES = 3


@dataclass(frozen=True, kw_only=True)
class CommitProperties:
    """Everything about one Delta commit of ours, in one object used by every write path (the
    MERGE, the append, the CREATE, the truncate, the dead letters): deltalake's ``CommitProperties``."""

    txn_app_id: str
    """Delta's ``txnAppId``: the pipeline id. Delta skips a commit whose app id already records a
    version >= :attr:`txn_version` (DESIGN invariant 2)."""
    txn_version: int
    """Delta's ``txnVersion``: the epoch."""
    user_metadata: str
    """The commit's ``userMetadata``: pipeline, binding and epoch, for ``DESCRIBE HISTORY`` (invariant 7)."""
    max_retries: int = CONCURRENT_RETRIES
    """Attempts in all when the commit loses to a concurrent one (each after reading the table again)."""

    @classmethod
    def for_epoch(cls, pipeline_id: str, binding: str, epoch: int, *, max_retries: int = CONCURRENT_RETRIES) -> "CommitProperties":
        return cls(
            txn_app_id=pipeline_id, txn_version=epoch, user_metadata=user_metadata(pipeline_id, binding, epoch),
            max_retries=max_retries,
        )

    def writer_options(self) -> dict[str, str]:
        """The same properties as a DataFrameWriter's options (an append's, a dead-letter append's)."""
        return {"txnAppId": self.txn_app_id, "txnVersion": str(self.txn_version), "userMetadata": self.user_metadata}


def register_conflict_types(spark: "SparkSession") -> None:
    """Have PySpark raise Delta's conflicts as ``delta.exceptions`` types, on either client: the
    classic client's conversion is installed by importing ``delta.exceptions``, Spark Connect's by
    ``delta.connect.exceptions`` (whose classes subclass the same base types). Done when the
    writer is made: imported only when the first conflict is examined, that one would stay a bare
    Py4JJavaError (a racing first CREATE meets it). :func:`materializer.delta.is_commit_conflict`
    also reads Delta's error class, for a server whose classes the client does not map."""
    try:
        import delta.exceptions  # noqa: F401

        from materializer.spark import is_connect

        if is_connect(spark):
            import delta.connect.exceptions  # noqa: F401
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        pass
