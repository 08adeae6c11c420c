"""An epoch's documents prepared for the combine: ``delete_when`` made ``_op``, only the columns that land."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from materializer.changes.hidden import SEQUENCE, UNAVAILABLE
from materializer.columns import OP, SEQ
from materializer.config import BindingConfig
from materializer.delta import quote
from materializer.errors import SourceError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def prepare(documents: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """``delete_when`` turned into ``_op``, and only the columns that land (plus the hidden ones)."""
    from pyspark.sql import functions as F

    docs = documents
    if binding.delete_when:
        docs = with_deletes(docs, binding)
    keep = [c for c in docs.columns if _lands(c, binding)]
    return docs.select(*[F.col(quote(c)) for c in keep])


_MISSING_TRIES = 16
"""How many absent fields :func:`with_deletes` fills in before it gives up."""


def with_deletes(docs: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """``docs`` with ``_op`` set to a delete where ``delete_when`` is true; NULL (say, a field the
    document lacks) is not a delete (docs: 'Change semantics').

    The epoch's schema is whatever its documents hold, so a field the condition names may be absent
    (no document of the epoch carries it), or absent inside a struct that is there: Spark would
    refuse the condition. It is evaluated instead over the documents with each absent field added as
    NULL, found from what Spark's analysis reports missing (a top-level field or path, a sub-field
    of a struct that is present); those additions are dropped again, so nothing of them lands.
    Anything else that keeps the condition from being evaluated (a field of another type, a result
    that is not true/false) stops the epoch here, before it is staged or committed, naming the
    binding and the condition."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, NullType

    from materializer.delta import error_condition

    condition = binding.delete_when
    assert condition is not None
    where = f"binding {binding.name}: delete_when {condition!r}"
    top: dict[str, Any] = {}  # absent top-level fields: NULL, or a struct of NULLs for a path
    sub: set[str] = set()  # absent sub-fields, added as NULL to every struct that lacks them
    for _attempt in range(_MISSING_TRIES):
        frame, originals = _with_absent(docs, top, sub)
        try:
            with _quiet_analysis():
                dtype = frame.select(F.expr(condition).alias("__delete")).schema["__delete"].dataType
        except AnalysisException as exc:
            found = error_condition(exc) or ""
            parameters = exc.getMessageParameters() or {}
            if found.startswith("UNRESOLVED_COLUMN") and "objectName" in parameters:
                path = [p.strip("`") for p in parameters["objectName"].split("`.`")]
                if path[0] not in top and path[0] not in docs.columns:
                    top[path[0]] = path[1:]
                    continue
            if found == "FIELD_NOT_FOUND" and "fieldName" in parameters:
                name = parameters["fieldName"].strip("`")
                if name not in sub:
                    sub.add(name)
                    continue
            raise SourceError(
                f"{where} cannot be evaluated on this transaction's documents: {_first_line(exc)}. A field it names "
                "holds another type here than the condition expects, or the condition is not valid Spark SQL. Fix "
                "delete_when (or the documents); nothing of this transaction was committed or applied."
            ) from None
        if not isinstance(dtype, (BooleanType, NullType)):
            raise SourceError(
                f"{where} is {dtype.simpleString()} on this transaction's documents, not a condition (true or false): "
                "write it as a comparison, e.g. \"op = 'DELETE'\" or \"is_deleted = true\". Nothing of this "
                "transaction was committed or applied."
            )
        is_delete = F.coalesce(F.expr(condition).cast("boolean"), F.lit(False))
        marked = frame.withColumn(OP, F.when(is_delete, F.lit("d")).otherwise(F.col(OP)))
        return marked.select(*[
            (F.col(quote(originals[c])) if c in originals else F.col(quote(c))).alias(c) for c in docs.columns
        ])
    raise SourceError(f"{where} names more than {_MISSING_TRIES} fields this transaction's documents lack; nothing was committed.")


@contextmanager
def _quiet_analysis() -> Iterator[None]:
    """PySpark logs every analysis error with a query context at ERROR, JVM stack and all, as the
    exception is made; here an absent field is expected (and answered), not an error to log."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pragma: no cover - PySpark before 4
        yield
        return
    loggers = [PySparkLogger.getLogger(name) for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before):
            logger.disabled = disabled


def _with_absent(docs: "DataFrame", top: dict[str, list[str]], sub: set[str]) -> "tuple[DataFrame, dict[str, str]]":
    """``docs`` with the absent fields added (top-level paths as structs of NULLs; ``sub`` as a NULL
    field of every struct that lacks it), and where each changed column's original is kept."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    originals: dict[str, str] = {}
    changed: dict[str, Column] = {}
    for i, field in enumerate(docs.schema.fields):
        if isinstance(field.dataType, StructType) and sub:
            patched = _add_fields(F.col(quote(field.name)), field.dataType, sub)
            if patched is not None:
                originals[field.name] = f"__original_{i}"
                changed[field.name] = patched
    frame = docs.select("*", *[F.col(quote(name)).alias(copy) for name, copy in originals.items()])
    for name, path in top.items():
        value = F.lit(None)
        for part in reversed(path):
            value = F.struct(value.alias(part))
        changed[name] = value
    return (frame.withColumns(changed) if changed else frame), originals


def _add_fields(column: "Column", dtype: Any, names: set[str]) -> "Column | None":
    """``column`` (a struct) with each of ``names`` it lacks added as NULL, at every depth; None: unchanged."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    out, changed = column, False
    present = {f.name for f in dtype.fields}
    for field in dtype.fields:
        if isinstance(field.dataType, StructType):
            inner = _add_fields(column.getField(field.name), field.dataType, names)
            if inner is not None:
                out, changed = out.withField(quote(field.name), inner), True
    for name in sorted(names - present):
        out, changed = out.withField(quote(name), F.lit(None)), True
    return out if changed else None


def _first_line(exc: BaseException) -> str:
    """Spark's message without its plan and JVM stack."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(" SQLSTATE")[0].strip()


def _lands(column: str, binding: BindingConfig) -> bool:
    if column in binding.key or column in (OP, SEQ, SEQUENCE, UNAVAILABLE):
        return True
    if binding.columns is not None:
        return column in binding.columns
    return column not in binding.except_columns
