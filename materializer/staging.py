"""The staging area: where each epoch's rows wait, as Parquet, between the log commit and the apply."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.delta import quote
from materializer.protocol import DriverCheckpoint
from materializer.storage import Store as FileStore


if TYPE_CHECKING:
    from pyspark.sql import DataFrame

STAGED = "staged"
SCRATCH = ("spool", "_tmp")
"""Scratch folders of the staging store: source spools and files on their way in, per writer."""


def dataset_of(path: str) -> str:
    """The staged dataset a staged file belongs to: ``staged/epoch-<epoch>/<binding>-<random>``."""
    return "/".join(path.split("/")[:3])


def open_cleans(staging: FileStore, checkpoint: DriverCheckpoint | None) -> tuple[list[str], list[str]]:
    """What an Open deletes (files of staged datasets the last committed entry does not reference,
    every scratch file) and what it keeps (the rest), as listed now. The drill checks with this."""
    keep = set() if checkpoint is None else {f.uri for f in checkpoint.staged.values() if f is not None}
    keep |= set() if checkpoint is None else {f.uri for f in checkpoint.dead_letters.values()}
    deleted, kept = [], []
    for info in staging.list(STAGED):
        (kept if dataset_of(info.path) in keep else deleted).append(info.path)
    deleted += [f.path for prefix in SCRATCH for f in staging.list(prefix)]
    return deleted, kept


def is_data_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return not name.startswith(("_", "."))


def _void_as_string(dtype: Any) -> Any:
    """``dtype`` with every VOID (NullType) inside it made STRING; None if it holds no VOID."""
    from pyspark.sql.types import ArrayType, MapType, NullType, StringType, StructField, StructType

    if isinstance(dtype, NullType):
        return StringType()
    if isinstance(dtype, StructType):
        fields = [_void_as_string(f.dataType) for f in dtype.fields]
        if all(f is None for f in fields):
            return None
        return StructType(
            [StructField(f.name, new or f.dataType, f.nullable) for f, new in zip(dtype.fields, fields)]
        )
    if isinstance(dtype, ArrayType):
        element = _void_as_string(dtype.elementType)
        return None if element is None else ArrayType(element, dtype.containsNull)
    if isinstance(dtype, MapType):
        value = _void_as_string(dtype.valueType)
        return None if value is None else MapType(dtype.keyType, value, dtype.valueContainsNull)
    return None


def _without_void(df: "DataFrame") -> "DataFrame":
    """Parquet cannot hold a VOID column (a field NULL in the whole epoch, inside a struct): stage
    it as a STRING column of NULLs, which the MERGE's alignment casts to the table's type."""
    from pyspark.sql import functions as F

    changed = {f.name: _void_as_string(f.dataType) for f in df.schema.fields}
    if all(t is None for t in changed.values()):
        return df
    return df.select(
        *[F.col(quote(name)).cast(t).alias(name) if t is not None else F.col(quote(name)) for name, t in changed.items()]
    )
