"""The arrow validator's route through the staging job (issue #25): the plan the driver builds
around :func:`materializer.sources.documents.check.check_batches` (DataFrame calls only), the conf
that picks the validator, and the errors its job can end with.

One Spark job reads the lines, marks the fast ones in Arrow batches on the executors and types
their top-level scalars there, types their other declared fields with ``from_json``, and sends the
others down the VARIANT route, all ahead of the staging write (:func:`deferred`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from materializer import sqltypes
from materializer.sources.documents import check as document_check
from materializer.sources.documents.check import MISSING, OK, OP_COLUMN, TYPED_PREFIX, python_typed

__all__ = [
    "DEFAULT_VALIDATOR", "DRIVER_NEEDS", "FAST_JSON", "OP_COLUMN", "SMALL_EPOCH_BYTES", "SMALL_EPOCH_RECORDS", "VALIDATOR_CONF",
    "SetAside", "deferred", "explain", "fast_schema", "marked_documents", "marked_lines", "not_fast_only", "set_aside", "typed_fast", "validator",
]

VALIDATOR_CONF = "spark.materializer.documents.validator"
"""The Spark conf that picks how declared documents are checked: ``arrow`` (this module) or
``variant`` (Spark expressions only, :mod:`materializer.sources.documents.source`)."""
DEFAULT_VALIDATOR = "arrow"
"""With a declared schema, unless the conf says otherwise or the epoch is small: measured cheaper
than the VARIANT route (docs, Performance) and held to the same tables and refusals by
tests/test_documents_arrow.py."""
DRIVER_NEEDS = ("msgspec", "pyarrow", "pandas")
"""What ``mapInArrow`` and the validator need in the driver's Python (PySpark builds the function
with pandas_udf, which asks for pandas and pyarrow)."""


SMALL_EPOCH_BYTES = 1 << 20
"""A files epoch under this many bytes of documents takes the VARIANT route unless the conf picks
a validator: the same tables and refusals, without Spark's Python workers. Spark stops a worker
idle for a minute, and starting two again cost an epoch 0.85 s of wall and 1.5 s of CPU here (an
epoch of follow mode after a quiet minute); warm, the two routes cost the same within the noise
up to 10,000 documents (docs, Performance)."""
SMALL_EPOCH_RECORDS = 10_000
"""The same for a topic's epoch, in records (its bytes are known only once read)."""


def validator(spark: Any, *, small: bool = False, declared: Any = None) -> str:
    """The validator the session asks for (:data:`VALIDATOR_CONF`). Unset, the arrow validator
    when the driver's Python has what it needs, the epoch is not ``small``
    (:data:`SMALL_EPOCH_BYTES`) and the declared schema (``declared``, a ``StructType``) is one
    whose documents the validator can find fast (:func:`fast_schema`), else the VARIANT route:
    both give the same tables and the same refusals, so the choice is one of cost only."""
    import importlib.util
    import json

    from materializer.errors import ConfigError

    chosen = (spark.conf.get(VALIDATOR_CONF, "") or "").strip().lower()
    missing = [name for name in DRIVER_NEEDS if importlib.util.find_spec(name) is None]
    if not chosen:
        fits = declared is None or fast_schema(json.loads(declared.json()))
        return DEFAULT_VALIDATOR if not missing and not small and fits else "variant"
    if chosen not in ("arrow", "variant"):
        raise ConfigError(f"Spark conf {VALIDATOR_CONF} is {chosen!r}; it must be 'arrow' or 'variant'")
    if chosen == "arrow" and missing:
        raise ConfigError(
            f"Spark conf {VALIDATOR_CONF} is 'arrow', but this Python lacks {', '.join(missing)}: install "
            "them (pip install 'delta-materializer[local]' brings them), or set the conf to 'variant'"
        )
    return chosen


def fast_schema(schema: dict[str, Any]) -> bool:
    """Whether a document that holds a value in every field of ``schema`` (Spark's JSON form) can
    be fast: every field, at any depth, a whole number, a DOUBLE, a BOOLEAN, a STRING, a
    TIMESTAMP, a DATE or a DECIMAL (:data:`document_check.PYTHON_TYPES`,
    :data:`document_values.CONVERTERS`), or a struct or array of them. A document holding a
    FLOAT, a map, a binary value or a TIMESTAMP_NTZ is never fast (the validator cannot promise
    that ``from_json`` reads it as the VARIANT route does), so with such fields nearly every
    document would take the VARIANT route after the validator's pass: a pass for nothing, which
    doubled the CPU of such an epoch (docs, Performance)."""

    def fits(dtype: Any) -> bool:
        if isinstance(dtype, dict):
            if dtype["type"] == "struct":
                return all(fits(f["type"]) for f in dtype["fields"])
            if dtype["type"] == "array":
                return fits(dtype["elementType"])
            return False
        return dtype in document_check.PYTHON_TYPES or document_check.converted(dtype) is not None

    return all(fits(f["type"]) for f in schema["fields"])


FAST_JSON = "__j"
"""The fast documents' fields the validator does not type (:func:`python_typed`), typed by
``from_json`` (NULL for the other documents; absent when every declared field is typed by it)."""


def deferred(reader: Any, parsed: Any, *, python_types: bool = True) -> tuple[Any, Callable[[], int]]:
    """The documents reader's deferred checks (``DocumentReader.deferred``), fast documents first: one
    Spark job reads the lines, marks the fast ones in Arrow batches and types their top-level
    scalars there (:func:`python_typed`; their other fields with ``from_json``), and sends the
    others down the VARIANT route (parse, the staging job's lean checks, cast), all
    ahead of the staging write. On the error path (a document refused) the full checks name it:
    the validator marks the lines again and only the documents it does not find fast are parsed
    and judged (:func:`marked_lines`), as the dead letters' are; a fast one is never refused.
    ``python_types=False`` types every field with ``from_json`` (the route before the validator
    typed scalars; ``stage_profile`` measures both)."""
    import uuid

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from materializer.errors import SourceError
    from materializer.sources.documents.refusals import rereading
    from materializer.sources.documents.variant_shape import parse_shape

    assert reader.declared is not None and reader.lines is not None
    reader.deferred_documents = parsed
    reader.marked = True
    staged = marked_documents(reader, python_types=python_types)
    ok = F.col(OK)
    checked = reader.checked(staged, lean=True)  # the documents not fast only
    tallies = Observation(f"documents_{uuid.uuid4().hex[:12]}")
    good = checked.observe(tallies, *reader.tallies(), F.count_if(ok).alias("fast")).where(F.col("__problem").isNull())

    def verify() -> int:
        row = tallies.get
        reader.fast = int(row["fast"])
        shape = row["shape"]
        if row["bad"] or (shape is not None and reader.single_problems(parse_shape(shape))):
            rereading(reader.store.uri, reader.small)
            check_not_fast(reader)
            if not row["bad"]:
                # The merged shape mixes kinds the declared types take each of (a TIMESTAMP from
                # text and from seconds), and every document fits alone: the rows stand.
                return int(row["n"])
            raise SourceError(
                f"{reader.store.uri}: a document of this transaction is refused by the staging job's checks but "
                f"not by the full checks; nothing was applied. Set the Spark conf {VALIDATOR_CONF}=variant and "
                "report this as a bug. " + reader.hint()
            )
        return int(row["n"])

    return reader.rows(good, reader.declared), verify


def check_not_fast(reader: Any) -> None:
    """The full checks (``reader.check``: the VARIANT route, its words and file:line) over the
    epoch's documents the validator does not find fast, on the error path of a staging job of
    this route: the fast ones are marked again, not parsed (a fast document is one the full checks
    take), and so are the lines of the bad file the error numbers. With a VARIANT parse of every
    document, four bad lines of a 2M-line file were named after 76.9 s, without it after 30.9 s,
    where the clean file lands in 27.3 s (docs: 'The documents source'). Not for a
    staging job that failed in ``from_json``: there the validator found the culprit fast
    (:func:`explain`, the VARIANT route over every document)."""
    reader.judged_for_errors = lambda lines: marked_lines(reader, lines)
    try:
        reader.check(marked_lines(reader, reader.document_lines()))
    finally:
        reader.judged_for_errors = None


def marked_documents(reader: Any, *, python_types: bool = True) -> Any:
    """The epoch's documents as the VARIANT route's ``parsed`` has them (``value``, ``_seq``,
    ``__v``), marked in Arrow batches on the executors: :data:`OK` for the fast ones, their
    top-level scalars typed there (:func:`python_typed`, ``reader.typed_by_python``) and their
    other declared fields by ``from_json`` (:data:`FAST_JSON`); ``__v`` is parsed for the others
    only. ``reader.checked`` judges the others alone (a fast document has no problem), so the
    VARIANT route's checks, errors and values stay theirs. ``python_types=False`` types every
    field with ``from_json``."""
    import json

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from materializer.sources.json_text import parse_one

    declared = reader.declared
    assert declared is not None and reader.lines is not None
    value = F.col("value")
    lines = reader.document_lines()  # as the VARIANT route reads them (files: blank lines skipped)
    fields = python_typed(json.loads(declared.json()), reader.hidden) if python_types else []
    by_python = {name: declared[name].dataType for name, _dtype in fields}
    # The other declared fields (nested, or of a type whose value makes no document fast unless
    # null: timestamps, dates, decimals, floats, maps, binary) are typed by from_json, so Spark's
    # verdict on them stays final even for a document the validator were wrong to call fast.
    by_spark = [f for f in declared.fields if f.name not in by_python and f.name not in reader.hidden]
    marked = lines.mapInArrow(
        # The validator types the top-level scalars itself; the text goes back only when
        # from_json must type other fields.
        document_check.check_batches(declared.json(), list(reader.keys), list(reader.hidden), typed=list(by_python), keep_text=bool(by_spark)),
        T.StructType(
            [
                *lines.schema.fields,
                T.StructField(OK, T.BooleanType(), False),
                T.StructField(OP_COLUMN, T.StringType()),
                *[T.StructField(f"{TYPED_PREFIX}{i}", _sent_as(dtype)) for i, dtype in enumerate(by_python.values())],
            ]
        ),
    )
    reader.typed_by_python = {name: f"{TYPED_PREFIX}{i}" for i, name in enumerate(by_python)}
    ok = F.col(OK)
    staged = marked.withColumn("__v", F.when(~ok, parse_one(value)))
    if by_spark:
        # FAILFAST: a value from_json cannot read fails the job (explain names the document), it
        # never lands as a NULL.
        staged = staged.withColumn(FAST_JSON, F.when(ok, F.from_json(value, T.StructType(by_spark), {"mode": "FAILFAST"})))
    return staged


def marked_lines(reader: Any, lines: Any) -> Any:
    """``lines`` (``value`` first; documents only, no blank line) with :data:`OK` for the documents
    the validator finds fast and ``__v`` parsed for the others only: what ``reader.checked`` judges
    as it judges the VARIANT route's (the fast ones have no problem). Nothing is typed: for the
    dead letters' texts (``document_refusals.dead_letter_rows``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from materializer.sources.json_text import parse_one

    declared = reader.declared
    assert declared is not None
    marked = lines.mapInArrow(
        document_check.check_batches(declared.json(), list(reader.keys), list(reader.hidden), typed=[], keep_text=True),
        T.StructType([*lines.schema.fields, T.StructField(OK, T.BooleanType(), False), T.StructField(OP_COLUMN, T.StringType())]),
    )
    return marked.withColumn("__v", F.when(~F.col(OK), parse_one(F.col("value"))))


@dataclass(frozen=True)
class SetAside:
    """What :func:`set_aside` found: the epoch's documents, and those the validator does not find
    fast as the reader keeps them (files: ``value`` and ``_seq``; Kafka: the records), read back
    from the spool (None: every document is fast)."""

    documents: int
    others: "Any | None"


def set_aside(reader: Any, spool: Any, path: str, *, files: bool = False) -> SetAside:
    """For ``on_invalid: dead_letter``: one Spark job over the epoch's lines that judges each
    document with the validator and writes the ones it does not find fast (:class:`SetAside`)
    to ``path`` in the spool (a Parquet dataset; the runtime deletes the epoch's spool once it is
    staged). Only those can be dead letters, so the checks, the refused shapes and the dead
    letters' rows read them from there instead of reading and judging the whole epoch again,
    each in a job of its own (an epoch of 450,000 documents with 18 bad ones read the lines six
    times: docs, Performance). ``files``: the lines are a files epoch's, so the job's Arrow
    batches need no byte limit (:data:`materializer.spark.settings.ARROW_BATCHES_BY_RECORDS`)."""
    import uuid

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from materializer.spark.settings import ARROW_BATCHES_BY_RECORDS, session_confs

    declared = reader.declared
    assert declared is not None and reader.lines is not None
    judged, kept = reader.judged_lines()
    seen, left = Observation(f"documents_{uuid.uuid4().hex[:12]}"), Observation(f"not_fast_{uuid.uuid4().hex[:12]}")
    others = (
        judged.observe(seen, F.count(F.lit(1)).alias("n"))
        .mapInArrow(
            not_fast_only(declared.json(), list(reader.keys), list(reader.hidden), len(judged.columns) - len(kept.columns)), kept.schema
        )
        .observe(left, F.count(F.lit(1)).alias("n"))
    )
    uri = spool.spark_path(path)
    try:
        with session_confs(reader.spark, ARROW_BATCHES_BY_RECORDS if files else {}):
            others.write.mode("overwrite").parquet(uri)
    except Exception as exc:  # noqa: BLE001 - an executor without the validator: one paragraph
        missing = _missing(str(exc))
        if missing is not None:
            raise missing from exc
        raise
    documents, set_apart = int(seen.get["n"]), int(left.get["n"])
    return SetAside(documents, reader.spark.read.parquet(uri) if set_apart else None)


def not_fast_only(schema_json: str, keys: list[str], hidden: list[str], skip: int = 0) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of :func:`set_aside`: each batch's documents the validator
    does not find fast (the text judged first), as they came, without the first ``skip``
    columns."""
    judge = document_check.check_batches(schema_json, keys, hidden, typed=[], keep_text=True)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        for out in judge(batches):
            others = out.filter(pc.invert(out.column(OK)))
            if others.num_rows:
                yield others.select(range(skip, out.num_columns - 2))  # without OK and OP_COLUMN

    return run


def _sent_as(dtype: Any) -> Any:
    """The Spark type of a :func:`python_typed` field's values as the validator sends them
    (:func:`document_check.arrow_type`): a TIMESTAMP as a LONG of microseconds, a DATE as an INT
    of days; :func:`typed_fast` turns them back."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.TimestampType):
        return T.LongType()
    if isinstance(dtype, T.DateType):
        return T.IntegerType()
    return dtype


def typed_fast(column: Any, name: str, reader: Any, columns: list[str]) -> Any:
    """A declared field: for a fast document the validator's value (:func:`python_typed`) or
    ``from_json``'s (the other fields); ``column`` (the VARIANT route's) for the others.
    ``columns``: the plan's."""
    from pyspark.sql import functions as F

    if name in reader.typed_by_python:
        fast = F.col(reader.typed_by_python[name])
        dtype = reader.declared[name].dataType
        if sqltypes.holds_string(dtype):
            # mapInArrow's rows carry the type the client declared them with, which Spark Connect
            # spells with its collation: cast to the plain type, as every cast is (sqltypes).
            fast = fast.cast(sqltypes.plain(dtype))
        elif dtype.typeName() == "timestamp":
            fast = F.timestamp_micros(fast)  # the validator's microseconds since the epoch
        elif dtype.typeName() == "date":
            fast = F.date_from_unix_date(fast)  # the validator's days since the epoch
    elif FAST_JSON in columns:
        fast = F.col(FAST_JSON)[name]
    else:
        fast = F.lit(None)  # a name the table keeps for itself: never in a fast document
    return F.when(F.col(OK), fast).otherwise(column)


def explain(reader: Any, text: str) -> Any:
    """The error for a staging job that failed on this route (None: not this route's failure)."""
    from materializer.errors import SourceError

    missing = _missing(text)
    if missing is not None:
        return missing
    if "MALFORMED_RECORD_IN_PARSING" not in text and "FAILFAST" not in text:
        return None
    located = reader.located()
    if located is not None:
        return located
    return SourceError(
        f"{reader.store.uri}: Spark's JSON parser (from_json, with source.schema) could not read a document that "
        f"every check passed; nothing was applied. Set the Spark conf {VALIDATOR_CONF}=variant and report this as "
        "a bug. " + reader.hint()
    )


def _missing(text: str) -> Any:
    """The error for a job that failed on an executor without the validator (None: not that)."""
    from materializer.errors import SourceError

    if MISSING in text or "msgspec is not installed on this Spark executor" in text:
        return SourceError(MISSING)
    if "No module named 'pyarrow'" in text or "No module named 'pandas'" in text:
        return SourceError(MISSING.replace("msgspec is not installed", "pyarrow or pandas is not installed", 1))
    return None
