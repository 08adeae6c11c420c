"""What a run did: its epochs, each one's documents and extent, and the re-apply after Open."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from materializer.protocol import Acknowledged


@dataclass
class EpochSummary:
    epoch: int
    documents: dict[str, int]
    """Documents read per binding."""
    description: dict[str, str]
    acknowledged: Acknowledged | None = None


@dataclass
class RunSummary:
    pipeline_id: str
    opened_at_epoch: int
    last_epoch: int = 0
    reapplied: Acknowledged | None = None
    """What the first Acknowledge after Open did with the last run's epoch."""
    orphans_deleted: int = 0
    epochs: list[EpochSummary] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def documents(self) -> int:
        """Documents read by the run, all bindings."""
        return sum(sum(e.documents.values()) for e in self.epochs)

    def to_dict(self) -> dict[str, Any]:
        """The run's summary as JSON fields, built here once: ``materializer run --json`` prints it,
        and it is the ``finished`` line of ``--events jsonl`` and of the Databricks job."""
        return {
            "pipeline_id": self.pipeline_id,
            "opened_at_epoch": self.opened_at_epoch,
            "last_epoch": self.last_epoch,
            "epochs": len(self.epochs),
            "documents": self.documents,
            "reapplied": self.reapplied.model_dump() if self.reapplied else None,
            "seconds": round(self.seconds, 3),
        }
