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
"""

from __future__ import annotations

import json
from urllib.parse import unquote
from typing import TYPE_CHECKING, Any, Callable

from materializer import sqltypes
from materializer.errors import ConfigError, SourceError
from materializer.dead_letters import rejected_rows, split
from materializer.columns import OP, RESERVED, SEQ
from materializer.sources.json_text import parse_one
from materializer.sources.variant_shape import Shape, parse_shape
from materializer.storage import Store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

DELTA_INVALID = set(" ,;{}()\n\t=`")
"""Characters Delta refuses in column names (without column mapping), and the backtick."""
EXACT_DIGITS = 38
"""Longest run of digits a number may have: Spark's decimals hold 38; longer ones became doubles."""
FIRST_FAILURES = 3
"""How many bad lines an error names."""
LINE_SHOWN = 1 << 20
"""Bytes of a bad line the driver fetches (error path only) to say what is wrong with it."""


# --- schemas as schema_of_variant writes them (plain Python; parse_shape: variant_shape.py) -------

_NUMBERS = ("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT")


def _kind(shape: Shape) -> str:
    if isinstance(shape, tuple):
        return {"object": "an object", "array": "an array", "decimal": "a number"}[shape[0]]
    if shape in _NUMBERS:
        return "a number"
    return {"STRING": "a string", "BOOLEAN": "a boolean", "VOID": "null"}.get(shape, shape.lower())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def shape_problems(shape: Shape, path: str = "") -> list[str]:
    """What in one (merged or single-document) shape no table can take: names Delta refuses, two
    names differing only in case, values of several kinds (``VARIANT``)."""
    if shape == "VARIANT":
        return [f"field {path or '(document)'!r} holds values of different JSON kinds (say a number and a string)"]
    if not isinstance(shape, tuple) or shape[0] == "decimal":
        return []
    if shape[0] == "array":
        return shape_problems(shape[1], f"{path}[]")
    problems = []
    seen: dict[str, str] = {}
    for name, inner in shape[1]:
        where = _join(path, name)
        if not path and name == "_meta":
            continue
        if name == "":
            problems.append(f"a field of {path or 'the document'!r} has an empty name, which no table column can have")
        elif set(name) & DELTA_INVALID:
            problems.append(
                f"field {where!r} has a name Delta refuses (it holds one of space , ; {{ }} ( ) = ` tab newline)"
            )
        if name.lower() in seen:
            problems.append(
                f"fields {_join(path, seen[name.lower()])!r} and {where!r} differ only in case, and Spark and Delta "
                "match column names without case"
            )
        seen[name.lower()] = name
        problems += shape_problems(inner, where)
    return problems


def declared_problems(shape: Shape, dtype: Any, path: str = "") -> list[str]:
    """How a shape does not fit a declared Spark type (``source.schema``)."""
    from pyspark.sql import types as T

    if shape == "VOID" or isinstance(dtype, T.StringType):
        return []  # NULL fits anything; a STRING column takes any JSON (as its text)
    if shape == "VARIANT":
        return shape_problems(shape, path)
    if isinstance(dtype, T.StructType):
        if not (isinstance(shape, tuple) and shape[0] == "object"):
            return [_wrong_kind(shape, "an object", path)]
        declared = {f.name: f.dataType for f in dtype.fields}
        problems = []
        for name, inner in shape[1]:
            if not path and name == "_meta":
                continue
            if name not in declared:
                problems.append(
                    f"field {_join(path, name)!r} is not in the binding's source.schema; declare it there (the table "
                    "gains the column) or remove it from the document"
                )
            else:
                problems += declared_problems(inner, declared[name], _join(path, name))
        return problems
    if isinstance(dtype, T.ArrayType):
        if not (isinstance(shape, tuple) and shape[0] == "array"):
            return [_wrong_kind(shape, "an array", path)]
        return declared_problems(shape[1], dtype.elementType, f"{path}[]")
    if isinstance(dtype, T.MapType):
        if not (isinstance(shape, tuple) and shape[0] == "object"):
            return [_wrong_kind(shape, "an object", path)]
        return [p for _name, inner in shape[1] for p in declared_problems(inner, dtype.valueType, f"{path}[]")]
    if isinstance(dtype, T.BooleanType):
        wanted, ok = "a boolean", shape == "BOOLEAN"
    elif isinstance(dtype, T.IntegralType):
        wanted, ok = "a whole number", shape in _NUMBERS[:4] or (isinstance(shape, tuple) and shape[0] == "decimal" and shape[2] == 0)
    elif isinstance(dtype, T.NumericType):
        wanted, ok = "a number", shape in _NUMBERS or (isinstance(shape, tuple) and shape[0] == "decimal")
    elif isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        wanted, ok = "a string or a number", shape in ("STRING",) + _NUMBERS[:4]
    elif isinstance(dtype, T.BinaryType):
        wanted, ok = "a string", shape == "STRING"
    else:
        return []
    return [] if ok else [_wrong_kind(shape, wanted, path)]


def _wrong_kind(shape: Shape, wanted: str, path: str) -> str:
    return (
        f"field {path!r} is {_kind(shape)} but source.schema declares {wanted}; fix the document, or change "
        "source.schema (and the table's column type)"
    )


def inferred_type(shape: Shape, top: bool = True) -> "DataType":
    """The Spark type of a merged shape, as ``spark.read.json`` inferred it."""
    from pyspark.sql import types as T

    if isinstance(shape, tuple):
        if shape[0] == "decimal":
            return T.DecimalType(shape[1], 0) if shape[2] == 0 else T.DoubleType()
        if shape[0] == "array":
            return T.ArrayType(inferred_type(shape[1], top=False), True)
        fields = []
        for name, inner in shape[1]:
            if top and (name == "_meta" or name in RESERVED):
                continue
            if top and inner == "VOID":
                # A NULL carries no type: a field NULL in every document of the epoch is left out,
                # so it lands as NULL (as a missing field does) whatever type the table gives it.
                continue
            fields.append(T.StructField(name, inferred_type(inner, top=False), True))  # type: ignore[arg-type]
        return T.StructType(fields)
    if shape == "VOID":
        # Deeper down a NULL-only sub-field stays in its struct (an object with a NULL field is not
        # a NULL object), typed VOID: a NULL carries no type, so it fits whatever the table holds
        # there (staging writes it as a string column of NULLs; the MERGE casts it to the table's).
        return T.NullType()
    return {
        "BIGINT": T.LongType(), "INT": T.LongType(), "SMALLINT": T.LongType(), "TINYINT": T.LongType(),
        "DOUBLE": T.DoubleType(), "FLOAT": T.DoubleType(), "BOOLEAN": T.BooleanType(), "STRING": T.StringType(),
        "DATE": T.StringType(), "TIMESTAMP": T.StringType(), "BINARY": T.StringType(),
    }.get(shape, T.StringType())


# --- the reader ------------------------------------------------------------------------------------


def change_controlled(reader: "DocumentReader", binding: Any) -> None:
    """Give the reader the binding's sequence paths and the names its table keeps for itself."""
    from materializer.changes import hidden_columns

    reader.sequence_by = list(binding.sequence_by)
    reader.hidden = hidden_columns(binding)
    reader.delete_when = binding.delete_when


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


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
        (:mod:`materializer.sources.document_check`: a compiled validator in Arrow batches)."""
        self.fast: int | None = None
        """Documents the ``arrow`` validator found fast, once its staging job has run."""
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
        """One file's lines with their numbers (1-based), in one partition: the error path and a
        part-read file of a previous version's checkpoint only."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        text = self._text([name])
        order = Window.orderBy(F.col(f"{SEQ}.block"), F.col(f"{SEQ}.row"))
        return text.select(F.col("value"), F.row_number().over(order).alias("line"))

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

    @staticmethod
    def _with_variant(text: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        value = F.col("value")
        blank = F.trim(value, F.lit(" \t\r\n\f\u000b")) == F.lit("")
        # A line that starts with "{" is not blank: the trim (half the cost of reading the lines
        # again) runs for the others only.
        return text.where(value.startswith("{") | ~blank).withColumn("__v", parse_one(value))

    # --- checking ---

    def variant_parts(self, lean: bool = False) -> "Column":
        """The top-level fields every check looks at (keys, reserved names, ``_meta``, and unless
        ``lean`` the declared fields, which only the full checks' ``_fits`` reads) as VARIANTs: NULL
        for a document that is not an object. Computed once per document
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
        return self._built("problem", lean, lambda: self._problem(lean))

    def _problem(self, lean: bool) -> "Column":
        from pyspark.sql import functions as F

        v = F.col("__v")
        value = F.col("value")
        parts = F.col("__parts")

        def kind(x: "Column") -> "Column":
            return F.schema_of_variant(x)

        rules: list[tuple[Column, Column | str]] = [
            (
                # Valid JSON to Spark's parser, which stops after the first value (json_text).
                v.isNull() & F.try_parse_json(value).isNotNull(),
                "more than one JSON value, or text after the document's value: a document must be one JSON object "
                "(JSON Lines: one per line); the rest would be lost",
            ),
            (
                v.isNull(),
                "not valid JSON, or beyond what Spark's JSON parser reads (a string over 20 MB or a document over "
                "16 MB, nesting deeper than 1000, a number of about 1000 digits); Spark cannot read it, so it cannot land",
            ),
            # Valid JSON that no struct cast takes: an array or a scalar.
            (parts.isNull(), "a document must be a JSON object"),
        ]
        for key in self.keys:
            got = parts[key]
            rules.append((got.isNull() | F.is_variant_null(got), f"key field {key!r} is missing or null"))
            if not (lean and self._key_kind_declared(key)):
                rules.append((F.left(kind(got), F.lit(1)).isin("O", "A"), f"key field {key!r} must be a scalar"))  # OBJECT<…>, ARRAY<…>
        for name in (OP, SEQ, *self.hidden):
            rules.append((parts[name].isNotNull(), f"field {name!r} is reserved by the materializer"))
        if self.sequence_by:
            from materializer.changes import sequence_rules

            rules += sequence_rules(v, self.sequence_by)
        meta = parts["_meta"]
        rules.append((meta.isNotNull() & F.is_variant_null(meta), "'_meta' is null; it must be an object such as {\"_meta\": {\"op\": \"d\"}} or be left out"))
        rules.append((meta.isNotNull() & ~kind(meta).startswith("OBJECT"), "'_meta' must be an object such as {\"op\": \"d\"}"))
        op = F.try_variant_get(meta, "$.op", "variant")
        rules.append((op.isNotNull() & ~F.is_variant_null(op) & (kind(op) != F.lit("STRING")), "'_meta.op' must be a string (\"d\" deletes the key)"))
        # A number longer than 38 digits parses to a double: rounded, so two distinct keys could
        # become one. Cheap test first (any long run of digits), then whether the parsed value kept it.
        long_run = f"[0-9]{{{EXACT_DIGITS + 1},}}"
        rules.append(
            (
                value.rlike(long_run) & (F.regexp_count(value, F.lit(long_run)) > F.regexp_count(F.to_json(v), F.lit(long_run))),
                f"a number has more than {EXACT_DIGITS} digits, more than Spark can hold exactly; write it as a string",
            )
        )
        if self.declared is not None and not lean:
            rules += self._fits(parts, self.declared, "")
        expr = F.lit(None).cast("string")
        for condition, message in reversed(rules):
            expr = F.when(condition, F.lit(message) if isinstance(message, str) else message).otherwise(expr)
        return expr

    def _fits(self, parts: "Column", dtype: "StructType", path: str) -> list[tuple["Column", "Column | str"]]:
        """Values the declared type's cast would refuse (a timestamp's format, an INT's range):
        checked per document here, so the staging cast cannot fail (arrays aside). ``parts``: the
        object's fields as VARIANTs (at the top, ``__parts``)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        rules = []
        for f in dtype.fields:
            got = parts[f.name]
            where = _join(path, f.name)
            if isinstance(f.dataType, T.StructType):
                inner = got.try_cast(T.StructType([T.StructField(g.name, T.VariantType()) for g in f.dataType.fields]))
                rules += self._fits(inner, f.dataType, where)
            elif not isinstance(f.dataType, (T.StringType, T.ArrayType, T.MapType, T.BooleanType)):
                message = F.concat(
                    F.lit(f"a value does not fit source.schema: field {where!r} holds "),
                    F.substring(F.to_json(got), 1, 200),
                    F.lit(f", which is not a valid {f.dataType.simpleString().upper()} (its format or range); fix the document, or change source.schema"),
                )
                rules.append((got.isNotNull() & ~F.is_variant_null(got) & got.try_cast(sqltypes.plain(f.dataType)).isNull(), message))
        return rules

    def checked(self, parsed: "DataFrame", lean: bool = False) -> "DataFrame":
        """``parsed`` with ``__problem``: per document, what is wrong with it alone (NULL: nothing).
        The schema-level checks (:meth:`_verdict`) need the whole epoch's shape on top."""
        return parsed.withColumn("__parts", self.variant_parts(lean)).withColumn("__problem", self.problem(lean))

    def _key_kind_declared(self, key: str) -> bool:
        """Whether the declared schema gives ``key`` a type that refuses an object or an array
        (any but STRING, which takes any JSON as its text)."""
        from pyspark.sql import types as T

        if self.declared is None or key not in self.declared.names:
            return False
        return not isinstance(self.declared[key].dataType, (T.StringType, T.StructType, T.ArrayType, T.MapType, T.VariantType))

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
        return self._verdict(checked, row)

    def _verdict(self, checked: "DataFrame", row: Any) -> tuple[int, "StructType"]:
        """Raise the error for what the tallies found (with ``dead_letter``, note the bad files
        instead); else the count and the epoch's schema."""
        self.bad = int(row["bad"])
        if row["bad"] and self.dead_letter:
            self.bad_files = sorted(row["files"])
        elif row["bad"]:
            raise self._located(checked, row["first"], int(row["bad"]), None)
        if row["n"] == 0 or self.bad == row["n"]:
            from pyspark.sql import types as T

            return int(row["n"]), self.declared or T.StructType([])
        shape = parse_shape(row["shape"])
        self.shape = shape
        problems = self.single_problems(shape)
        if problems:
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
        if self.validator == "arrow":
            from materializer.sources import document_check

            return document_check.deferred(self, parsed)
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
        problems = shape_problems(shape)
        if self.declared is not None:
            problems = declared_problems(shape, self.declared) + [p for p in problems if "different JSON kinds" not in p]
        return problems

    def _shape_error(self, checked: "DataFrame", problems: list[str]) -> SourceError:
        """Find the first document behind a schema-level problem: the distinct shapes of the epoch
        (error path only), taken in order of their first document, until one has a problem alone or
        conflicts with the shapes before it."""
        from pyspark.sql import functions as F

        shapes = (
            checked.groupBy(F.schema_of_variant(F.col("__v")).alias("shape"))
            .agg(F.min(F.col(SEQ)).alias("first"))
            .orderBy("first")
            .limit(10_000)
            .collect()
        )
        merged: Shape = None
        for item in shapes:
            shape = parse_shape(item["shape"])
            alone = self.single_problems(shape)
            before, merged = merged, (shape if merged is None else _merge(merged, shape))
            if alone or (self.declared is None and shape_problems(merged)):
                found = alone or [_conflict(before, shape, "") or shape_problems(merged)[0]]
                return self._located(checked, item["first"], None, item["shape"], found)
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
        lines = self._with_variant(self.numbered(name).where(F.col("line") > self.done.get(name, 0)))
        lines = self.checked(lines)
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
        if self.declared is not None:
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                found = misfit(doc, kinds_of(self.declared), "")
                if found is not None:
                    return found
        return (problems or ["a document is refused"])[0]

    # --- dead letters ---

    def rejected(self) -> "DataFrame":
        """The invalid documents with their file's URI, line number and problem (``dead_letter``).

        Numbered as the error path numbers them: the lines of their files only, in file order
        (blank lines counted), a part-read file's lines carrying their number already."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        assert self.lines is not None
        file = F.col(f"{SEQ}.file")
        order = Window.partitionBy(file).orderBy(F.col(f"{SEQ}.block"), F.col(f"{SEQ}.row"))
        lines = self.lines.where(file.isin(self.bad_files)).withColumn(
            "__line", F.when(file == F.lit(""), F.col(f"{SEQ}.row")).otherwise(F.row_number().over(order))
        )
        checked = self.checked(self._with_variant(lines))
        _good, bad = split(checked)
        names = F.create_map(*[x for f in self.bad_files for x in (F.lit(f), F.lit(f"{self.store.uri}/{self._name(f)}"))])
        return rejected_rows(bad, names[file], F.col("__line"))

    # --- the rows ---

    def rows(self, parsed: "DataFrame", schema: "StructType") -> "DataFrame":
        from pyspark.sql import functions as F

        doc = _with_void(F.col("__v").cast(sqltypes.plain(_cast_type(schema))), schema) if schema.fields else None
        op = F.when(F.try_variant_get(F.col("__v"), "$._meta.op", "string") == F.lit("d"), F.lit("d")).otherwise(F.lit("u"))
        columns = [] if doc is None else [_typed(doc[f.name], f.dataType) for f in schema.fields]
        if "__ok" in parsed.columns:
            # The arrow validator's fast documents, typed by the validator or from_json (document_check).
            from materializer.sources.document_check import OP_COLUMN, typed_fast

            columns = [typed_fast(c, f.name, self, parsed.columns) for c, f in zip(columns, schema.fields)]
            op = F.when(F.col("__ok"), F.col(OP_COLUMN)).otherwise(op)
        columns = [c.alias(f.name) for c, f in zip(columns, schema.fields)]
        if self.sequence_by:
            from materializer.changes import SEQUENCE, sequence_column

            columns.append(sequence_column(F.col("__v"), self.sequence_by, self.shape, self.store.uri).alias(SEQUENCE))
        return parsed.select(*columns, op.alias(OP), F.col(SEQ))

    def explain(self, exc: BaseException) -> SourceError | None:
        """A cast the per-document checks could not foresee (a value inside an array, say)."""
        text = str(exc)
        if self.validator == "arrow":
            from materializer.sources import document_check

            found = document_check.explain(self, text)
            if found is not None:
                return found
        if "INVALID_VARIANT_CAST" not in text and "CAST_INVALID_INPUT" not in text:
            return None
        if self.deferred_documents is not None:
            # Checks deferred to the staging job, which the cast failed: the check job (error
            # path only) names the file and line when a document's kind is what failed it.
            try:
                self.check(self.deferred_documents)
            except SourceError as located:
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


def _by_text(dtype: Any) -> bool:
    """Whether a top-level field of ``dtype`` is typed from its value's JSON text (:func:`_typed`)."""
    from pyspark.sql import types as T

    return isinstance(dtype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.DoubleType, T.BooleanType))


def _cast_type(schema: "StructType") -> "StructType":
    """What the document's VARIANT is cast to: ``schema`` (VOID as STRING, :func:`_void_as`), with
    the fields :func:`_typed` types from their text left VARIANT."""
    from pyspark.sql import types as T

    return T.StructType(
        [T.StructField(f.name, T.VariantType() if _by_text(f.dataType) else _void_as(f.dataType), f.nullable) for f in schema.fields]
    )


def _typed(field: "Column", dtype: Any) -> "Column":
    """A top-level field of the document cast to ``dtype``: the VARIANT cast's value, computed
    faster where it can be.

    Spark's VARIANT cast builds and evaluates a ``Cast`` expression per value (0.72-0.77 s of JVM
    CPU per 300k five-field documents, more than the parse). For a whole number, a DOUBLE or a
    BOOLEAN, the value's JSON text (``to_json``: the digits of a whole number, the exact decimal or
    the round-tripping double of any other number, ``true``/``false``) cast as a string is the same
    value for less (parse and cast alone: 2.13 -> 1.69 s per 300k; docs, Performance). Where that
    text does not cast (a string, a fraction for an integer, a value out of range, an infinite
    double, which ``to_json`` quotes) the VARIANT cast runs as before, failing or converting
    exactly as it would have: ``coalesce`` evaluates it only then.
    ``tests/test_documents.py::test_typed_from_text_equals_the_variant_cast`` compares both on
    edge values."""
    from pyspark.sql import functions as F

    if not _by_text(dtype):
        return field
    return F.coalesce(F.to_json(field).try_cast(sqltypes.plain(dtype)), field.cast(sqltypes.plain(dtype)))


def _void_as(dtype: Any) -> Any:
    """``dtype`` with VOID made STRING: a VARIANT cannot be cast to VOID (see :func:`_with_void`)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return T.StringType()
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, _void_as(f.dataType), f.nullable) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(_void_as(dtype.elementType), dtype.containsNull)
    return dtype


def _holds_void(dtype: Any) -> bool:
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return True
    if isinstance(dtype, T.StructType):
        return any(_holds_void(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return _holds_void(dtype.elementType)
    return False


def _with_void(column: "Column", dtype: Any) -> "Column":
    """``column`` (cast to ``_void_as(dtype)``) with its NULL-only sub-fields typed VOID again."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, T.NullType):
        return F.lit(None)
    if isinstance(dtype, T.StructType):
        for field in dtype.fields:
            if _holds_void(field.dataType):
                # withField keeps a NULL struct NULL and replaces only this sub-field.
                column = column.withField(field.name, _with_void(column[field.name], field.dataType))
        return column
    if isinstance(dtype, T.ArrayType) and _holds_void(dtype.elementType):
        return F.transform(column, lambda element: _with_void(element, dtype.elementType))
    return column


def _conflict(before: Shape, shape: Shape, path: str) -> str | None:
    """Where ``shape`` holds another kind of value than the epoch's earlier documents did."""
    if before is None or before == "VOID" or shape == "VOID" or before == "VARIANT":
        return None
    if isinstance(before, tuple) and isinstance(shape, tuple) and before[0] == shape[0] and before[0] in ("object", "array"):
        if before[0] == "array":
            return _conflict(before[1], shape[1], f"{path}[]")
        earlier = dict(before[1])
        for name, inner in shape[1]:
            found = _conflict(earlier.get(name), inner, _join(path, name))
            if found:
                return found
        return None
    if _merge(before, shape) != "VARIANT":
        return None
    return (
        f"field {path!r} is {_kind(shape)} here but {_kind(before)} in earlier documents of this transaction; a field "
        "must hold one kind of JSON value (a table column has one type): fix the document, or declare the field "
        "STRING in source.schema to keep any JSON as text"
    )


def _merge(a: Shape, b: Shape) -> Shape:
    """Two shapes as schema_of_variant_agg merges them (enough to find the first conflict)."""
    if a == b or b == "VOID":
        return a
    if a == "VOID":
        return b
    numeric = lambda s: s in _NUMBERS or (isinstance(s, tuple) and s[0] == "decimal")  # noqa: E731
    if numeric(a) and numeric(b):
        return "DOUBLE"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "array":
        return ("array", _merge(a[1], b[1]))
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "object":
        fields = dict(a[1])
        for name, inner in b[1]:
            fields[name] = _merge(fields[name], inner) if name in fields else inner
        return ("object", sorted(fields.items()))
    return "VARIANT"


# --- a declared schema -----------------------------------------------------------------------------

Kinds = Any
"""Per Spark type, what a JSON value must be: None (anything: a STRING column takes any JSON), a
tuple of Python types, or ("struct", {field: kinds}) / ("array", kinds) / ("map", kinds). Used on
the error path only, to word what is wrong with one refused line."""

ANY = None
_NUMBER = (int, float)  # bool is not among them: type(True) is bool, and exact types are compared


def parse_schema(spark: "SparkSession", ddl: str, binding: Any) -> "StructType":
    try:
        schema = spark.createDataFrame([], ddl).schema
    except Exception as exc:  # noqa: BLE001 - Spark's parse error, shortened
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"binding {binding.name!r}: source.schema {ddl!r} is not Spark DDL ({first}). Write it as "
            "'id BIGINT, name STRING, tags ARRAY<STRING>, address STRUCT<city: STRING>'."
        ) from None
    names = [f.name for f in schema.fields]
    for key in binding.key:
        if key not in names:
            raise ConfigError(f"binding {binding.name!r}: key field {key!r} is not in source.schema; declare it")
    for name in names:
        if name in RESERVED or name == "_meta":
            raise ConfigError(f"binding {binding.name!r}: source.schema declares {name!r}, which the materializer reserves")
    for problem in shape_problems(_shape_of(schema)):
        raise ConfigError(f"binding {binding.name!r}: source.schema: {problem}")
    return schema


def _shape_of(dtype: Any) -> Shape:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return ("object", [(f.name, _shape_of(f.dataType)) for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return ("array", _shape_of(dtype.elementType))
    return "STRING"


def kinds_of(dtype: Any) -> Kinds:
    from pyspark.sql import types as T

    if isinstance(dtype, T.StructType):
        return ("struct", {f.name: kinds_of(f.dataType) for f in dtype.fields})
    if isinstance(dtype, T.ArrayType):
        return ("array", kinds_of(dtype.elementType))
    if isinstance(dtype, T.MapType):
        return ("map", kinds_of(dtype.valueType))
    if isinstance(dtype, T.BooleanType):
        return (bool,)
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return (int,)
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return _NUMBER
    if isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        return (str, int)
    if isinstance(dtype, T.BinaryType):
        return (str,)
    return ANY


_JSON_KIND = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def misfit(value: Any, kinds: Kinds, path: str) -> str | None:
    """Why ``value`` does not fit ``kinds`` (None: it fits). ``path`` names the field."""
    if kinds is ANY or value is None:
        return None
    if type(kinds) is tuple and type(kinds[0]) is str:  # noqa: E721 - a nested kind
        shape, inner = kinds
        if shape == "struct":
            if type(value) is not dict:  # noqa: E721
                return _wrong(value, "an object", path)
            for name, item in value.items():
                if name == "_meta" and not path:
                    continue
                if name not in inner:
                    where = f"{path}.{name}" if path else name
                    return (
                        f"field {where!r} is not in the binding's source.schema; declare it there (the table "
                        "gains the column) or remove it from the document"
                    )
                problem = misfit(item, inner[name], f"{path}.{name}" if path else name)
                if problem is not None:
                    return problem
            return None
        if type(value) is not (list if shape == "array" else dict):
            return _wrong(value, "an array" if shape == "array" else "an object", path)
        items = value if shape == "array" else value.values()
        for item in items:
            problem = misfit(item, inner, f"{path}[]")
            if problem is not None:
                return problem
        return None
    if type(value) not in kinds:
        wanted = " or ".join(sorted({_JSON_KIND.get(t, t.__name__) for t in kinds}))
        return _wrong(value, wanted, path)
    return None


def _wrong(value: Any, wanted: str, path: str) -> str:
    found = _JSON_KIND.get(type(value), type(value).__name__)
    return (
        f"field {path!r} is {found} but source.schema declares {wanted}; fix the document, or change "
        "source.schema (and the table's column type)"
    )
