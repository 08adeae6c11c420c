"""The columns a change-controlled table keeps beside the documents' fields, and those only staged."""

from __future__ import annotations

from materializer.config import BindingConfig
from materializer.columns import OP

SEQUENCE = "__sequence"
DELETED = "__deleted"
DELETED_AT = "__deleted_at"
START_AT = "__start_at"
END_AT = "__end_at"
CURRENT = "__current"
RESET = "__reset_at"
"""Staged only (``ignore_null_updates``): the sequence of the epoch's last delete of the key
before its final upsert, so the MERGE knows which stored values that delete wiped."""
FROM = "__from"
"""Staged only (``ignore_null_updates`` with ``sequence_by``): per field, the sequence of the change
its value comes from, so the MERGE keeps a stored value newer than it."""
UNAVAILABLE = "__unavailable"
"""Staged only (a source's placeholders, Debezium's ``__debezium_unavailable_value``): per row, the
fields whose value the change does not carry, so the MERGE keeps the stored value."""
HIDDEN = (SEQUENCE, DELETED, DELETED_AT, START_AT, END_AT, CURRENT, RESET, FROM, UNAVAILABLE)
"""Names a document may not use in a change-controlled binding."""
SEQUENCE_NUMBER = "decimal(38,9)"
"""The type of a numeric sequence field: exact for integers up to 29 digits (LSNs, offsets,
epoch nanoseconds) and for fractions to 9 places, and one type whatever JSON inference says."""


def hidden_columns(binding: BindingConfig) -> tuple[str, ...]:
    """Top-level names the binding's documents may not hold (the table's own columns)."""
    return HIDDEN if binding.change_controlled else ()


def tombstones(binding: BindingConfig) -> bool:
    """Deletes leave a row (a tombstone, or a soft-deleted row) instead of removing it."""
    return bool(binding.sequence_by) or binding.soft_delete


def keeps_field_sequences(binding: BindingConfig) -> bool:
    """``ignore_null_updates`` with ``sequence_by``: the table keeps, per row, the sequence each
    field's value comes from (``__from``) and that of the key's latest delete (``__reset_at``), so
    a late change's fields land where its sequence puts them, whatever the arrival order."""
    return bool(binding.sequence_by) and binding.ignore_null_updates and binding.mode == "standard"


def staged_only(columns: list[str], binding: BindingConfig | None = None) -> list[str]:
    """Columns of the MERGE's source that are not table columns."""
    kept = (RESET, FROM) if binding is not None and keeps_field_sequences(binding) else ()
    return [c for c in columns if c in (OP, RESET, FROM, UNAVAILABLE, "__remove") and c not in kept]
