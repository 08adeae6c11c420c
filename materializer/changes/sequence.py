"""The sequence of a document (``sequence_by``), as the documents reader checks and reads it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.changes.hidden import SEQUENCE_NUMBER
from materializer.errors import SourceError

if TYPE_CHECKING:
    from pyspark.sql import Column

_NUMBER_KINDS = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL.*)$"


def sequence_name(path: str) -> str:
    """The ``__sequence`` struct field of a ``sequence_by`` path."""
    return path.replace(".", "__")


def json_path(path: str) -> str:
    return "$" + "".join(f"['{part}']" for part in path.split("."))


def sequence_rules(v: "Column", paths: list[str]) -> list[tuple["Column", str]]:
    """Per document: its ``sequence_by`` fields are present, and a number or a string."""
    from pyspark.sql import functions as F

    rules: list[tuple[Column, str]] = []
    for path in paths:
        got = F.try_variant_get(v, json_path(path), "variant")
        kind = F.schema_of_variant(got)
        rules.append((
            got.isNull() | F.is_variant_null(got),
            f"sequence field {path!r} (sequence_by) is missing or null: every change, deletes too, needs its sequence",
        ))
        rules.append((
            ~(kind.rlike(_NUMBER_KINDS) | (kind == F.lit("STRING"))),
            f"sequence field {path!r} (sequence_by) must be a number or a string (an ISO-8601 time sorts as text)",
        ))
        rules.append((
            kind.rlike(_NUMBER_KINDS) & F.try_variant_get(got, "$", SEQUENCE_NUMBER).isNull(),
            f"sequence field {path!r} (sequence_by) is a number beyond {SEQUENCE_NUMBER} (29 digits before the point); "
            "write it as a string of fixed width",
        ))
    return rules


def _shape_at(shape: Any, path: str) -> Any:
    for part in path.split("."):
        if not (isinstance(shape, tuple) and shape[0] == "object"):
            return None
        shape = dict(shape[1]).get(part)
    return shape


def sequence_column(v: "Column", paths: list[str], shape: Any, where: str) -> "Column":
    """The document's ``__sequence`` struct, each field typed by its kind in the epoch (``shape``,
    the epoch's merged ``schema_of_variant``): STRING stays a string, numbers are DECIMAL(38,9)."""
    from pyspark.sql import functions as F

    fields = []
    for path in paths:
        found = _shape_at(shape, path) if shape is not None else None
        if found == "VARIANT":
            raise SourceError(
                f"{where}: sequence field {path!r} (sequence_by) holds numbers in some documents of this transaction "
                "and strings in others; a sequence must be one kind to be compared. Fix the documents (nothing of "
                "this transaction was applied)."
            )
        kind = "string" if found == "STRING" else SEQUENCE_NUMBER
        fields.append(F.try_variant_get(v, json_path(path), kind).alias(sequence_name(path)))
    return F.struct(*fields)
