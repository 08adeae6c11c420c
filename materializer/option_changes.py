"""Options changed on a binding whose table exists: each applies by a stated rule, or is refused
before anything is read or committed (DESIGN invariant 9: every committed epoch can be applied).

Each epoch's driver checkpoint records the options that shape the binding's table
(:func:`table_options`). At Open, before the first read, the binding's options are compared with
those of the last committed epoch and, for what a log written before that record cannot tell,
with the table's own columns (``__sequence``, ``__deleted``, ``__deleted_at``, scd2's
``__start_at``, delta-updates' ``_op``). :data:`RULES` says, per option and kind of change, what
happens; the docs' table ('Changing options on a table that exists') is the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from materializer.errors import ConfigError

if TYPE_CHECKING:
    from materializer.config import BindingConfig

RECORDED = (
    "key", "mode", "sequence_by", "soft_delete", "ignore_null_updates", "delete_when", "columns", "except_columns",
    "track_history", "track_history_except", "schema", "partition_by", "cluster_by", "properties", "deletion_vectors",
)
"""The binding's options that shape its table: recorded with each epoch, compared at Open."""

UNRECORDED: dict[str, str] = {
    "others_may_write": "applies from the next start: it shapes no table (Open reads the commits made "
    "since the pipeline's last one; docs: 'People's writes')",
}
"""Binding options that shape no table: not recorded, any change applies (the docs' table lists them too)."""

Change = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class Rule:
    """What a change of one option does to a binding whose table exists."""

    option: str
    change: Change
    verdict: Literal["applies", "refused"]
    rule: str
    """The rule, as the docs state it (applies), or why it is refused and what to do instead."""


_SEQUENCE_REFUSED = (
    "the stored rows' sequences (__sequence, and the tombstones that keep deleted keys deleted) were compared "
    "by the old fields; without them, or under other fields, a late change could bring back a deleted key or "
    "overwrite a newer row"
)
_HISTORY_REFUSED = (
    "the stored versions were cut by the old tracked fields; regrouped by the new ones at the next change of a "
    "key, versions already written would be merged or split"
)

RULES: tuple[Rule, ...] = (
    Rule("key", "changed", "refused", "the table holds one row per old key; rows of the new key would mix with them"),
    Rule("mode", "changed", "refused",
         "standard, scd2 and delta_updates tables hold different rows (one per key, every version, every change)"),
    Rule("sequence_by", "added", "applies",
         "rows stored before have no sequence: any change is newer; `__sequence` and `__deleted` are added "
         "(`__deleted = false` on every stored row) before the first sequenced epoch is applied (mode standard; "
         "in mode scd2 it is refused: a version's `__start_at` would change meaning)"),
    Rule("sequence_by", "removed", "refused", _SEQUENCE_REFUSED),
    Rule("sequence_by", "changed", "refused", _SEQUENCE_REFUSED),
    Rule("soft_delete", "added", "applies",
         "`__deleted = false` and `__deleted_at` are added to every stored row; later deletes mark rows"),
    Rule("soft_delete", "removed", "refused",
         "soft-deleted rows would stay marked while later deletes remove rows or leave tombstones"),
    Rule("ignore_null_updates", "added", "applies", "later changes keep stored values where they are NULL or missing"),
    Rule("ignore_null_updates", "removed", "applies", "later changes are whole rows again"),
    Rule("delete_when", "added", "applies", "evaluated on later documents only; stored rows stay"),
    Rule("delete_when", "removed", "applies", "later documents are deletes only by `_meta.op`"),
    Rule("delete_when", "changed", "applies", "evaluated on later documents only; stored rows stay"),
    *[
        Rule(option, change, "applies",
             "later changes land the new set of columns: a column that lands now is added (NULL in rows not "
             "changed since); one that no longer lands stays in the table, NULL in rows changed since (kept "
             "with `ignore_null_updates`)")
        for option in ("columns", "except_columns") for change in ("added", "removed", "changed")
    ],
    *[Rule(option, change, "refused", _HISTORY_REFUSED)
      for option in ("track_history", "track_history_except") for change in ("added", "removed", "changed")],
    *[
        Rule("schema", change, "applies",
             "each epoch is checked against the table before commit ('Type widening'): a new field is added, a "
             "missing one is NULL, a narrower type is cast up, a wider top-level type widens the column (type "
             "widening) or must fit; a wider number inside a struct, array or map, or another type, refuses "
             "the epoch before commit")
        for change in ("added", "removed", "changed")
    ],
    *[
        Rule(option, change, "applies" if change == "removed" else "refused",
             "the table keeps its layout" if change == "removed" else
             "layout acts at creation: one that contradicts the table stops the run at start (exit 7); change the "
             "table (ALTER TABLE … CLUSTER BY) or the binding")
        for option in ("partition_by", "cluster_by") for change in ("added", "removed", "changed")
    ],
    Rule("properties", "added", "refused",
         "properties act at creation: a value the table does not hold stops the run at start; set it with ALTER "
         "TABLE … SET TBLPROPERTIES (after the pipeline is drained), or remove it from the binding"),
    Rule("properties", "changed", "refused",
         "properties act at creation: a value the table does not hold stops the run at start; set it with ALTER "
         "TABLE … SET TBLPROPERTIES (after the pipeline is drained), or remove it from the binding"),
    Rule("properties", "removed", "applies", "the table keeps the property"),
    Rule("deletion_vectors", "changed", "refused",
         "acts at creation: a value the table does not hold stops the run at start; set delta.enableDeletionVectors "
         "with ALTER TABLE … SET TBLPROPERTIES, or put the option back"),
)


def rule(option: str, change: Change) -> Rule:
    for candidate in RULES:
        if candidate.option == option and candidate.change == change:
            return candidate
    raise KeyError((option, change))


def table_options(binding: "BindingConfig") -> dict[str, Any]:
    """The options of ``binding`` that shape its table, as the driver checkpoint records them."""
    out: dict[str, Any] = {}
    for name in RECORDED:
        if name == "schema":
            out[name] = binding.source.schema_ddl
        else:
            value = getattr(binding, name)
            out[name] = dict(value) if isinstance(value, dict) else (list(value) if isinstance(value, list) else value)
    return out


def _empty(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def _kind(before: Any, after: Any) -> Change:
    if _empty(before):
        return "added"
    if _empty(after):
        return "removed"
    return "changed"


def _default(option: str) -> Any:
    """The option's value when a recorded entry predates it (the binding's default)."""
    from materializer.config import BindingConfig

    if option == "schema":
        return None
    field = BindingConfig.model_fields[option]
    return field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]


def changes(recorded: dict[str, Any], binding: "BindingConfig") -> list[tuple[Rule, Any, Any]]:
    """Each recorded option whose value the binding changes: its rule, the old and the new value."""
    now = table_options(binding)
    found = []
    for option in RECORDED:
        if option in ("partition_by", "cluster_by", "properties"):
            continue  # compared with the table itself (what it holds is what counts)
        before = recorded.get(option, _default(option))
        after = now[option]
        if option == "deletion_vectors" and before == after:
            continue
        if _same(before, after):
            continue
        change = _kind(before, after) if option != "deletion_vectors" else "changed"
        found.append((rule(option, change), before, after))
    return found


def _same(before: Any, after: Any) -> bool:
    if _empty(before) and _empty(after):
        return True
    return before == after


def check(
    binding: "BindingConfig", recorded: dict[str, Any] | None, schema: Any, properties: dict[str, str], pending: bool
) -> list[Rule]:
    """The rules of the binding's changed options on its existing table (schema: a StructType), or a
    ConfigError naming the binding and every refused change."""
    from materializer.changes import DELETED, DELETED_AT, SEQUENCE, START_AT, sequence_name, tombstones
    from materializer.tables import DELETION_VECTORS
    from materializer.columns import OP

    refused: list[str] = []
    applied: list[Rule] = []
    seen: set[str] = set()
    if recorded is not None:
        for found, before, after in changes(recorded, binding):
            if found.option == "sequence_by" and found.change == "added" and binding.mode == "scd2":
                found = Rule("sequence_by", "added", "refused", "in mode scd2 a version's __start_at would change meaning")
            seen.add(found.option)
            if found.option == "deletion_vectors" and str(properties.get(DELETION_VECTORS, "false")).lower() == str(after).lower():
                continue  # the table was changed to match
            if found.verdict == "refused":
                refused.append(f"{found.option} {found.change} ({_shown(before)} → {_shown(after)}): {found.rule}")
            else:
                applied.append(found)
    # What the table's own columns say (also for a log that predates the record).
    columns = {f.name: f.dataType for f in schema.fields}
    table_mode = "scd2" if START_AT in columns else ("delta_updates" if OP in columns else "standard")
    if "mode" not in seen and table_mode != binding.mode:
        refused.append(f"mode is {binding.mode} but the table was written in mode {table_mode}: {rule('mode', 'changed').rule}")
    if "sequence_by" not in seen and binding.mode != "delta_updates":
        stored = [f.name for f in columns[SEQUENCE].fields] if SEQUENCE in columns else []
        wanted = [sequence_name(p) for p in binding.sequence_by]
        if stored and stored != wanted:
            refused.append(
                f"sequence_by is {binding.sequence_by} but the table's rows are sequenced by "
                f"{stored} (__sequence): {_SEQUENCE_REFUSED}"
            )
        elif not stored and wanted and table_mode == "scd2":
            refused.append(f"sequence_by {binding.sequence_by} on a table written without it in mode scd2: "
                           "a version's __start_at would change meaning")
    if "soft_delete" not in seen and DELETED_AT in columns and not binding.soft_delete:
        refused.append(f"soft_delete removed: {rule('soft_delete', 'removed').rule}")
    if binding.mode == "standard" and DELETED in columns and not tombstones(binding) and "sequence_by" not in seen and "soft_delete" not in seen:
        refused.append("the table holds deleted rows (__deleted) but the binding has neither sequence_by nor soft_delete: "
                       "they would be taken for live rows")
    for key, value in binding.properties.items():
        held = {k.lower(): v for k, v in properties.items()}.get(key.lower())
        if held is None or held.lower() != value.lower():
            change: Change = "added" if held is None else "changed"
            refused.append(f"properties.{key} = {value!r} but the table holds {held!r}: {rule('properties', change).rule}")
    if refused:
        raise ConfigError(
            f"binding {binding.name!r}: options changed on table {binding.table}, which exists, in ways that cannot "
            "apply to it: " + "; ".join(refused) + ". Put the options back (the pipeline runs on as before), or "
            "give the binding a new table (and `backfill` it) to start it over with the new options "
            "(docs: 'Changing options on a table that exists'). Nothing was read or committed."
        )
    if pending and applied:
        names = ", ".join(sorted({r.option for r in applied}))
        raise ConfigError(
            f"binding {binding.name!r}: {names} changed while the last committed epoch, staged with the previous "
            f"options, is not yet applied to table {binding.table}. Run once with the previous configuration and "
            "`--max-epochs 0` (it applies that epoch and stops), then with the new one. Nothing was read or committed."
        )
    return applied


def _shown(value: Any) -> str:
    return "unset" if _empty(value) else repr(value)
