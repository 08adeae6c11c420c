"""JSON documents to checked, typed rows: the reader the documents source and the kafka source's JSON
payloads share (one Spark plan per epoch; errors located by file and line, or topic, partition and
offset).

Everything else runs in Spark (DESIGN invariant 8): ``spark.read.text`` of the epoch's files,
``try_parse_json`` of each line to a VARIANT, and one aggregate that checks every document (valid
JSON within Spark's parser limits, an object, key fields present and scalar, no reserved field, a
well-formed ``_meta``, no number too long to hold exactly) and derives the epoch's schema with
``schema_of_variant_agg``. Only that one row reaches the driver. Without ``source.schema`` the
epoch's types come from it (integers BIGINT, fractions DOUBLE, objects structs: what
``spark.read.json`` inferred, so tables made by earlier versions stay compatible; a field NULL in
the whole epoch carries no type and is left out, so it lands as NULL); with one, the schema is
compared to the declaration (no undeclared field at any depth, every value of the declared kind).
A field that holds two kinds of JSON value in one epoch, names Delta refuses, or two names that
differ only in case stop the run too. The rows are then the VARIANT cast to that schema.

Order: ``_seq`` is ``struct(file, block, row)``: the file's name, the start of the split Spark read
the line in, and ``monotonically_increasing_id`` (increasing within a partition, and a split is
read by one partition in file order). So last write wins by (file, position in file) exactly,
however Spark splits large files or packs small ones.

On a failure the error names the file and line of the first bad documents: only then is the one
file concerned numbered line by line (in Spark), and the offending line looked at by the driver.

This module is the reader (:class:`DocumentReader`: read, check, type, locate); its pieces live
beside it: the per-document checks as a Spark column (``document_rules.py``), shapes judged in
plain Python (``document_shapes.py``), a declared ``source.schema`` (``document_schema.py``), the
typing of the rows (``document_types.py``), and the checks in Arrow batches (``document_check.py`` on the
executors, ``document_route.py`` the staging job's plan around them).
"""

from __future__ import annotations

import json
from urllib.parse import unquote
from typing import TYPE_CHECKING, Any, Callable

from materializer import sqltypes
from materializer.errors import SourceError
from materializer.dead_letters import split
from materializer.columns import OP, SEQ
from materializer.sources.documents.refusals import LINE_SHOWN, dead_letter_rows, each_fits_alone, first_misfit, refused_shapes, rereading, shape_judge, why
from materializer.sources.documents.rules import EXACT_DIGITS, problem_column
from materializer.sources.documents.schema import ANY, Kinds, kinds_of, misfit, parse_schema
from materializer.sources.documents.shapes import (
    DELTA_INVALID,
    against_declared,
    declared_problems,
    inferred_type,
    shape_problems,
)
from materializer.sources.documents.types import cast_type, typed, with_void
from materializer.sources.json_text import parse_one
from materializer.sources.line_numbers import with_line_numbers
from materializer.sources.documents.variant_shape import Shape, parse_shape
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "ANY", "DELTA_INVALID", "EXACT_DIGITS", "FIRST_FAILURES", "LINE_SHOWN", "DocumentReader", "Kinds", "Shape",
    "change_controlled", "declared_problems", "inferred_type", "kinds_of", "misfit", "parse_schema", "parse_shape",
    "shape_problems",
]
"""The one public interface for JSON documents; the reader's pieces live beside it (``document_*.py``)
and are re-exported here under the names they had."""

FIRST_FAILURES = 3
"""How many bad lines an error names."""


# --- the reader ------------------------------------------------------------------------------------


def change_controlled(reader: "DocumentReader", binding: Any) -> None:
    """Give the reader the binding's sequence paths and the names its table keeps for itself."""
    from materializer.changes import hidden_columns

    reader.sequence_by = list(binding.sequence_by)
    reader.hidden = hidden_columns(binding)
    reader.delete_when = binding.delete_when


class DocumentReader:
    """One epoch's Spark plan: read, check, type."""

    def __init__(
        self, spark: "SparkSession", store: Store, keys: list[str], declared: "StructType | None",
        checkpoint: dict[str, Any] | None, *, dead_letter: bool = False, columns: "dict[Any, Column] | None" = None,
    ) -> None:
        self.spark = spark
        self.columns: dict[Any, Column] = {} if columns is None else columns
        """The check columns already built, by what they depend on (:meth:`_built`): a source keeps
        them from epoch to epoch, as each costs hundreds of calls to the JVM to build and is the
        same every epoch (an unresolved expression, reused by every epoch's plan)."""
        self.dead_letter = dead_letter
        self.bad = 0
        """Invalid documents of the epoch (set aside when ``dead_letter``)."""
        self.bad_files: list[str] = []
        """``_seq.file`` values of the files holding them (``dead_letter`` only)."""
        self.lines: "DataFrame | None" = None
        self.store = store
        self.keys = keys
        self.declared = declared
        self.resume_from = checkpoint
        self.names: dict[str, str] = {}
        """The file names behind ``_seq.file`` values (the last segment of Spark's path URI)."""
        self.done: dict[str, int] = {}
        """Lines of a part-read file (a previous version's checkpoint) that are not this epoch's."""
        self.deferred_documents: DataFrame | None = None
        """The parsed documents when their checks are deferred to the staging job (:meth:`deferred`)."""
        self.marked = False
        """Whether the staging job's documents are the arrow validator's marked ones
        (:func:`document_route.deferred`): only the documents it does not find fast are cast."""
        self.judged_for_errors: "Callable[[DataFrame], DataFrame] | None" = None
        """How the error path readies a bad file's numbered lines for :meth:`checked` (None: each
        parsed, :meth:`_with_variant`). Where every refused document is one the arrow validator does
        not find fast, the others need no parse (:func:`document_route.marked_lines`)."""
        self.sequence_by: list[str] = []
        """The binding's ``sequence_by`` paths: checked per document, and read into ``__sequence``."""
        self.hidden: tuple[str, ...] = ()
        self.delete_when: str | None = None
        """The binding's ``delete_when``: a cast it implies (a field compared with a literal of
        another type) fails in the staging job like a value that does not fit the schema."""
        """Top-level names the table keeps for itself (materializer.changes), refused in documents."""
        self.shape: Shape = None
        """The epoch's merged shape, once :meth:`check` ran (types the sequence fields)."""
        self.validator = "variant"
        """How :meth:`deferred` checks: ``variant`` (Spark expressions) or ``arrow``
        (:mod:`materializer.sources.documents.check`: a compiled validator in Arrow batches)."""
        self.fast: int | None = None
        """Documents the ``arrow`` validator found fast, once its staging job has run."""
        self.small = True
        """Whether the epoch is small (``SourceBatch.small``): a bigger one's error path says it reads again."""
        self.shape_refusals: dict[str, str] = {}
        """With a declared schema: the document shapes (``schema_of_variant``)
        that do not fit the schema alone (an undeclared field, a kind the declared type cannot take,
        at any depth), each with its problem: :meth:`problem` refuses their documents one by one."""
        self.shapes_judged_alone = False
        """With a declared schema, an epoch of more distinct shapes than the driver collects
        (:data:`document_refusals.MAX_REFUSED_SHAPES`): each document's shape is judged on the
        executors instead (:func:`document_refusals.shape_judge`), and :meth:`problem` refuses the
        ones that do not fit."""
        self.typed_by_python: dict[str, str] = {}
        """With the ``arrow`` validator: the declared fields it types itself, and their columns."""

    # --- reading ---

    def _text(self, names: list[str]) -> "DataFrame":
        from pyspark.sql import functions as F

        paths = [self.store.spark_path(name) for name in names]
        # lineSep "\n": lines as the previous version (and every JSON Lines writer) counted them;
        # a stray "\r" is whitespace to the JSON parser.
        raw = self.spark.read.option("lineSep", "\n").text(paths)
        path = F.col("_metadata.file_path")
        # _seq's file is Spark's path URI as it is (a per-file constant, no work per line) when
        # those sort as the names do: the files share one folder, so only percent-encoding could
        # change the order. Spark's URIs are known on the driver without reading a file.
        encoded = {unquote(uri.rsplit("/", 1)[-1]): uri.rsplit("/", 1)[-1] for uri in raw.inputFiles()}
        if set(encoded) == set(names) and sorted(names, key=lambda n: encoded[n]) == sorted(names):
            name = path
            self.names.update({encoded[n]: n for n in names})
        else:
            # Names whose encoding sorts otherwise: the name itself, decoded per line ("+" is
            # literal in a URI path, so it is protected from url_decode's form decoding).
            name = F.url_decode(F.replace(F.substring_index(path, "/", -1), F.lit("+"), F.lit("%2B")))
            self.names.update({n: n for n in names})
        return raw.select(
            F.col("value"),
            F.struct(
                name.alias("file"),
                F.col("_metadata.file_block_start").alias("block"),
                F.monotonically_increasing_id().alias("row"),
            ).alias(SEQ),
        )

    def numbered(self, name: str) -> "DataFrame":
        """One file's lines with their numbers (1-based; :mod:`line_numbers`, no sort): the error
        path and a part-read file of a previous version's checkpoint only."""
        return with_line_numbers(self._text([name]), "line").select("value", "line")

    def parsed(self, plan: Any) -> "DataFrame":
        """The epoch's documents as VARIANTs, from ``plan`` (the documents source's: its ``files``, and
        ``resume``, a part-read file of a previous version's checkpoint and its lines done)."""
        from pyspark.sql import functions as F

        parts = []
        if plan.resume is not None:
            info, done = plan.resume
            self.done[info.path] = done
            rest = self.numbered(info.path).where(F.col("line") > done)
            self.names[""] = info.path  # sorts before every whole file's
            parts.append(
                rest.select("value", F.struct(F.lit("").alias("file"), F.lit(0).cast("long").alias("block"), F.col("line").cast("long").alias("row")).alias(SEQ))
            )
        if plan.files:
            parts.append(self._text([f.path for f in plan.files]))
        text = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        self.lines = text
        return self._with_variant(text)

    def document_lines(self) -> "DataFrame":
        """The epoch's texts that are documents (``value`` first, as :attr:`lines` has it), for a
        check that reads the text itself (:mod:`document_check`): the lines :meth:`_with_variant`
        keeps, blank ones skipped."""
        assert self.lines is not None
        return self._not_blank(self.lines)

    def judged_lines(self) -> tuple["DataFrame", "DataFrame"]:
        """What the validator's set-aside job judges (the text first) and what it keeps of each
        document (:func:`document_route.set_aside`): the lines that are documents, as read."""
        kept = self.document_lines().select("value", SEQ)
        return kept, kept

    @staticmethod
    def _not_blank(text: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        value = F.col("value")
        blank = F.trim(value, F.lit(" \t\r\n\f\u000b")) == F.lit("")
        # A line that starts with "{" is not blank: the trim (half the cost of reading the lines
        # again) runs for the others only.
        return text.where(value.startswith("{") | ~blank)

    @classmethod
    def _with_variant(cls, text: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        return cls._not_blank(text).withColumn("__v", parse_one(F.col("value")))

    # --- checking ---

    def variant_parts(self, lean: bool = False) -> "Column":
        """The top-level fields every check looks at (keys, reserved names, ``_meta``, and unless
        ``lean`` the declared fields, which only the full checks read, :mod:`document_rules`) as
        VARIANTs: NULL for a document that is not an object. Computed once per document
        in a column of its own (``__parts``), so the checks do not each cast the document again
        (they did: 3.2 s of JVM CPU per 200k documents for the checks, 1.3 s with this column)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        def build() -> "Column":
            declared = [] if lean or self.declared is None else [f.name for f in self.declared.fields]
            named = self.keys + [OP, SEQ, "_meta", *self.hidden] + declared
            return F.col("__v").try_cast(T.StructType([T.StructField(n, T.VariantType()) for n in dict.fromkeys(named)]))

        return self._built("variant_parts", lean, build)

    def _built(self, name: str, lean: bool, build: "Callable[[], Column]") -> "Column":
        """``build()``, or the column built before for the same binding settings (:attr:`columns`)."""
        key = (
            name, lean, tuple(self.keys), tuple(self.hidden), tuple(self.sequence_by),
            None if self.declared is None else self.declared.json(),
        )
        if key not in self.columns:
            self.columns[key] = build()
        return self.columns[key]

    def problem(self, lean: bool = False) -> "Column":
        """Per document, what is wrong with it (NULL: nothing a row alone shows). Reads ``__v``,
        ``value`` and ``__parts``: apply it through :meth:`checked`.

        ``lean`` (the staging job's checks, :meth:`deferred`): leave out what the staging job
        refuses by other means, so that every document it flags is one the full set flags too:
        a value that does not fit its declared type (the VARIANT cast of the rows fails the job,
        with or without ANSI mode, and :meth:`explain` locates it), and a key that is an object
        or an array where the key is declared a scalar type other than STRING (the epoch's shape
        does not fit the schema). Refused epochs are named by the full set (``verify``)."""
        column = self._built(
            "problem", lean, lambda: problem_column(self.keys, self.hidden, self.sequence_by, self.declared, lean)
        )
        if lean or not (self.shape_refusals or self.shapes_judged_alone):
            return column
        from pyspark.sql import functions as F

        if self.shapes_judged_alone:
            assert self.declared is not None
            return F.coalesce(column, shape_judge(self.declared)(F.schema_of_variant(F.col("__v")), F.col("value")))
        by_shape = F.create_map(*[F.lit(x) for item in sorted(self.shape_refusals.items()) for x in item])
        return F.coalesce(column, by_shape[F.schema_of_variant(F.col("__v"))])

    def checked(self, parsed: "DataFrame", lean: bool = False) -> "DataFrame":
        """``parsed`` with ``__problem``: per document, what is wrong with it alone (NULL: nothing).
        The schema-level checks (:meth:`_verdict`) need the whole epoch's shape on top. Documents
        the arrow validator marked fast (``__ok``, :func:`document_route.marked_documents`) have
        no problem and no ``__v``: only the others are judged."""
        parts, problem = self.variant_parts(lean), self.problem(lean)
        if "__ok" in parsed.columns:
            from pyspark.sql import functions as F

            parts, problem = F.when(~F.col("__ok"), parts), F.when(~F.col("__ok"), problem)
        return parsed.withColumn("__parts", parts).withColumn("__problem", problem)

    def tallies(self) -> list["Column"]:
        """The epoch's aggregate checks: documents, bad ones, the first bad one, the merged shape
        of the good ones."""
        from pyspark.sql import functions as F

        return [
            F.count(F.lit(1)).alias("n"),
            F.count(F.col("__problem")).alias("bad"),
            F.min(F.when(F.col("__problem").isNotNull(), F.col(SEQ))).alias("first"),
            F.schema_of_variant_agg(F.when(F.col("__problem").isNull(), F.col("__v"))).alias("shape"),
            # The files of the invalid documents (a few names, never rows) for their line numbers.
            *([F.collect_set(F.when(F.col("__problem").isNotNull(), F.col(f"{SEQ}.file"))).alias("files")] if self.dead_letter else []),
        ]

    def check(self, parsed: "DataFrame") -> tuple[int, "StructType"]:
        """Check every document in one Spark job; the epoch's document count and schema."""
        checked = self.checked(parsed)
        row = checked.agg(*self.tallies()).first()
        assert row is not None
        if self.declared is not None and not self.shape_refusals:
            # A document that does not fit the declared schema alone, where only the epoch's merged
            # shape shows it: its shape is refused (jobs for such epochs only), so it is a dead
            # letter like the others (docs: 'Dead letters'), and fail's error names the first bad
            # lines in order and counts them all.
            self.shape_refusals, tallies = refused_shapes(self, checked, row)
            if self.shape_refusals or self.shapes_judged_alone:
                checked = self.checked(parsed)
                # As checking again counts them, from the shapes' job (sequence_by types its
                # fields by the merged shape of what is left: checked again).
                row = tallies if tallies is not None and not self.sequence_by else checked.agg(*self.tallies()).first()
                assert row is not None
        return self._verdict(checked, row)

    def _verdict(self, checked: "DataFrame", row: Any) -> tuple[int, "StructType"]:
        """Raise the error for what the tallies found (with ``dead_letter``, note the bad files
        instead); else the count and the epoch's schema."""
        self.bad = int(row["bad"])
        if row["bad"] and self.dead_letter:
            self.bad_files = sorted(row["files"])
        elif row["bad"]:
            raise self._located(checked, row["first"], int(row["bad"]), None)
        # (No shape with a declared schema: every good document was found fast, so fits alone.)
        if row["n"] == 0 or self.bad == row["n"] or (row["shape"] is None and self.declared is not None):
            from pyspark.sql import types as T

            return int(row["n"]), self.declared or T.StructType([])
        shape = parse_shape(row["shape"])
        self.shape = shape
        problems = self.single_problems(shape)
        if problems and not (self.declared is not None and (self.shapes_judged_alone or each_fits_alone(self, checked))):
            raise self._shape_error(checked, problems)
        schema = self.declared if self.declared is not None else inferred_type(shape)
        return int(row["n"]), schema  # type: ignore[return-value]

    def deferred(self, parsed: "DataFrame") -> tuple["DataFrame", "Callable[[], int]"]:
        """With a declared schema: the rows, checked by the job that stages them (one parse of
        the epoch instead of two), and the verdict to ask for once that job has run.

        The tallies are observed (``Observation``, Spark Connect has it too) on every document
        before the bad ones are left out of the rows: a bad document never reaches the cast, and
        any bad one refuses the whole epoch in ``verify``, so leaving it out of rows that will be
        deleted drops nothing. A document that passes alone but not the epoch's shape check (an
        undeclared field, a value of the wrong kind) is cast like the others: the cast drops the
        field or converts the value, verify refuses the epoch; or the cast fails the staging job,
        and :meth:`explain` locates the document. Dead letters can route ``__problem`` rows of
        :meth:`checked` instead of leaving them out.
        """
        import uuid

        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        assert self.declared is not None
        if self.validator == "arrow" and self.lines is not None:  # (a routed topic's records come parsed)
            from materializer.sources.documents import route as document_route

            return document_route.deferred(self, parsed)
        self.deferred_documents = parsed
        checked = self.checked(parsed)
        # A VARIANT cast fails on a value that does not fit its type (whatever spark.sql.ansi.enabled
        # says), so the staging job leaves that check to the cast: lean checks.
        tallies = Observation(f"documents_{uuid.uuid4().hex[:12]}")
        good = self.checked(parsed, lean=True).observe(tallies, *self.tallies()).where(F.col("__problem").isNull())

        def verify() -> int:
            # Blocks until the first action on the rows (their staging job) has run in full.
            row = tallies.get
            refused = bool(row["bad"]) or (row["shape"] is not None and bool(self.single_problems(parse_shape(row["shape"]))))
            if refused:
                # The full check job (error path only) names the documents as the undeferred
                # reading does: the lean checks left some of its per-document rules to the cast
                # and to the epoch's shape.
                self.check(parsed)
            return self._verdict(checked, row)[0]

        return self.rows(good, self.declared), verify

    def _name(self, file: str) -> str:
        """The file name behind a ``_seq.file`` value."""
        return self.names.get(file) or self.names.get(file.rsplit("/", 1)[-1]) or unquote(file.rsplit("/", 1)[-1])

    def single_problems(self, shape: Shape) -> list[str]:
        """What no table can take in ``shape``; with a declared schema, also what does not fit it
        (a STRING column takes values of any kind, so mixed kinds are the declaration's to judge)."""
        if self.declared is not None:
            return against_declared(shape, self.declared)
        return shape_problems(shape)

    def _shape_error(self, checked: "DataFrame", problems: list[str]) -> SourceError:
        """The error naming the first document behind a problem of the epoch's merged shape."""
        found = first_misfit(self, checked)
        if found is not None:
            first, shape, why_found = found
            return self._located(checked, first, None, shape, why_found)
        return SourceError(
            f"{self.store.uri}: the documents of this transaction cannot make one table: {'; '.join(problems)}. "
            + self.hint()
        )

    def hint(self) -> str:
        return (
            "Fix or remove those lines and run again: nothing from this transaction was applied, and the run "
            f"resumes from {json.dumps(self.resume_from) if self.resume_from else 'the start of the source'}."
        )

    def _located(
        self, checked: "DataFrame", first: Any, bad: int | None, shape: str | None, problems: list[str] | None = None
    ) -> SourceError:
        """The error naming the first bad lines of the file of ``first`` (the ``_seq`` of the first
        bad document): its lines numbered (in Spark). The kafka source names records instead."""
        from pyspark.sql import functions as F

        name = self._name(first["file"])
        numbered = self.numbered(name).where(F.col("line") > self.done.get(name, 0))
        judged = self.judged_for_errors
        lines = self.checked(judged(self._not_blank(numbered)) if judged is not None else self._with_variant(numbered))
        if shape is not None:
            wanted = (F.col("__problem").isNull()) & (F.schema_of_variant(F.col("__v")) == F.lit(shape))
        else:
            wanted = F.col("__problem").isNotNull()
        found = (
            lines.where(wanted)
            .orderBy("line")
            .select("line", "__problem", F.substring("value", 1, LINE_SHOWN).alias("text"))
            .limit(FIRST_FAILURES)
            .collect()
        )
        where = f"{self.store.uri}/{name}"
        if not found:
            return SourceError(f"{where}: {'; '.join(problems or ['a document is refused'])}. {self.hint()}", file=where)
        reports = []
        for item in found:
            problem = item["__problem"] or self._why(item["text"], problems)
            reports.append(f"{where}:{item['line']}: {problem}")
        more = f" ({bad} bad document(s) in this transaction)" if bad and bad > len(found) else ""
        message = ".\n".join(reports) + f".{more} {self.hint()}"
        return SourceError(message, file=where, line=int(found[0]["line"]))

    def _why(self, text: str, problems: list[str] | None) -> str:
        """The problem of one bad line, worded from its own content where the driver can parse it."""
        return why(text, problems, self.declared)

    # --- dead letters ---

    def rejected(self, others: "DataFrame | None" = None) -> "DataFrame":
        """The invalid documents with their file's URI, line number and problem (``dead_letter``):
        :func:`materializer.sources.documents.refusals.dead_letter_rows` (``others``: the documents
        the validator set aside, parsed, :func:`document_route.set_aside`)."""
        from materializer.sources.documents.route import marked_lines

        return dead_letter_rows(self, marked_lines, others)

    # --- the rows ---

    def rows(self, parsed: "DataFrame", schema: "StructType") -> "DataFrame":
        from pyspark.sql import functions as F

        doc = with_void(F.col("__v").cast(sqltypes.plain(cast_type(schema))), schema) if schema.fields else None
        op = F.when(F.try_variant_get(F.col("__v"), "$._meta.op", "string") == F.lit("d"), F.lit("d")).otherwise(F.lit("u"))
        columns = [] if doc is None else [typed(doc[f.name], f.dataType) for f in schema.fields]
        if "__ok" in parsed.columns:
            # The arrow validator's fast documents, typed by the validator or from_json (document_check).
            from materializer.sources.documents.route import OP_COLUMN, typed_fast

            columns = [typed_fast(c, f.name, self, parsed.columns) for c, f in zip(columns, schema.fields)]
            op = F.when(F.col("__ok"), F.col(OP_COLUMN)).otherwise(op)
        columns = [c.alias(f.name) for c, f in zip(columns, schema.fields)]
        if self.sequence_by:
            from materializer.changes import SEQUENCE, sequence_column

            columns.append(sequence_column(F.col("__v"), self.sequence_by, self.shape, self.store.uri).alias(SEQUENCE))
        return parsed.select(*columns, op.alias(OP), F.col(SEQ))

    def located(self, not_fast: bool = False) -> SourceError | None:
        """With the checks deferred to a staging job that failed: the full checks' error naming
        the refused documents (a Spark job, error path only); None when they refuse none.
        ``not_fast``: the documents the arrow validator does not find fast only
        (:func:`document_route.check_not_fast`), where the failure can only be theirs."""
        if self.deferred_documents is None:
            return None
        rereading(self.store.uri, self.small)
        try:
            if not_fast:
                from materializer.sources.documents.route import check_not_fast

                check_not_fast(self)
            else:
                self.check(self.deferred_documents)
        except SourceError as found:
            return found
        return None

    def explain(self, exc: BaseException) -> SourceError | None:
        """A cast the per-document checks could not foresee (a value inside an array, say)."""
        text = str(exc)
        if self.validator == "arrow":
            from materializer.sources.documents import route as document_route

            found = document_route.explain(self, text)
            if found is not None:
                return found
        if "INVALID_VARIANT_CAST" not in text and "CAST_INVALID_INPUT" not in text:
            return None
        # Checks deferred to the staging job, which the cast failed: the check job (error path
        # only) names the file and line when a document's kind is what failed it. On the arrow
        # validator's route the VARIANT cast is the documents' it does not find fast: theirs only.
        located = self.located(not_fast=self.marked and "INVALID_VARIANT_CAST" in text)
        if located is not None:
            return located
        first = next((line for line in text.splitlines() if "INVALID_VARIANT_CAST" in line or "CAST_INVALID_INPUT" in line), text)
        what = "does not fit source.schema" if self.declared is not None else "cannot be converted"
        fix = "Fix the document, or change source.schema" if self.declared is not None else "Fix the document"
        if self.delete_when:
            what += f", or delete_when {self.delete_when!r} compares a field with a value of another type"
            fix += ", or delete_when"
        return SourceError(
            f"{self.store.uri}: a value of this transaction's documents {what}: "
            f"{first.strip().split(' SQLSTATE')[0]} {fix}. {self.hint()}"
        )
