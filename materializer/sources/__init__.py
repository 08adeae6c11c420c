"""Sources: where a binding's changes come from, read a transaction at a time.

A source turns its runtime checkpoint into the next batch of documents, as a DataFrame with the
document's fields plus two columns the runtime relies on: ``_op`` ('u' upsert, 'd' delete) and
``_seq`` (order within the batch; later wins). ``_seq`` is any orderable Spark type, unique per
document of the batch: a long for cdcv2, ``struct(file, block, row)`` for documents,
``struct(topic, partition, offset)`` for kafka; reductions
compare it as it is and never cast it. The checkpoint after the batch is returned with it
and committed with the epoch, never before. The two column names are
:data:`materializer.columns.OP` and :data:`materializer.columns.SEQ`.

This module is the interface every source implements and imports; which class reads a binding's
format is :func:`materializer.sources.formats.open_source`, kept apart so that no source reaches
another through this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from materializer.config import BindingConfig
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class SourceBatch:
    documents: "DataFrame | None"
    """The batch's documents: fields, ``_op``, ``_seq``. None: it has none to stage (every one was
    set aside as a dead letter), though its position and its dead letters are committed."""
    checkpoint: dict[str, Any]
    """Where the source stands after this batch."""
    count: int
    """Number of documents (or updates) in the batch."""
    description: str
    """Human-readable extent, e.g. ``orders-001.jsonl:0-500``."""
    explain: "Callable[[BaseException], Exception | None] | None" = None
    """Turns a Spark failure while the batch's rows are computed into an error naming the source
    file and line (None: not about this batch's input)."""
    lag: dict[str, int | float | None] | None = None
    """What the source still holds after this batch: ``{"files": n, "bytes": n, "seconds": s}``
    (``seconds``: how old the oldest input not read is), for kafka ``{"records": n}`` (None: unknown)."""
    verify: "Callable[[], int] | None" = None
    """Checks deferred to the staging job (None: ``documents`` is already checked). The consumer
    calls it once the batch's rows are staged and before the epoch is committed: it raises the
    source's error for bad input (the consumer then deletes what it staged and commits nothing),
    else returns the batch's document count, which ``count`` (0 until then) becomes. Only the
    first action on ``documents`` is observed, so it must be the one that stages them in full."""
    rejected: "DataFrame | None" = None
    """``on_invalid: dead_letter``: the documents that failed the checks (``source``, ``line``,
    ``reason``, ``document``), left out of ``documents``; None when there are none."""
    rejected_count: int = 0
    job_conf: dict[str, str] = field(default_factory=dict)
    """Spark settings the batch's staging jobs run with, on the runtime's session for the block
    that stages the epoch (``materializer.spark.settings.session_confs``): settings of how a job
    runs, never of what it writes."""
    small: bool = False
    """The batch is small (a files epoch under ``SMALL_EPOCH_BYTES`` of documents, a topic's under
    ``SMALL_EPOCH_RECORDS`` records): when every batch of an epoch is, its staging jobs run
    interpreted (``materializer.spark.settings.INTERPRETED``)."""


class Source(ABC):
    defer_checks = False
    """Set by a consumer that stages every batch it reads and calls ``SourceBatch.verify`` before
    committing (the runtime): the source may then check documents in the staging job instead of
    a job of its own. Others (tests, recover) get batches checked by ``next_batch``."""

    def __init__(self, binding: BindingConfig, spool: Store) -> None:
        self.binding = binding
        self.spool = spool
        """Store where batches are spooled for Spark to read (the staging store)."""

    @abstractmethod
    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str,
        *, until: dict[str, Any] | None = None,
    ) -> SourceBatch | None:
        """The next batch after ``checkpoint`` (None: nothing new). ``spool_path`` is free for it.

        ``until`` (recover): the checkpoint a committed epoch ended at, so a re-read takes exactly
        that epoch's extent even if more input has arrived since; sources whose batches are fixed
        by ``checkpoint`` alone may ignore it."""

