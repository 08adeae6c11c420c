"""The oracle: what each table must hold, computed from the sources in plain Python, without Spark.

A drill (``materializer drill``) compares every Delta table with its oracle after killing the
pipeline many times. The oracle must not share code paths with what it checks, so it re-reads
the source files itself and applies the documented semantics directly:

* ``documents`` source, ``standard`` mode: per key, every document folded in order with each
  field's reduction (lastWriteWins unless ``reductions`` says otherwise; the step table of
  materializer/reductions.py); a document with ``_meta.op == "d"`` deletes its key and the next
  one starts afresh. The table holds one row per surviving key.
* ``documents`` source, ``delta_updates`` mode: every epoch appends, per key, the fold of that
  epoch's documents only (a delete that ends the epoch as a row with ``_op = 'd'``). Epoch
  boundaries follow from the source's ``max_files`` / ``max_bytes``: binding b's j-th batch is the
  j-th run of whole files of its source, in file-name order, committed as epoch j.

* ``cdcv2`` source, ``standard`` mode: the history's state at the final frontier (seed 002).
* ``kafka`` source, ``standard`` mode: the topic's records read with confluent-kafka's consumer
  (materializer/tools/oracle_kafka.py), then as above per payload.

Oracles are registered per (source format, mode) with :func:`materializer.tools.oracle_rows.register`;
canonical rows and the per-key fold are there too (materializer/tools/oracle_rows.py). A binding with no
registered oracle (``cdcv2`` in delta-updates mode, so far) gets an :class:`Expected` with ``verified=False`` and
a reason: the drill then says "not verified" for that table rather than "pass".
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from materializer.config import BindingConfig, PipelineConfig
from materializer.errors import SourceError
from materializer.storage import open_store
from materializer.tools import oracle_kafka  # registers the kafka oracle; confluent-kafka is imported when a topic is read
from materializer.tools.oracle_rows import (
    ORACLES,
    SET_ASIDE,
    Expected,
    Key,
    Row,
    canonical,
    cdcv2_state,
    fields_of,
    fold,
    is_delete,
    key_of,
    normalize,
    register,
)

__all__ = ["Comparison", "Expected", "canonical", "compare", "expected", "expected_all", "file_epochs", "normalize", "oracle_kafka"]

SUFFIXES = (".jsonl", ".json", ".ndjson")
OP = "_op"


@dataclass
class Comparison:
    """A table against its oracle, by key."""

    binding: str
    verified: bool
    reason: str = ""
    expected_rows: int = 0
    actual_rows: int = 0
    lost: list[dict[str, Any]] = field(default_factory=list)
    """Expected rows the table lacks."""
    duplicated: list[dict[str, Any]] = field(default_factory=list)
    """Rows the table holds more often than expected."""
    wrong: list[dict[str, Any]] = field(default_factory=list)
    """Rows the table holds that the oracle does not expect at all (stale, resurrected, altered)."""
    counts: dict[str, int] = field(default_factory=lambda: {"lost": 0, "duplicated": 0, "wrong": 0})
    """How many rows of each kind, including those beyond the listing limit."""

    @property
    def ok(self) -> bool:
        return self.verified and not (self.lost or self.duplicated or self.wrong)


# --- reading the sources, independently of materializer.sources -------------------------------


def document_files(path: str) -> list[tuple[str, int]]:
    """A ``documents`` source's files in name order, with sizes: top-level files with a JSON Lines
    suffix whose names start with neither '.' nor '_' (sub-folders are a writer's scratch space)."""
    store = open_store(path)
    return sorted(
        (f.path, f.size) for f in store.list()
        if "/" not in f.path and f.path.endswith(SUFFIXES) and not f.path.startswith((".", "_"))
    )


def file_epochs(binding: BindingConfig) -> list[list[str]]:
    """The documents source's epochs: runs of whole files, at most ``max_files`` and ``max_bytes``
    each, at least one file."""
    groups: list[list[str]] = []
    size = 0
    for name, length in document_files(binding.source.path):
        if not groups or len(groups[-1]) >= binding.source.max_files or size + length > binding.source.max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += length
    return groups


def documents(path: str) -> Iterator[tuple[str, int, Row]]:
    """Every document of a ``documents`` source in file-name order: (file, line, document); the
    lines its binding set aside as dead letters left out (:data:`SET_ASIDE`). A line that is not
    a JSON object and was not set aside stops the oracle, naming it."""
    store = open_store(path)
    set_aside = SET_ASIDE.get().get(path)
    files = [name for name, _size in document_files(path)]
    for name in files:
        with store.open_read(name) as handle:
            for number, raw in enumerate(handle, start=1):
                text = raw.strip()
                if not text or (set_aside is not None and (name, number) in set_aside):
                    continue
                missing = " and is not in the binding's dead-letter table" if set_aside is not None else ""
                try:
                    doc = json.loads(text)
                except ValueError as exc:
                    raise SourceError(f"{store.uri}/{name}:{number}: not valid JSON ({exc}){missing}", file=name, line=number) from None
                if not isinstance(doc, dict):
                    raise SourceError(f"{store.uri}/{name}:{number}: not a JSON object{missing}", file=name, line=number)
                yield name, number, doc


# --- the oracles -------------------------------------------------------------------------------

@register("documents", "standard")
def documents_standard(binding: BindingConfig, max_documents: int) -> Expected:
    # Every strategy's step is associative, so folding all documents in order gives the same row
    # as the pipeline's per-epoch fold into the loaded row, whatever the epoch boundaries.
    state: dict[Key, Row] = {}
    count = 0
    for _file, _line, doc in documents(binding.source.path):
        count += 1
        k = key_of(doc, binding.key)
        if is_delete(doc):
            state.pop(k, None)
        else:
            state[k] = fold(binding, state.get(k), doc)
    return Expected(
        binding=binding.name,
        verified=True,
        unique_keys=True,
        rows={k: Counter([canonical(row)]) for k, row in state.items()},
        epochs=len(file_epochs(binding)),
        documents=count,
    )


@register("documents", "delta_updates")
def documents_delta_updates(binding: BindingConfig, max_documents: int) -> Expected:
    rows: dict[Key, Counter[str]] = {}
    epoch: dict[Key, Row] = {}
    count = 0

    def close_epoch() -> None:
        for k, row in epoch.items():
            rows.setdefault(k, Counter())[canonical(row)] += 1
        epoch.clear()

    last_of_epoch = {group[-1] for group in file_epochs(binding)}
    current_file: str | None = None
    for file, _line, doc in documents(binding.source.path):
        if current_file is not None and file != current_file and current_file in last_of_epoch:
            close_epoch()
        current_file = file
        count += 1
        k = key_of(doc, binding.key)
        if is_delete(doc):
            # A delete resets the key within the epoch; if the epoch ends on it, the appended row
            # has the delete document's lastWriteWins fields and NULL reduced fields.
            row = {f: v for f, v in fields_of(doc).items() if binding.reductions.get(f, "lastWriteWins") == "lastWriteWins"}
            row[OP] = "d"
        else:
            previous = epoch.get(k)
            base = None if previous is None or previous[OP] == "d" else {f: v for f, v in previous.items() if f != OP}
            row = fold(binding, base, doc)
            row[OP] = "u"
        epoch[k] = row
    close_epoch()
    return Expected(
        binding=binding.name,
        verified=True,
        unique_keys=False,
        rows=rows,
        epochs=len(file_epochs(binding)),
        documents=count,
    )


@register("cdcv2", "standard")
def cdcv2_standard(binding: BindingConfig, max_documents: int) -> Expected:
    """The history's state at the final frontier, one row per key (seed 002), in plain Python.

    Distinct updates (duplicates absorbed) and distinct progress statements; the frontier walks
    from 0 over progress statements whose lower bound it covers; the first covered time whose
    distinct updates do not match its count stops it. Epochs depend on how times group into
    batches, so this oracle checks rows only (``epochs`` is None).
    """
    return cdcv2_state(binding, (stmt for _file, _line, stmt in documents(binding.source.path)))


def _epochs_of_documents(binding: BindingConfig) -> tuple[list[list[Row]], int]:
    by_file: dict[str, list[Row]] = {}
    count = 0
    for name, _line, doc in documents(binding.source.path):
        by_file.setdefault(name, []).append(doc)
        count += 1
    return [[doc for name in group for doc in by_file.get(name, [])] for group in file_epochs(binding)], count


def _from_model(binding: BindingConfig, unique_keys: bool) -> Expected:
    """The table as materializer/semantics.py (the change semantics' model) states it."""
    from materializer import semantics

    epochs, count = _epochs_of_documents(binding)
    try:
        rows = semantics.materialize(binding, epochs)
    except ValueError as exc:
        return Expected(binding=binding.name, verified=False, reason=f"the model cannot state this binding: {exc}")
    out: dict[Key, Counter[str]] = {}
    for row in rows:
        out.setdefault(key_of(row, binding.key), Counter())[canonical(row)] += 1
    return Expected(
        binding=binding.name, verified=True, unique_keys=unique_keys, rows=out, epochs=len(epochs), documents=count,
        ignored=("__deleted_at", "__from", "__reset_at"),
    )


def documents_changes(binding: BindingConfig, max_documents: int) -> Expected:
    """A change-controlled ``documents`` binding in standard mode: materializer/semantics.py's model
    of sequence order, tombstones, soft deletes and column control, over the files' epochs."""
    return _from_model(binding, unique_keys=True)


@register("documents", "scd2")
def documents_scd2(binding: BindingConfig, max_documents: int) -> Expected:
    """``mode: scd2``: every version, as materializer/semantics.py's model states them."""
    return _from_model(binding, unique_keys=False)


def expected(binding: BindingConfig, max_documents: int, set_aside: "frozenset[tuple[Any, ...]] | None" = None) -> Expected:
    """The oracle's expectation for one binding, or ``verified=False`` with the reason.

    ``set_aside``: with ``on_invalid: dead_letter``, what the pipeline set aside (its dead-letter
    table): (file, line) of a files source's documents, (topic, partition, offset) of a topic's
    records. They are left out of the fold, and any other document the oracle cannot read is a
    document lost (a SourceError naming it)."""
    if set_aside is not None:
        where = f"kafka:{binding.name}" if binding.source.format == "kafka" else str(binding.source.path)
        token = SET_ASIDE.set({**SET_ASIDE.get(), where: set_aside})
        try:
            return expected(binding, max_documents)
        finally:
            SET_ASIDE.reset(token)
    if binding.source.format == "kafka" and (binding.source.routed is not None or binding.source.unrouted is not None):
        return Expected(
            binding=binding.name, verified=False,
            reason="the kafka oracle does not model route_by (the records of one topic routed to several tables)",
        )
    if binding.source.format == "kafka" and binding.options_controlled:
        return Expected(binding=binding.name, verified=False, reason="the kafka oracle does not model sequence_by or column control")
    if binding.source.format == "documents" and binding.mode == "standard" and binding.change_controlled:
        return documents_changes(binding, max_documents)
    fn = ORACLES.get((binding.source.format, binding.mode))
    if fn is None:
        return Expected(
            binding=binding.name,
            verified=False,
            reason=f"no oracle for {binding.source.format} sources in {binding.mode} mode yet",
        )
    return fn(binding, max_documents)


def expected_all(config: PipelineConfig) -> dict[str, Expected]:
    return {b.name: expected(b, config.transaction.max_documents) for b in config.bindings}


# --- comparing ---------------------------------------------------------------------------------


def compare(exp: Expected, actual_rows: list[Row], key: list[str], *, limit: int = 50) -> Comparison:
    """The table's rows against the oracle; lists at most ``limit`` rows per kind of discrepancy."""
    result = Comparison(binding=exp.binding, verified=exp.verified, reason=exp.reason, actual_rows=len(actual_rows))
    if not exp.verified:
        return result
    result.expected_rows = sum(sum(c.values()) for c in exp.rows.values())
    actual: dict[Key, Counter[str]] = {}
    for row in actual_rows:
        if exp.ignored:
            row = {k: v for k, v in row.items() if k not in exp.ignored}
        actual.setdefault(key_of(row, key), Counter())[canonical(row)] += 1

    def note(kind: list[dict[str, Any]], k: Key, row: str, times: int) -> None:
        name = "lost" if kind is result.lost else "duplicated" if kind is result.duplicated else "wrong"
        result.counts[name] += times
        if len(kind) < limit:
            kind.append({"key": list(k), "row": json.loads(row), "times": times})

    for k in sorted(set(exp.rows) | set(actual), key=repr):
        want = exp.rows.get(k, Counter())
        have = actual.get(k, Counter())
        for row, n in want.items():
            if have[row] < n:
                note(result.lost, k, row, n - have[row])
        for row, n in have.items():
            if row not in want:
                note(result.wrong, k, row, n)
            elif n > want[row]:
                # In standard mode this also catches one key held twice by identical rows.
                note(result.duplicated, k, row, n - want[row])
    return result
