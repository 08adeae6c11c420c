"""The documents an epoch's shape refuses, found on the error path of the JSON documents reader
(:mod:`materializer.sources.documents.reader`).

Some problems show only in a document's shape (``schema_of_variant``), not in a rule over its
values: with a declared schema, a field it does not declare or a JSON kind its type cannot take,
at any depth; without one, a field of two kinds across the epoch. :func:`refused_shapes` finds the
shapes that do not fit the declared schema alone, so that their documents are refused one by one
(dead letters, or counted and named by ``fail``'s error); :func:`first_misfit` finds the first
document behind a problem of the epoch's merged shape. Both run Spark jobs for such epochs only.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol

from materializer.columns import SEQ
from materializer.sources.documents.schema import kinds_of, misfit
from materializer.sources.documents.shapes import against_declared, conflict, merge_shapes, shape_problems
from materializer.sources.documents.variant_shape import Shape, parse_shape
from materializer.sources.json_text import too_deep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

LINE_SHOWN = 1 << 20
"""Bytes of a bad line the driver fetches (error path only) to say what is wrong with it."""
WORDED_SHAPES = 100
"""Refused shapes whose first document the driver fetches to word their problem as ``fail`` does."""
MAX_REFUSED_SHAPES = 10_000
"""The distinct document shapes of an epoch looked at for ones that do not fit the declared schema
alone; an epoch of more is refused as a whole, naming its first such document."""


log = logging.getLogger("materializer")


def rereading(uri: str, small: bool) -> None:
    """Say, for an epoch of more than a few documents, that the error path reads it again: on a
    big file that takes about as long as the staging job did, and the error comes after."""
    if not small:
        log.info("%s: the staging job found documents to check more closely; reading the epoch again to name any refused (file and line)", uri)


class ShapeJudge(Protocol):
    declared: "StructType | None"
    shapes_judged_alone: bool

    def single_problems(self, shape: Shape) -> list[str]: ...


def why(text: str, problems: list[str] | None, declared: "StructType | None") -> str:
    """The problem of one bad line, worded from its own content where the driver can parse it."""
    if declared is not None:
        try:
            # A text too deep is never parsed here either: json.loads recurses once per level.
            doc = None if too_deep(text) else json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            found = misfit(doc, kinds_of(declared), "")
            if found is not None:
                return found
    return (problems or ["a document is refused"])[0]


def refused_shapes(reader: ShapeJudge, checked: "DataFrame", row: Any) -> tuple[dict[str, str], "dict[str, Any] | None"]:
    """The good documents' shapes (of ``checked``, which has ``__v``, ``__problem`` and ``value``)
    that do not fit the declared schema alone, each with its problem as the ``fail`` error words it
    for the shape's first document; none when the epoch's merged shape (``row["shape"]``) fits.
    With them, the epoch's tallies (``row``, :meth:`DocumentReader.tallies`) as checking it again
    with those shapes refused would count them, from the same job that found the shapes (no
    ``shape``: every document left fits the declared schema alone, so the verdict is that schema)."""
    from pyspark.sql import functions as F

    if not row["n"] or row["shape"] is None or not reader.single_problems(parse_shape(row["shape"])):
        return {}, None
    shape = F.schema_of_variant(F.col("__v"))
    good = checked.where(F.col("__problem").isNull() & F.col("__v").isNotNull())
    # Files only where _seq has them (Kafka's records are found again by their __problem).
    files = "files" in row.asDict() and "file" in checked.schema[SEQ].dataType.fieldNames()
    tallied = _good_shapes(checked, tallied=True, files=files)
    if tallied is None:
        # More distinct shapes than the driver collects: each document's is judged where it is.
        reader.shapes_judged_alone = True
        return {}, None
    shapes = [item["shape"] for item in tallied]
    problems = {name: found for name in shapes if (found := reader.single_problems(parse_shape(name)))}
    if not problems:
        return {}, None
    # Worded from each shape's first document (a few: each text comes to the driver), else by the
    # shape's first problem.
    firsts = (
        good.where(shape.isin(list(problems)))
        .groupBy(shape.alias("shape"))
        .agg(F.min_by(F.substring("value", 1, LINE_SHOWN), F.col(SEQ)).alias("text"))
        .limit(WORDED_SHAPES)
        .collect()
    )
    worded = {name: found[0] for name, found in problems.items()}
    worded.update({item["shape"]: why(item["text"], problems[item["shape"]], reader.declared) for item in firsts})
    refused = [item for item in tallied if item["shape"] in problems]
    tallies = row.asDict()
    if set(tallies) - {"n", "bad", "first", "shape", "files"}:
        return worded, None  # a tally of the good documents' own (Debezium's): counted again
    tallies["bad"] = row["bad"] + sum(item["n"] for item in refused)
    # (_seq compares as Spark's min compares the struct: file, block, row.)
    tallies["first"] = min(item for item in [row["first"], *(item["first"] for item in refused)] if item is not None)
    tallies["shape"] = None
    if files:
        tallies["files"] = sorted(set(tallies["files"] or []).union(*(item["files"] for item in refused)))
    return worded, tallies


def shape_judge(declared: "StructType") -> Any:
    """A Python UDF of a document's shape (``schema_of_variant``) and its text: what in the shape
    does not fit ``declared`` alone, worded from the text as :func:`why` words it (NULL: it
    fits). For an epoch of more distinct shapes than :data:`MAX_REFUSED_SHAPES`, where the driver
    cannot collect them to judge each once: the executors judge each document's, a shape once per
    Python worker. Error path only: an epoch whose merged shape fits never runs it."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema_json = declared.json()

    def judge(shape: "str | None", text: "str | None") -> "str | None":
        return judged_shape(schema_json, shape, text)

    return F.udf(judge, T.StringType())


_judged: dict[tuple[str, str], list[str]] = {}
_schemas: dict[str, Any] = {}


def judged_shape(schema_json: str, shape: "str | None", text: "str | None") -> "str | None":
    """:func:`shape_judge`'s verdict on one document (its shape's problems kept per process, at
    most 100,000 shapes)."""
    if shape is None:
        return None
    problems = _judged.get((schema_json, shape))
    declared = _schemas.get(schema_json)
    if declared is None:
        from pyspark.sql import types as T

        declared = _schemas[schema_json] = T.StructType.fromJson(json.loads(schema_json))
    if problems is None:
        if len(_judged) >= 100_000:
            _judged.clear()
        problems = _judged[(schema_json, shape)] = against_declared(parse_shape(shape), declared)
    if not problems:
        return None
    return why(text, problems, declared) if text is not None else problems[0]


def each_fits_alone(reader: ShapeJudge, checked: "DataFrame") -> bool:
    """Whether every good document of ``checked`` fits the declared schema alone (judged by its
    shape; more than MAX_REFUSED_SHAPES shapes: not known, False). Then an epoch whose merged shape
    mixes JSON kinds still fits: a declared type can take more than one kind (a TIMESTAMP from
    text in one document and from a number in another), and the table's types are the declared
    ones, not the merged shape's."""
    shapes = _good_shapes(checked)
    return shapes is not None and not any(reader.single_problems(parse_shape(item["shape"])) for item in shapes)


def _good_shapes(checked: "DataFrame", tallied: bool = False, files: bool = False) -> "list[Any] | None":
    """The distinct shapes of the good documents of ``checked`` (one Spark job), as rows with
    ``shape`` and, when ``tallied``, their documents' count ``n``, the ``first`` ``_seq`` and (with
    ``files``) the ``files``; None when there are more than MAX_REFUSED_SHAPES."""
    from pyspark.sql import functions as F

    # A good document has a __v, unless the arrow validator found it fast: it fits alone.
    good = checked.where(F.col("__problem").isNull() & F.col("__v").isNotNull())
    shape = F.schema_of_variant(F.col("__v")).alias("shape")
    if tallied:
        found = good.groupBy(shape).agg(
            F.count(F.lit(1)).alias("n"), F.min(F.col(SEQ)).alias("first"), *([F.collect_set(F.col(f"{SEQ}.file")).alias("files")] if files else [])
        )
    else:
        found = good.select(shape).distinct()
    shapes = found.limit(MAX_REFUSED_SHAPES + 1).collect()
    return None if len(shapes) > MAX_REFUSED_SHAPES else shapes


def first_misfit(reader: ShapeJudge, checked: "DataFrame") -> "tuple[Any, str, list[str]] | None":
    """The first document behind a problem of the epoch's merged shape: the ``_seq`` of the first
    document of its shape, the shape, and the problems. The distinct shapes of the good documents
    (a document refused alone has no part in the epoch's shape), taken in order of their first
    document, until one has a problem alone or conflicts with the shapes before it."""
    from pyspark.sql import functions as F

    shapes = (
        checked.where(F.col("__problem").isNull() & F.col("__v").isNotNull())
        .groupBy(F.schema_of_variant(F.col("__v")).alias("shape"))
        .agg(F.min(F.col(SEQ)).alias("first"))
        .orderBy("first")
        .limit(MAX_REFUSED_SHAPES)
        .collect()
    )
    merged: Shape = None
    for item in shapes:
        shape = parse_shape(item["shape"])
        alone = reader.single_problems(shape)
        before, merged = merged, (shape if merged is None else merge_shapes(merged, shape))
        if alone or (reader.declared is None and shape_problems(merged)):
            return item["first"], item["shape"], alone or [conflict(before, shape, "") or shape_problems(merged)[0]]
    return None


def dead_letter_rows(reader: Any, marked: "Callable[[Any, DataFrame], DataFrame]", others: "DataFrame | None" = None) -> "DataFrame":
    """The invalid documents of ``reader``'s epoch (a ``DocumentReader`` whose check found some,
    ``bad_files``) with their file's URI, line number and problem (``on_invalid: dead_letter``).

    Numbered as the error path numbers them: the lines of their files, in file order (blank
    lines counted), a part-read file's lines carrying their number already. With the arrow
    validator only the documents it does not find fast are parsed and judged (a fast one is never
    a dead letter, and the bad files can be the whole epoch): ``others``, those documents as
    ``document_route.set_aside`` kept them, parsed (the lines are then read again only to count
    each split's), else the bad files' lines with the validator's marks (``marked``,
    ``document_route.marked_lines``)."""
    from pyspark.sql import functions as F

    from materializer.dead_letters import rejected_rows, split
    from materializer.sources.line_numbers import with_line_numbers

    assert reader.lines is not None
    file = F.col(f"{SEQ}.file")
    arrow = reader.validator == "arrow" and reader.declared is not None and not reader.sequence_by
    if others is not None:
        # The splits are counted over every line of the epoch, as the set-aside job read them (a
        # filter on the files could leave some out of the scan, and number its rows otherwise).
        _good, bad = split(reader.checked(others))
        bad = with_line_numbers(bad, "__n", counted=reader.lines)
    else:
        lines = with_line_numbers(reader.lines.where(file.isin(reader.bad_files)), "__n")
        checked = reader.checked(marked(reader, reader._not_blank(lines)) if arrow else reader._with_variant(lines))
        _good, bad = split(checked)
    bad = bad.withColumn("__line", F.when(file == F.lit(""), F.col(f"{SEQ}.row")).otherwise(F.col("__n")))
    if arrow:
        # mapInArrow's rows carry the types the client declared them with, which Spark Connect
        # spells with their collation (a table of such a column is one delta-rs cannot open), and
        # a cast to STRING is dropped as a no-op: the text goes through its bytes.
        bad = bad.withColumn("value", F.col("value").cast("binary").cast("string"))
    names = F.create_map(*[x for f in reader.bad_files for x in (F.lit(f), F.lit(f"{reader.store.uri}/{reader._name(f)}"))])
    return rejected_rows(bad, names[file], F.col("__line"))
