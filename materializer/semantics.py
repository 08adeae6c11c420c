"""What a history of changes makes of a table: the change semantics, as a model (DESIGN invariant 14).

This module is the specification of a binding's change semantics. It is plain Python (no Spark),
short on purpose, and written from the docs' section "Change semantics", whose sentences are
quoted at the rules they give. ``tests/test_semantics_model.py`` runs drawn histories through the
real pipeline and holds every table (read by Spark and by delta-rs) to :func:`materialize`; a rule
that is not here is not a rule.

A history is a list of epochs, each the documents one transaction read, in arrival order (file,
then line). :func:`materialize` returns the rows the table holds after the last epoch's apply,
hidden columns included (``__sequence``, ``__deleted``; in ``scd2`` mode ``__start_at``,
``__end_at``, ``__current``), without ``__deleted_at`` (a time of the apply) and without the
bookkeeping columns of ``ignore_null_updates`` (``__from``, ``__reset_at``).

The rules, in one paragraph. Each key's changes are ordered by ``(sequence, arrival)`` with
``sequence_by``, by arrival alone without it. In ``standard`` mode the table's row of a key is the
*fold* of all its changes in that order, whatever the epochs' cut and the arrival order: an upsert
replaces the row (with ``ignore_null_updates``, only its non-NULL fields, unless the row is a
delete), a delete makes it a tombstone (``sequence_by``), a soft-deleted row (``soft_delete``) or
removes it. A soft-deleted row shows "the row's values as the table held them" when its delete was
applied; that one rule depends on the cut. In ``scd2`` mode the versions are made epoch by epoch
from the stored versions and the epoch's changes (:func:`_scd2_epoch`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable, Sequence

Doc = dict[str, Any]
Row = dict[str, Any]

__all__ = ["materialize", "is_delete", "Options"]


@dataclass(frozen=True)
class Options:
    """The options of a binding that the semantics read (a ``BindingConfig`` has all of them)."""

    key: Sequence[str]
    mode: str = "standard"
    sequence_by: Sequence[str] = ()
    ignore_null_updates: bool = False
    soft_delete: bool = False
    delete_when: str | None = None
    columns: Sequence[str] | None = None
    except_columns: Sequence[str] = ()
    track_history: Sequence[str] | None = None
    track_history_except: Sequence[str] = ()

    @classmethod
    def of(cls, binding: Any) -> "Options":
        return cls(**{f: getattr(binding, f) for f in cls.__dataclass_fields__})


@dataclass
class Change:
    key: tuple[Any, ...]
    delete: bool
    fields: Row
    """The fields that land (key fields excluded); a field the document lacks is absent."""
    sequence: tuple[Any, ...]
    arrival: tuple[int, int]
    """(epoch, position in the epoch): the file order."""

    @property
    def order(self) -> tuple[Any, ...]:
        return (self.sequence, self.arrival)


# --- a document as a change -----------------------------------------------------------------------


def _path(doc: Doc, path: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _sql_literal(text: str) -> Any:
    text = text.strip()
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1].replace("''", "'")
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return Decimal(text)


def is_delete(options: Options, doc: Doc) -> bool:
    """docs: a document ``{"_meta": {"op": "d"}, …key…}`` deletes its key; "``delete_when``
    makes a document a delete when the condition is true (NULL, say for a missing field, is not a
    delete)". The model reads the conditions ``field`` (a boolean) and ``field = literal``."""
    meta = doc.get("_meta")
    if isinstance(meta, dict) and meta.get("op") == "d":
        return True
    if not options.delete_when:
        return False
    condition = options.delete_when.strip()
    if re.fullmatch(r"[A-Za-z_][\w.]*", condition):
        return _path(doc, condition) is True
    found = re.fullmatch(r"([A-Za-z_][\w.]*)\s*=\s*(.+)", condition)
    if not found:
        raise ValueError(f"the model reads delete_when of the forms `field` and `field = literal`, not {condition!r}")
    value, literal = _path(doc, found.group(1)), _sql_literal(found.group(2))
    if value is None or isinstance(value, (dict, list)):
        return False
    if isinstance(literal, Decimal) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return Decimal(str(value)) == literal
    return value == literal


def _lands(options: Options, name: str) -> bool:
    """docs: "``columns`` / ``except_columns`` pick the top-level fields that land (key fields
    always do)"; "``_meta`` paths order but never land in the table"."""
    if name == "_meta":
        return False
    if name in options.key:
        return True
    if options.columns is not None:
        return name in options.columns
    return name not in options.except_columns


def _sequence(options: Options, doc: Doc) -> tuple[Any, ...]:
    """docs: "Numbers compare as numbers (…``DECIMAL(38,9)``…), strings as text"."""
    out = []
    for path in options.sequence_by:
        value = _path(doc, path)
        if value is None or isinstance(value, (bool, dict, list)):
            raise ValueError(f"sequence field {path!r} is missing or not a number or a string in {doc!r}")
        out.append(value if isinstance(value, str) else Decimal(str(value)))
    return tuple(out)


def changes_of(options: Options, epochs: Sequence[Sequence[Doc]]) -> list[Change]:
    out = []
    for e, docs in enumerate(epochs, start=1):
        for position, doc in enumerate(docs):
            out.append(Change(
                key=tuple(doc.get(k) for k in options.key),
                delete=is_delete(options, doc),
                fields={f: v for f, v in doc.items() if _lands(options, f) and f not in options.key},
                sequence=_sequence(options, doc),
                arrival=(e, position),
            ))
    return out


# --- standard mode ----------------------------------------------------------------------------------


@dataclass
class _State:
    """A key's row after a fold: its fields, the order of its latest change, whether deleted."""

    fields: Row = field(default_factory=dict)
    order: tuple[Any, ...] | None = None
    deleted: bool = False


def _fold(options: Options, changes: Iterable[Change]) -> _State | None:
    """docs: "Within a transaction the change with the highest sequence wins per key; equal
    sequences go by file order"; "Across transactions … a late file never overwrites newer data.
    Equal goes to the later transaction". So: the key's changes in (sequence, arrival) order,
    each applied to the row left by the ones before it. ``ignore_null_updates``: "a field that is
    NULL or missing in a change keeps the value stored, unless a delete came in between (…then the
    change starts afresh)"."""
    state: _State | None = None
    for change in sorted(changes, key=lambda c: c.order):
        if change.delete:
            state = _State(order=change.order, deleted=True)
        elif options.ignore_null_updates and state is not None and not state.deleted:
            kept = dict(state.fields)
            kept.update({f: v for f, v in change.fields.items() if v is not None})
            state = _State(fields=kept, order=change.order)
        else:
            state = _State(fields=dict(change.fields), order=change.order)
    return state


def _standard(options: Options, changes: list[Change], epochs: int) -> dict[tuple[Any, ...], Row]:
    sequenced = bool(options.sequence_by)
    table: dict[tuple[Any, ...], Row] = {}
    for epoch in range(1, epochs + 1):
        upto = [c for c in changes if c.arrival[0] <= epoch]
        touched = {c.key for c in changes if c.arrival[0] == epoch}
        for key in touched:
            state = _fold(options, (c for c in upto if c.key == key))
            assert state is not None
            held = table.get(key)
            if not state.deleted:
                row = dict(state.fields)
            elif options.soft_delete:
                # docs: "a delete sets `__deleted = true` … and keeps the row's values as the
                # table held them"; "Without `sequence_by`, deleting a key the table does not hold
                # marks nothing". A key the table never held is marked with its key alone.
                if held is None and not sequenced:
                    table.pop(key, None)
                    continue
                row = {f: v for f, v in (held or {}).items() if not f.startswith("__") and f not in options.key}
            elif sequenced:
                # docs: "A delete does not remove the row: it becomes a tombstone, `__deleted =
                # true` with its sequence, and its fields NULL … A delete of a key the table never
                # held is kept as a tombstone too."
                row = {}
            else:
                table.pop(key, None)
                continue
            row.update(dict(zip(options.key, key)))
            if sequenced:
                row["__sequence"] = _sequence_struct(options, state.order[0])
            if sequenced or options.soft_delete:
                row["__deleted"] = state.deleted
            table[key] = row
    return table


def _sequence_struct(options: Options, sequence: tuple[Any, ...]) -> Row:
    return {path.replace(".", "__"): value for path, value in zip(options.sequence_by, sequence)}


# --- scd2 mode ----------------------------------------------------------------------------------------


@dataclass
class _Version:
    start: Any
    sequence: Any
    """The order of the change the version's values come from."""
    delete: bool
    fields: Row
    end: Any = None


def _tracked(options: Options, fields: Row, names: set[str]) -> Row:
    """docs: "With `track_history: [f…]` (or `track_history_except`) a change that leaves the
    tracked fields as they were updates the version in place"."""
    chosen = set(names)
    if options.track_history is not None:
        chosen &= set(options.track_history)
    chosen -= set(options.track_history_except) | set(options.key)
    return {n: fields.get(n) for n in sorted(chosen)}


def _scd2_epoch(
    options: Options, stored: list[_Version], changes: list[Change], epoch: int, names: set[str]
) -> list[_Version]:
    """One epoch's versions of one key. docs: "its source joins the transaction's changes with
    the stored versions of the keys they touch …, orders them by start, and writes what changed";
    "Changes with equal start: the later file's wins"; "Late changes that fall inside a version made
    of several in-place changes are placed by the values the version holds, not by the changes it
    merged": a stored version stands for a change at its start and, when it merged later in-place
    changes, one at its ``__sequence``, both with the values it holds."""
    sequenced = bool(options.sequence_by)
    tracking = options.track_history is not None or bool(options.track_history_except)
    events: dict[Any, _Version] = {}
    for v in stored:
        events[v.start] = _Version(v.start, v.sequence, v.delete, v.fields)
    for v in stored:
        point = _start(options, v.sequence) if sequenced else None
        if sequenced and not v.delete and point is not None and point != v.start and point not in events:
            events[point] = _Version(point, v.sequence, False, v.fields)
    for change in sorted(changes, key=lambda c: c.arrival):  # the later file's wins
        start = _start(options, change.sequence) if sequenced else epoch
        sequence = change.sequence if sequenced else (Decimal(epoch),)
        events[start] = _Version(start, sequence, change.delete, change.fields)
    runs: list[_Version] = []
    previous: _Version | None = None
    for start in sorted(events):
        e = events[start]
        opens = (
            previous is None or previous.delete or e.delete or not tracking
            or _tracked(options, previous.fields, names) != _tracked(options, e.fields, names)
        )
        if opens:
            runs.append(_Version(start, e.sequence, e.delete, e.fields))
        elif e.sequence >= runs[-1].sequence:
            runs[-1].sequence, runs[-1].fields = e.sequence, e.fields
        previous = e
    for i, run in enumerate(runs):
        run.end = runs[i + 1].start if i + 1 < len(runs) else None
    return runs


def _start(options: Options, sequence: tuple[Any, ...]) -> Any:
    """docs: "`__start_at` (the change's sequence, the one field itself when `sequence_by` has
    one, otherwise the struct; without `sequence_by`, the transaction's epoch number)"."""
    return sequence[0] if len(sequence) == 1 else sequence


def _scd2(options: Options, changes: list[Change], epochs: int) -> list[Row]:
    sequenced = bool(options.sequence_by)
    stored: dict[tuple[Any, ...], list[_Version]] = {}
    names: set[str] = set()
    for epoch in range(1, epochs + 1):
        now = [c for c in changes if c.arrival[0] == epoch]
        names |= {f for c in now for f in c.fields}
        for key in {c.key for c in now}:
            stored[key] = _scd2_epoch(options, stored.get(key, []), [c for c in now if c.key == key], epoch, names)
    rows = []
    for key, versions in stored.items():
        for v in versions:
            row = {} if v.delete else dict(v.fields)
            row.update(dict(zip(options.key, key)))
            row.update({
                "__start_at": _point(options, v.start),
                "__end_at": None if v.end is None else _point(options, v.end),
                "__current": v.end is None and not v.delete,
                "__deleted": v.delete,
            })
            if sequenced:
                row["__sequence"] = _sequence_struct(options, v.sequence)
            rows.append(row)
    return rows


def _point(options: Options, point: Any) -> Any:
    if isinstance(point, tuple):
        return _sequence_struct(options, point)
    return point


# --- the model --------------------------------------------------------------------------------------


def materialize(binding: Any, epochs: Sequence[Sequence[Doc]]) -> list[Row]:
    """The rows the binding's table holds after ``epochs`` (each a list of documents in arrival
    order) are applied, one transaction each. ``binding``: a ``BindingConfig`` or :class:`Options`."""
    options = binding if isinstance(binding, Options) else Options.of(binding)
    changes = changes_of(options, epochs)
    if options.mode == "scd2":
        return _scd2(options, changes, len(epochs))
    if options.mode != "standard":
        raise ValueError(f"the model states modes standard and scd2, not {options.mode!r}")
    return list(_standard(options, changes, len(epochs)).values())
