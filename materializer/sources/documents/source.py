"""The ``documents`` source: a folder of JSON Lines files, read by Spark where they are.

Each file is immutable once it appears. A document whose ``_meta.op`` is ``"d"`` deletes its key.

The driver only lists the folder and decides the epoch's extent: the next whole files in file-name
order, at most ``source.max_files`` of them and ``source.max_bytes`` in all (always at least one).
The runtime checkpoint names the last file taken, how many files sorted before it then, and the
sizes of the files taken; a file that later appears before it, or a taken file whose size changes
(lines appended), stops the run instead of being silently skipped. Files in sub-folders
(``_temporary/``, ``.inflight/``) and names starting with ``.`` or ``_`` are not documents. A
checkpoint of the previous version (``{"file", "line", "offset", "before"}``, a position inside a
file) resumes by finishing that file from its line, then goes on by whole files.

Documents are read, checked and typed by :mod:`materializer.sources.documents.reader`, which the
kafka source's JSON payloads share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from materializer.errors import ConfigError, SourceError
from materializer.dead_letters import split
from materializer.sources import Source, SourceBatch
from materializer.sources.documents.reader import DocumentReader, change_controlled, parse_schema
from materializer.sources.links import readable
from materializer.storage import FileInfo, Store, open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

SUFFIXES = (".jsonl", ".json", ".ndjson")


# --- the epoch's extent (plain Python, unit-tested without a JVM) ---------------------------------


def is_document_file(path: str) -> bool:
    """A top-level file with a JSON Lines suffix whose name does not start with '.' or '_'."""
    return "/" not in path and path.endswith(SUFFIXES) and not path.startswith((".", "_"))


def _legacy_document_file(path: str) -> bool:
    """What the previous version listed (recursively, only '.' names left out): old checkpoints'
    ``before`` counted these."""
    return path.endswith(SUFFIXES) and not path.rsplit("/", 1)[-1].startswith(".")


@dataclass
class Plan:
    """One epoch's extent."""

    files: list[FileInfo]
    """Whole files to read, in name order."""
    resume: tuple[FileInfo, int] | None = None
    """A file a previous version's checkpoint left part-read, and the lines already read."""
    before: int = 0
    """Files that sort before the last file taken."""
    lag_files: int = 0
    lag_bytes: int = 0
    lag_seconds: float | None = 0.0
    """How old the oldest file not taken is, when the epoch was planned (0: none left; None: the
    store gives no file's time)."""

    @property
    def last(self) -> str:
        return (self.files[-1] if self.files else self.resume[0]).path  # type: ignore[index]

    @property
    def empty(self) -> bool:
        return not self.files and self.resume is None

    def checkpoint(self) -> dict[str, Any]:
        taken = ([self.resume[0]] if self.resume else []) + self.files
        return {"file": self.last, "before": self.before, "sizes": {f.path: f.size for f in taken}}

    def description(self) -> str:
        parts = [f"{self.resume[0].path}:{self.resume[1] + 1}-"] if self.resume else []
        names = [f.path for f in self.files]
        parts += names if len(names) <= 3 else [f"{names[0]} … {names[-1]} ({len(names)} files)"]
        return ", ".join(parts)


def plan_epoch(
    listing: list[FileInfo], checkpoint: dict[str, Any] | None, max_files: int, max_bytes: int, where: str,
    legacy: list[FileInfo] | None = None, until: str | None = None, clock: float | None = None,
) -> Plan:
    """The next epoch after ``checkpoint`` over ``listing`` (document files, sorted by name);
    with ``until``, exactly the files up to that name (a committed epoch's extent, re-read).
    ``clock`` (Unix seconds, default now): when the plan is made, what the lag in seconds is measured from.

    Raises SourceError for a file that appeared before the checkpoint or a taken file that changed.
    """
    checkpoint = checkpoint or {}
    last = checkpoint.get("file")
    resume: tuple[FileInfo, int] | None = None
    if last is not None:
        old_format = "line" in checkpoint or "offset" in checkpoint
        counted = legacy if (old_format and legacy is not None) else listing
        earlier = sum(1 for f in counted if f.path < last)
        # Fewer files before the checkpoint is retention deleting processed files: fine. More is a
        # file that arrived late with an earlier name: it would never be read.
        if "before" in checkpoint and earlier > int(checkpoint["before"]):
            raise SourceError(
                f"{where}: {earlier - int(checkpoint['before'])} file(s) appeared that sort before {last!r}, which "
                f"the pipeline has already passed; they would never be read. Files are read in name order: rename "
                f"them to sort after {last!r} (nothing was applied from this transaction)."
            )
        sizes = {f.path: f.size for f in listing}
        for name, size in (checkpoint.get("sizes") or {}).items():
            now = sizes.get(name)
            if now is not None and now != size:
                raise SourceError(
                    f"{where}/{name}: the file was {size} bytes when the pipeline read it and is {now} bytes now. "
                    "Files must not change once they appear: lines appended to a file already read would never "
                    f"be read. Put new documents in a new file that sorts after {last!r}, and restore {name!r} to "
                    "what it was (nothing was applied from this transaction)."
                )
        if old_format:
            offset = int(checkpoint.get("offset", 0))
            current = next((f for f in listing if f.path == last), None)
            if current is None:
                raise SourceError(
                    f"{where}/{last}: the pipeline had read this file up to line {checkpoint.get('line')}, and it is "
                    "gone; the rest of it would never be read. Restore it (nothing was applied from this transaction)."
                )
            if offset < current.size:
                resume = (current, int(checkpoint.get("line", 0)))
    after = [f for f in listing if last is None or f.path > last]
    files: list[FileInfo] = []
    total = resume[0].size - int(checkpoint.get("offset", 0)) if resume else 0
    for info in after:
        if until is not None:
            if info.path > until:
                break
        elif (files or resume) and (len(files) >= max_files or total + info.size > max_bytes):
            break
        files.append(info)
        total += info.size
    plan = Plan(files=files, resume=resume)
    if not plan.empty:
        plan.before = sum(1 for f in listing if f.path < plan.last)
        rest = after[len(files):]
        plan.lag_files, plan.lag_bytes = len(rest), sum(f.size for f in rest)
        plan.lag_seconds = lag_seconds(rest, time.time() if clock is None else clock)
    return plan


def lag_seconds(rest: list[FileInfo], now: float) -> float | None:
    """How old the oldest of ``rest`` (the files not taken) is at ``now``: 0 when none is left,
    None when the store gives no file's time. The oldest by time, not by name: a file named early
    but written late is not the one waiting longest. Never negative (the store's clock may be ahead)."""
    if not rest:
        return 0.0
    times = [f.modified for f in rest if f.modified is not None]
    return round(max(0.0, now - min(times)), 3) if times else None


# --- the source -----------------------------------------------------------------------------------


class DocumentsSource(Source):
    _declared: "StructType | None" = None

    def __init__(self, binding: Any, spool: Store) -> None:
        super().__init__(binding, spool)
        self._columns: dict[Any, Any] = {}
        """The readers' check columns, kept from epoch to epoch (``DocumentReader.columns``)."""
        self._check_exists()

    def _check_exists(self) -> None:
        """A source folder that does not exist is a typo: stop before anything is written (an
        empty folder is fine). Local folders only: an S3 prefix exists once it holds a file."""
        import os

        uri = self._store().uri
        if "://" not in uri and not os.path.isdir(uri):
            raise ConfigError(
                f"binding {self.binding.name!r}: source folder {uri} does not exist. Check source.path (relative "
                "paths are taken from the folder the command runs in); nothing was written."
            )

    def declared_schema(self, spark: "SparkSession") -> "StructType | None":
        """The binding's ``source.schema`` as a StructType (None: not declared); checked once."""
        ddl = self.binding.source.schema_ddl
        if self._declared is None and ddl is not None:
            self.use_schema(parse_schema(spark, ddl, self.binding))
        return self._declared

    def use_schema(self, schema: "StructType") -> None:
        """Check and cast documents to ``schema`` (what ``source.schema`` declares)."""
        self._declared = schema

    def _store(self) -> Store:
        return open_store(self.binding.source.path)

    def listing(self) -> tuple[Store, list[FileInfo], list[FileInfo]]:
        """The store, its document files by name, and what the previous version counted."""
        store = self._store()
        self._check_exists()
        # A link is read only with source.follow_links, and then only one to a file (sources/links.py).
        files = readable(
            store.scan(), is_document_file,
            follow=self.binding.source.follow_links, where=store.uri, binding=self.binding.name,
        )
        return store, [f for f in files if is_document_file(f.path)], [f for f in files if _legacy_document_file(f.path)]

    def lag(self, checkpoint: dict[str, Any] | None, clock: float | None = None) -> dict[str, Any]:
        """What the folder holds after ``checkpoint`` (where the last committed epoch left the
        binding), as the next epoch's plan would count it before taking any: ``files``, ``bytes``
        and ``seconds`` (the oldest file's age; 0: none). A listing only, no Spark (``materializer
        status``). A previous version's checkpoint inside a file counts only the files after it."""
        _store, files, _legacy = self.listing()
        last = (checkpoint or {}).get("file")
        rest = [f for f in files if last is None or f.path > last]
        seconds = lag_seconds(rest, time.time() if clock is None else clock)
        return {"files": len(rest), "bytes": sum(f.size for f in rest), "seconds": seconds}

    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str,
        *, until: dict[str, Any] | None = None,
    ) -> SourceBatch | None:
        """The next whole files after ``checkpoint`` (up to ``until``'s file when given). ``max_documents``
        and ``spool_path`` are not used: epochs are bounded by ``source.max_files`` /
        ``source.max_bytes``, and Spark reads the files in place."""
        store, files, legacy = self.listing()
        config = self.binding.source
        plan = plan_epoch(
            files, checkpoint, config.max_files, config.max_bytes, store.uri, legacy,
            until=(until or {}).get("file"),
        )
        if plan.empty:
            return None
        declared = self.declared_schema(spark)
        reader = DocumentReader(
            spark, store, self.binding.key, declared, checkpoint, dead_letter=self.binding.on_invalid == "dead_letter",
            columns=self._columns,
        )
        change_controlled(reader, self.binding)
        from materializer.sources.documents.route import SMALL_EPOCH_BYTES, set_aside, validator
        from materializer.spark.settings import ARROW_BATCHES_BY_RECORDS, session_confs

        small = sum(f.size for f in plan.files) + (plan.resume[0].size if plan.resume is not None else 0) < SMALL_EPOCH_BYTES
        reader.small = small
        if declared is not None:
            reader.validator = validator(spark, small=small, declared=declared)
        parsed = reader.parsed(plan)
        lag = {"files": plan.lag_files, "bytes": plan.lag_bytes, "seconds": plan.lag_seconds}
        # Dead letters of a bigger epoch: only a document the validator does not find fast can be
        # one, so those are set aside in the spool by one job, for the checks and the dead letters.
        aside = (
            set_aside(reader, self.spool, spool_path.rsplit(".", 1)[0] + "-not-fast", files=True)
            if declared is not None and reader.validator == "arrow" and reader.dead_letter and not reader.sequence_by
            else None
        )
        if (
            declared is not None and until is None and self.defer_checks and not reader.sequence_by
            and (not reader.dead_letter or (aside is not None and aside.others is None))
        ):
            # The types are known before reading: the checks ride along with the staging job (one
            # parse per epoch), and the runtime calls verify before committing. Without a schema
            # the cast needs the epoch's types first, so a job of its own checks and infers them;
            # so does sequence_by, whose fields (``_meta`` paths too) are typed by the epoch's shape
            # (a string sequence read as a number would be NULL, and order nothing), and dead letters,
            # which need the bad documents' files before staging: unless the validator finds every
            # document fast (no dead letter then).
            documents, verify = reader.deferred(parsed)
            return SourceBatch(
                documents=documents, checkpoint=plan.checkpoint(), count=0, description=plan.description(),
                explain=reader.explain, lag=lag, verify=verify, small=small,
                job_conf=ARROW_BATCHES_BY_RECORDS if reader.validator == "arrow" else {},
            )
        rejected = None
        if aside is not None:
            # The documents not fast are checked (their VARIANT route, from the spool); the fast
            # ones need no check. The staging job judges the lines again, and routes the others.
            from materializer.sources.documents.route import marked_documents

            count, schema = aside.documents, declared
            if aside.others is not None:
                others = reader._with_variant(aside.others)
                schema = reader.check(others)[1]
                if reader.bad_files:
                    rejected = reader.rejected(others)
            parsed = marked_documents(reader)
        else:
            with session_confs(spark, ARROW_BATCHES_BY_RECORDS if "__ok" in parsed.columns else {}):
                count, schema = reader.check(parsed)
            if reader.bad_files:
                rejected = reader.rejected()
        if reader.bad_files:
            # on_invalid: dead_letter (docs: 'Dead letters'): the valid documents go on.
            parsed, _bad = split(reader.checked(parsed))
        return SourceBatch(
            rejected=rejected,
            rejected_count=reader.bad,
            # No document (blank lines only), or every one a dead letter: no row, and no type for
            # the key to stage one with; the position (and the dead letters) are committed.
            documents=None if reader.bad == count else reader.rows(parsed, schema),
            checkpoint=plan.checkpoint(),
            count=count,
            description=plan.description(),
            explain=reader.explain,
            lag=lag,
            small=small,
            job_conf=ARROW_BATCHES_BY_RECORDS if "__ok" in parsed.columns else {},
        )
