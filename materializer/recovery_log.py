"""The recovery log: the authoritative record of (epoch, runtime checkpoint, driver checkpoint).

One immutable entry per sequence number, ``entries/<seq:020d>.json``, published atomically and
exclusively by the store (temp file + fsync + link locally, ``IfNoneMatch="*"`` on S3), each
wrapped with a SHA-256 checksum of its body so a damaged entry is detected, never half-read.

Two kinds of entry share the sequence:

* ``fence``: published at Open. Any writer whose next commit finds that sequence number taken
  has been fenced off by a newer Open and must stop (DESIGN invariant 6).
* ``commit``: epoch N+1's runtime checkpoint and driver checkpoint, committed together.

The log's state is its highest commit entry; entries older than the retention are compacted away.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from materializer import redact
from materializer.bounds import bound_problem
from materializer.errors import FencedError, RecoveryLogError
from materializer.protocol import DriverCheckpoint, RuntimeCheckpoint
from materializer.storage import Store, unsafe_reason

ENTRIES = "entries"
FAILURES = "failures"
"""Why an epoch could not be applied (``failures/epoch-<epoch>-<binding>-<writer>.txt``), for
``status``: written when Delta refuses a committed epoch, removed once it is applied."""
TMP_PREFIX = ".tmp-"
"""Temporary files of a local store's publish (storage/local.py): a kill leaves them behind."""
_NAME = re.compile(r"^entries/(\d{20})\.json$")
_FAILURE = re.compile(r"^failures/epoch-(\d{12})-([A-Za-z_][A-Za-z0-9_]*)-[^/]+\.txt$")
OPEN_ATTEMPTS = 5


class LogEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int
    """Sequence number of the entry in the log."""
    kind: Literal["fence", "commit"]
    """fence: a writer opened the pipeline; commit: an epoch committed."""
    pipeline_id: str
    """Pipeline the log belongs to; a log is never shared between pipelines."""
    writer: str
    """Random id of the process that wrote the entry."""
    epoch: int
    """commit: the epoch committed; fence: the last epoch committed when the writer opened."""
    runtime_checkpoint: RuntimeCheckpoint | None = None
    """commit: where the sources stand after the epoch."""
    driver_checkpoint: DriverCheckpoint | None = None
    """commit: the staged files to apply for the epoch."""
    written_at: str = ""
    """Wall-clock time of writing, for people reading the log; never used for ordering."""


def entry_path(seq: int) -> str:
    return f"{ENTRIES}/{seq:020d}.json"


def encode(entry: LogEntry) -> bytes:
    body = entry.model_dump(mode="json")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    checksum = hashlib.sha256(canonical.encode()).hexdigest()
    return json.dumps({"checksum": f"sha256:{checksum}", "entry": body}, sort_keys=True, indent=1).encode()


def decode(data: bytes, where: str, keys: Mapping[str, Sequence[str]] | None = None) -> LogEntry:
    """The entry ``data`` holds, checked whole (checksum, shape, staged files, key bounds) before
    anything uses it. ``keys``: each binding's key columns (:func:`binding_keys`), where known."""
    advice = (
        "the entry was damaged after it was written (logs are only ever written whole). "
        "Restore it from a backup, or stop the pipeline and run `materializer recover --config F` "
        "(docs: 'Recovering from damage')."
    )
    try:
        wrapper = json.loads(data)
        body = wrapper["entry"]
        expected = wrapper["checksum"]
    except (ValueError, KeyError, TypeError):
        raise RecoveryLogError(f"recovery log entry {where} is torn or not JSON: {advice}") from None
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    actual = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    if actual != expected:
        raise RecoveryLogError(
            f"recovery log entry {where} fails its checksum (expected {expected}, found {actual}): {advice}"
        )
    try:
        entry = LogEntry.model_validate(body)
    except ValidationError as exc:
        raise RecoveryLogError(f"recovery log entry {where} has an unexpected shape: {exc}") from None
    _check_staged_uris(entry, where)
    _check_key_bounds(entry, where, keys or {})
    return entry


def binding_keys(bindings: Iterable[Any]) -> dict[str, list[str]]:
    """Each binding's key columns by its name and its previous names (an entry of before a rename
    names it the old way): what :func:`decode` checks an entry's key bounds against."""
    return {name: list(b.key) for b in bindings for name in (b.name, *b.previous_names)}


def _check_staged_uris(entry: LogEntry, where: str) -> None:
    """Refuse an entry naming a staged file outside the staging area's ``staged/`` folder before
    anything uses it: a staged file is deleted once applied, so ``../../victim``, ``/etc/x``,
    ``file:///x`` or ``%2e%2e/x`` must never get that far (docs: 'Clean-up stays in the staging area')."""
    checkpoint = entry.driver_checkpoint
    if checkpoint is None:
        return
    named = [(f"staged.{b}", f) for b, f in checkpoint.staged.items() if f is not None]
    named += [(f"dead_letters.{b}", f) for b, f in checkpoint.dead_letters.items()]
    for field, staged in named:
        # staged/: materializer.staging.STAGED, where every dataset the area makes lives.
        reason = unsafe_reason(staged.uri, under="staged")
        if reason is not None:
            raise RecoveryLogError(
                f"recovery log entry {where} (epoch {entry.epoch}) names the staged file {staged.uri!r} in "
                f"driver_checkpoint.{field}, and {reason}: no version of the materializer writes that, so the entry "
                "was changed by hand or damaged. Nothing was deleted or applied. Stop the pipeline and run "
                "`materializer recover --config F`, which keeps the entry's bytes and replaces it (docs: "
                "'Recovering from damage')."
            )


def _check_key_bounds(entry: LogEntry, where: str, keys: Mapping[str, Sequence[str]]) -> None:
    """Refuse an entry whose staged files carry key bounds this version never writes, before the
    MERGE is built from them: the bounds become SQL text (materializer.bounds), so a column that
    is not the binding's key, or a kind or value that is not one, is damage (issue #66 item 4).
    A binding whose key is not known here (a log read without its configuration) has its kinds
    and values checked; its columns are checked where the run reads the entry.

    The columns are those of the key the epoch was staged with, which the entry records with its
    options: a key changed in the configuration since (an option change, which Open then applies
    or refuses, saying so) is no damage. Only an older entry, which recorded no options, is checked
    against the configured key."""
    checkpoint = entry.driver_checkpoint
    if checkpoint is None:
        return
    for binding, staged in checkpoint.staged.items():
        recorded = checkpoint.options.get(binding, {}).get("key")
        key = list(recorded) if isinstance(recorded, list) else keys.get(binding)
        for name, bound in ((staged.key_bounds or {}) if staged is not None else {}).items():
            reason = bound_problem(name, bound, key)
            if reason is not None:
                raise RecoveryLogError(
                    f"recovery log entry {where} (epoch {entry.epoch}) holds the key bound {name!r}: {bound!r} in "
                    f"driver_checkpoint.staged.{binding}.key_bounds, and {reason}: no version of the materializer writes "
                    "that, so the entry was changed by hand or damaged. Nothing was applied. Stop the pipeline and run "
                    "`materializer recover --config F`, which keeps the entry's bytes and replaces it (docs: "
                    "'Recovering from damage')."
                )


@dataclass(frozen=True)
class LogState:
    last_seq: int
    """Highest sequence number in the log (0: empty)."""
    last_commit: LogEntry | None
    """Highest commit entry (None: nothing committed yet)."""
    sequences: tuple[int, ...]
    """Every sequence number present, ascending."""

    @property
    def last_epoch(self) -> int:
        return self.last_commit.epoch if self.last_commit else 0


class RecoveryLog:
    """One pipeline's log in a store. A writer calls :meth:`open` once, then :meth:`commit`."""

    def __init__(
        self,
        store: Store,
        pipeline_id: str,
        *,
        retention: int = 10,
        writer: str | None = None,
        keys: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.store = store
        self.pipeline_id = pipeline_id
        self.keys: Mapping[str, Sequence[str]] = keys or {}
        """Each binding's key columns (:func:`binding_keys`): every entry read has its key bounds checked against them."""
        self.retention = retention
        self.writer = writer or uuid.uuid4().hex[:12]
        self._next_seq: int | None = None

    # --- reading ---

    def sequences(self) -> list[int]:
        seqs = []
        for info in self.store.list(ENTRIES):
            match = _NAME.match(info.path)
            if match:
                seqs.append(int(match.group(1)))
        return sorted(seqs)

    def read_entry(self, seq: int) -> LogEntry:
        path = entry_path(seq)
        try:
            data = self.store.get(path)
        except FileNotFoundError:
            raise RecoveryLogError(f"recovery log entry {self.store.uri}/{path} vanished while being read") from None
        entry = decode(data, f"{self.store.uri}/{path}", self.keys)
        if entry.seq != seq:
            raise RecoveryLogError(f"recovery log entry {self.store.uri}/{path} claims sequence {entry.seq}")
        if entry.pipeline_id != self.pipeline_id:
            raise RecoveryLogError(
                f"recovery log {self.store.uri} belongs to pipeline {entry.pipeline_id!r}, not "
                f"{self.pipeline_id!r}: give each pipeline its own recovery_log folder"
            )
        return entry

    def read(self) -> LogState:
        """The log's state: its highest sequence and its highest commit entry."""
        seqs = self.sequences()
        last_commit = None
        for seq in reversed(seqs):
            entry = self.read_entry(seq)
            if entry.kind == "commit":
                last_commit = entry
                break
        return LogState(last_seq=seqs[-1] if seqs else 0, last_commit=last_commit, sequences=tuple(seqs))

    def entries(self) -> list[LogEntry]:
        return [self.read_entry(seq) for seq in self.sequences()]

    # --- writing ---

    def _entry(self, seq: int, kind: Literal["fence", "commit"], epoch: int, **fields: Any) -> LogEntry:
        return LogEntry(
            seq=seq,
            kind=kind,
            pipeline_id=self.pipeline_id,
            writer=self.writer,
            epoch=epoch,
            written_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            **fields,
        )

    def open(self) -> LogState:
        """Read the log and publish a fencing entry; from now on older writers are fenced."""
        for _attempt in range(OPEN_ATTEMPTS):
            state = self.read()
            seq = state.last_seq + 1
            fence = self._entry(seq, "fence", state.last_epoch)
            if self.store.put_if_absent(entry_path(seq), encode(fence)):
                self._next_seq = seq + 1
                self._clean_temporary()
                return state
            # Another writer published at the same sequence between our read and our write:
            # read again and fence after it.
        raise FencedError(
            f"pipeline {self.pipeline_id!r}: could not open the recovery log {self.store.uri}: other "
            f"writers kept publishing entries ({OPEN_ATTEMPTS} attempts). Is another run of this pipeline active?"
        )

    def _clean_temporary(self) -> None:
        """Remove temp files that killed writers left mid-publish (only after our fence is out).

        An older writer may still be in its publish window: removing its temp file makes its
        link fail, which the store reports as "taken", and it is indeed fenced by our entry.
        """
        for info in self.store.list(ENTRIES):
            if info.path.rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                self.store.delete(info.path)

    def commit(
        self,
        epoch: int,
        runtime_checkpoint: RuntimeCheckpoint,
        driver_checkpoint: DriverCheckpoint,
        *,
        before_publish: Callable[[], None] | None = None,
    ) -> LogEntry:
        """Commit an epoch; raises FencedError if a newer writer has opened the pipeline."""
        if self._next_seq is None:
            raise RuntimeError("commit() before open()")
        seq = self._next_seq
        entry = self._entry(
            seq, "commit", epoch, runtime_checkpoint=runtime_checkpoint, driver_checkpoint=driver_checkpoint
        )
        if not self.store.put_if_absent(entry_path(seq), encode(entry), before_publish=before_publish):
            taken = [s for s in self.sequences() if s >= seq]
            raise self._fenced(taken[0] if taken else seq, epoch)
        newer = [s for s in self.sequences() if s > seq]
        if newer:
            # Our sequence was free only because compaction had removed it: a newer writer is
            # already far ahead. Our entry sits below its commits and is never read as state.
            raise self._fenced(newer[0], epoch)
        self._next_seq = seq + 1
        self.compact(seq)
        return entry

    def check_not_fenced(self, epoch: int, *, cause: BaseException | None = None, doing: str | None = None) -> None:
        """Raise FencedError if a newer writer has published an entry since this writer's last one."""
        if self._next_seq is None:
            return
        newer = [s for s in self.sequences() if s >= self._next_seq]
        if not newer:
            return
        if cause is None:
            raise self._fenced(newer[0], epoch)
        holder = "another writer"
        try:
            holder = f"writer {self.read_entry(newer[0]).writer}"
        except RecoveryLogError:
            pass
        detail = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
        raise FencedError(
            f"pipeline {self.pipeline_id!r} was opened by {holder} (log sequence {newer[0]}) while this run "
            f"(writer {self.writer}) was {doing or f'applying epoch {epoch}'}, so this run is fenced and stops; the "
            f"newer run applies epoch {epoch} itself and nothing more is applied here. The "
            f"{'work' if doing else 'apply'} here failed with: {detail}"
        ) from cause

    def check_holding(self, doing: str) -> None:
        """Raise FencedError, before ``doing`` anything, if a newer writer has opened the log."""
        if self._next_seq is None:
            return
        newer = [s for s in self.sequences() if s >= self._next_seq]
        if newer:
            holder = "another writer"
            try:
                holder = f"writer {self.read_entry(newer[0]).writer}"
            except RecoveryLogError:
                pass
            raise FencedError(
                f"pipeline {self.pipeline_id!r} was opened by {holder} (log sequence {newer[0]}), so this run "
                f"(writer {self.writer}) is fenced and stops before {doing}: the newer run owns the staged files now."
            )

    # --- failures (a stuck epoch) ---

    def record_failure(self, epoch: int, binding: str, message: str) -> None:
        """Keep why Delta refused a committed epoch, for ``status`` (best effort: the run stops anyway).

        ``message`` is redacted here, the one place a failure is written: an apply's error quotes
        whatever Spark or a store said (a URL with its userinfo, an option's value), and the file
        outlives the run and is read by anyone who can list the log (docs: 'Secrets')."""
        try:
            self.store.put_if_absent(f"{FAILURES}/epoch-{epoch:012d}-{binding}-{self.writer}.txt", redact.text(message).encode())
        except Exception:  # noqa: BLE001 - the apply's error is the one to report
            pass

    def failures(self) -> dict[tuple[int, str], str]:
        """(epoch, binding) -> the latest recorded reason it could not be applied."""
        found: dict[tuple[int, str], str] = {}
        for info in self.store.list(FAILURES):
            match = _FAILURE.match(info.path)
            if match:
                try:
                    found[(int(match.group(1)), match.group(2))] = self.store.get(info.path).decode(errors="replace")
                except FileNotFoundError:
                    continue
        return found

    def clear_failures(self, upto_epoch: int) -> None:
        """Forget failures of epochs now applied."""
        for info in self.store.list(FAILURES):
            match = _FAILURE.match(info.path)
            if match and int(match.group(1)) <= upto_epoch:
                self.store.delete(info.path)

    def _fenced(self, seq: int, epoch: int) -> FencedError:
        holder = "another writer"
        try:
            holder = f"writer {self.read_entry(seq).writer}"
        except RecoveryLogError:
            pass
        return FencedError(
            f"pipeline {self.pipeline_id!r} was opened by {holder} (log sequence {seq} is taken), so this "
            f"run (writer {self.writer}) is fenced: epoch {epoch} was not committed and nothing more is "
            "applied. Only one run of a pipeline may be active; the newer one continues."
        )

    def compact(self, upto_seq: int) -> int:
        """Delete entries more than ``retention`` sequence numbers below ``upto_seq`` (a commit)."""
        removed = 0
        for seq in self.sequences():
            if seq < upto_seq - self.retention:
                self.store.delete(entry_path(seq))
                removed += 1
        return removed
