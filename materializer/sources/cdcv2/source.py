"""The ``cdcv2`` source: Materialize's CDC v2 protocol (seed 002), read from JSON Lines files.

A folder holds files of statements, one JSON object per line:

* updates  ``{"updates": [[data, time, diff], ...]}``: the multiplicity of the row ``data`` (a JSON
  object holding the binding's key fields) changes at integer ``time`` by ``diff``;
* progress ``{"progress": {"lower": [t], "upper": [u], "counts": [[t, n], ...]}}``: the times in
  ``[lower, upper)`` hold exactly ``n`` distinct updates at each listed ``t`` and none at the others;
  ``"upper": []`` ends the stream.

Statements may be duplicated, reordered and re-batched across files that appear in any order. The
reader follows the seed's iterator: updates at times below the frontier are discarded, duplicates
are absorbed, a progress statement is applied once its lower bound is covered, and a time is
complete when progress covers it and the distinct updates received match its count. An epoch
takes complete times in order; its runtime checkpoint is the frontier ``{"frontier": t}`` (every
time below ``t`` is materialized; ``null`` once the stream has ended), so a restart re-reads the
files and applies nothing twice.

The statements are judged by :mod:`~materializer.sources.cdcv2.statements`, the progress
bookkeeping is plain Python (:mod:`~materializer.sources.cdcv2.progress`: :func:`parse_progress`,
:func:`track`, :func:`plan_epoch`, unit-tested without a JVM), and Spark reads, scans and
consolidates the updates (:class:`~materializer.sources.cdcv2.reader.CdcV2Reader`, shared with
the kafka ``cdcv2`` payload); this module gives the reader its files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import unquote

from materializer.sources.cdcv2.progress import (
    START, EpochPlan, Origin, Problem, Progress, Tracking, parse_progress, plan_epoch, track,
)
from materializer.sources.cdcv2.reader import CdcV2Reader, Scan
from materializer.sources.cdcv2.statements import lookup, statements
from materializer.sources.line_numbers import with_line_numbers
from materializer.sources.links import readable
from materializer.storage import Store, open_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SKIPPED = (".", "_")
"""Files whose names start so are not statements (writers' temporary files, Spark's markers)."""


def _statement_file(path: str) -> bool:
    """A file of statements: not a writer's temporary file nor a Spark marker."""
    return not os.path.basename(path).startswith(SKIPPED) and not path.endswith((".tmp", ".crc"))


class CdcV2Source(CdcV2Reader):
    """Reads a folder of CDC v2 statements; see the module docstring."""

    @property
    def label(self) -> str:
        """The input named in messages: the folder (a topic's address for kafka's cdcv2 payload)."""
        return str(self.binding.source.path)

    # --- files ---

    def _store(self) -> Store:
        return open_store(self.binding.source.path)

    def _listing(self) -> tuple[tuple[str, int], ...]:
        store = self._store()
        # A link (to a file or a sub-folder) is read only with source.follow_links, and then only
        # one to a file; a linked sub-folder is never walked into (sources/links.py).
        files = readable(
            store.scan(), _statement_file, follow=self.binding.source.follow_links, where=store.uri, binding=self.binding.name
        )
        return tuple((f.path, f.size) for f in files if _statement_file(f.path))

    def _name(self, spark_uri: str, names: Sequence[str]) -> str:
        """The store-relative name of a file Spark read (it reports ``file:/…`` or ``s3a://…``)."""
        uri = unquote(spark_uri)
        best = ""
        for name in names:
            if (uri.endswith("/" + name) or uri == name) and len(name) > len(best):
                best = name
        return f"{self._store().uri}/{best}" if best else uri

    def _relative(self, spark_uri: str, names: Sequence[str]) -> str:
        """The file's name inside the folder (what a checkpoint keeps)."""
        prefix = self._store().uri.rstrip("/") + "/"
        name = self._name(spark_uri, names)
        return name[len(prefix):] if name.startswith(prefix) else name

    def _locate(self, origin: Origin) -> Origin:
        """The origin with its line number, found by reading the one file (error paths only)."""
        store = self._store()
        prefix = store.uri.rstrip("/") + "/"
        name = origin.file[len(prefix) :] if origin.file.startswith(prefix) else origin.file
        wanted = origin.text.strip()
        try:
            with store.open_read(name) as handle:
                for number, raw in enumerate(handle, start=1):
                    if raw.decode("utf-8", errors="replace").strip() == wanted:
                        return Origin(origin.file, origin.text, number)
        except (OSError, FileNotFoundError):
            pass
        return origin

    # --- reading ---

    def _lines(self, spark: "SparkSession", listing: tuple[tuple[str, int], ...]) -> "DataFrame":
        """The statements' text (``value``) and where each is (``file``), blank lines left out. The
        seam kafka's cdcv2 payload feeds records through (``file`` then names topic, partition and offset)."""
        from pyspark.sql import functions as F

        store = self._store()
        return (
            spark.read.text([store.spark_path(n) for n, _ in listing])
            .select(F.col("value"), F.col("_metadata.file_path").alias("file"))
            .where(F.trim("value") != "")
        )

    def _scan_for(self, spark: "SparkSession", frontier: int) -> Scan | None:
        listing = self._listing()
        if not listing:
            return None
        scan = self._scan
        if scan is not None and scan.listing == listing and scan.frontier <= frontier:
            return scan
        if scan is not None:
            scan.distinct.unpersist()
        self._scan = None
        self._scan = self._read(spark, listing, frontier)
        return self._scan

    # --- dead letters ---

    def _dead_letters(
        self, spark: "SparkSession", scan: Scan, checkpoint: dict[str, Any] | None, until: dict[str, Any] | None
    ) -> "tuple[DataFrame | None, int, dict[str, Any]]":
        """``on_invalid: dead_letter``: the malformed statements this epoch sets aside (``source``,
        ``line``, ``reason``, ``document``), their number, and what the checkpoint keeps of them.

        The files are read again by every epoch, so a statement is set aside by the first epoch
        that reads its file: the checkpoint's ``dead_lettered`` names the files whose malformed
        statements are in the dead-letter table (few: only files holding one), and a file is
        immutable once it appears (see the docs). Only those files are read again, numbered."""
        from pyspark.sql import functions as F

        done = sorted((checkpoint or {}).get("dead_lettered") or [])
        kept = {"dead_lettered": done} if done else {}
        new = {uri: name for uri, name in scan.bad_files.items() if name not in done}
        if until is not None:
            # recover: exactly the files the committed epoch set aside.
            new = {uri: name for uri, name in new.items() if name in (until.get("dead_lettered") or [])}
        if not new:
            return None, 0, kept
        store = self._store()
        path = F.col("_metadata.file_path")
        raw = spark.read.text([store.spark_path(n) for n in sorted(set(new.values()))]).select(
            "value", path.alias("file"), F.col("_metadata.file_block_start").alias("block"), F.monotonically_increasing_id().alias("row")
        )
        # Numbered as the error path numbers them (blank lines counted; no sort: line_numbers).
        lines = with_line_numbers(raw, "line", ("file", "block", "row")).select("value", "file", "line").where(F.trim("value") != "")
        rejected = self._rejected(statements(lines, self.binding.key), scan).select(
            lookup({uri: f"{store.uri.rstrip('/')}/{name}" for uri, name in new.items()}, F.col("file")).alias("source"),
            F.col("line").cast("long").alias("line"),
            F.col("reason"),
            F.col("value").alias("document"),
        )
        count = rejected.count()
        return (rejected if count else None), count, {"dead_lettered": sorted(set(done) | set(new.values()))}


__all__ = [  # what other modules and tests import from here
    "START", "CdcV2Source", "EpochPlan", "Origin", "Problem", "Progress", "Tracking", "parse_progress", "plan_epoch", "track",
]
