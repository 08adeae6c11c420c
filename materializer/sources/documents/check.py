"""Documents checked in Arrow batches on the executors by a compiled validator (issue #25).

With a declared schema (``source.schema``) the documents reader can decide per document, in
Python on the executors (``mapInArrow``, which Spark Connect and serverless run too), whether the
document is one the VARIANT route (:mod:`materializer.sources.documents.source`) would take as it is,
and whose declared fields Spark's own ``from_json`` types to the same values. Such a document is
*fast*: it skips the VARIANT parse, cast and per-document checks. Every other document, bad or
merely unusual, goes the VARIANT route in the same job, so its checks, its error texts and its
values are the VARIANT route's own. Fast is therefore a promise that must never be made wrongly,
and may be withheld freely: when in doubt, a document is not fast.

A document is fast when msgspec (a compiled decoder) reads it into ``Struct`` types built from
the declared schema: ``forbid_unknown_fields``, strict kinds (no int for a boolean, no float for
an integer), integer ranges by ``msgspec.Meta``, key fields present and not null, ``_meta`` an
object whose ``op`` is a string or null, nothing after the value. msgspec does not check what
the VARIANT route also refuses, so the decoder's result is checked further:

* **two equal keys**: msgspec keeps the last. Every key of a JSON text ends with a ``:`` outside
  a string; the decoded document encoded again by msgspec holds one ``:`` per key kept and the
  ``:`` inside strings. When the text's ``:`` count is more than that, a key was dropped (or a
  ``_meta`` field msgspec skipped): not fast. An escaped colon (``\\u003a``) would upset the
  count: not fast.
* **a number past 38 digits**: the VARIANT route refuses it (a double would round it); msgspec
  reads it as a float: a run of 39 digits anywhere makes the document not fast.
* **values Spark and msgspec could read differently**: only integers, doubles, booleans and
  strings (a STRING field taking a JSON string; another kind is kept as its text by the VARIANT
  route), structs and arrays of them pass, and timestamps, dates and decimals at any depth in the
  one form each that Spark's cast, ``from_json`` and this module read alike: an RFC 3339 text
  with its zone within Spark's range (:data:`document_values.TIMESTAMP_TEXT`), an ISO date, a
  plain number whose digits fit the decimal without rounding
  (:data:`document_values.PLAIN_NUMBER`). A field of any other declared type (floats, maps,
  binary, TIMESTAMP_NTZ), and a timestamp, date or decimal in another form, makes a document fast
  only when it is null or absent. A ``-0`` fraction (the VARIANT route drops the sign) is not
  fast either.

Names Delta refuses and names that differ only in case are never fast: the declared schema has
none (``parse_schema`` refuses them), and ``forbid_unknown_fields`` compares names exactly.

A fast document's top-level whole numbers, DOUBLEs, BOOLEANs and STRINGs are typed here, from
the values msgspec decoded (:func:`python_typed`): they are exact (a whole number within its
range, a double correctly rounded as Java's parser rounds it, a negative zero never fast), and
typing them costs less in Python than ``from_json``'s parse in the JVM (docs, Performance). So
are its top-level timestamps, dates and decimals, by Arrow's parsers for a whole batch
(:func:`document_values.arrow_converted`) or Python's for one document (:data:`document_values.CONVERTERS`); a test holds the two
to each other and both to the VARIANT route. Its other declared fields, nested or of a type
Spark's verdict must decide (floats), are typed by ``from_json`` with ``mode FAILFAST``: where it still cannot read a
value the staging job fails and the VARIANT route's checks (error path only) name the document;
a value it cannot read never becomes a NULL. Without such fields a fast document's text does not
go back to Spark at all. ``tests/test_documents_arrow.py`` holds both to the VARIANT route.

This module is what runs on the executors (:func:`check_batches`, which ``mapInArrow`` runs);
the plan the driver builds around it is :mod:`materializer.sources.documents.route`. It imports
msgspec only on the executors, inside :func:`check_batches`: an executor without it stops the run
with :data:`MISSING`, one paragraph, instead of a worker traceback.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from materializer.sources.documents.values import CONVERSION_ERRORS, arrow_converted, collector, converted, decimal_type, required, unset_as_none

OK = "__ok"
"""The column ``mapInArrow`` adds: whether the document is fast."""

MISSING = (
    "materializer: msgspec is not installed on this Spark executor's Python. With source.schema the "
    "documents source checks each document on the executors with msgspec, a dependency of the "
    "delta-materializer wheel: install the wheel (or `pip install msgspec`, and pyarrow) on every node "
    "of the cluster, as Databricks jobs and serverless do with the wheel's dependencies, or set the "
    "Spark conf spark.materializer.documents.validator to variant to check in Spark expressions "
    "instead. Nothing from this transaction was applied."
)
"""The error an executor without msgspec stops the job with; the driver reports this paragraph."""

_RANGES = {"long": 63, "integer": 31, "short": 15, "byte": 7}

_cache: dict[str, Any] = {}


def _compiled(key: tuple[Any, ...]) -> Any:
    """:func:`_compile` of ``key``, once per process. Reached through this module-level function:
    a closure that read ``_cache`` itself would be pickled with it, and a cache filled in the
    driver (a test, a tool) holds decoders that cannot be pickled."""
    found = _cache.get(repr(key))
    if found is None:
        found = _cache[repr(key)] = _compile(*key)
    return found


def _compile(
    schema_json: str, keys: tuple[str, ...], hidden: tuple[str, ...]
) -> tuple[Callable[[bytes, int], "tuple[Any, ...] | None"], str, Callable[[list[Any]], list[Any]]]:
    """The per-document test for a declared schema (built once per executor process): the decoded
    top-level values of a fast document (None: not fast); the pattern of texts that are never
    fast (checked per batch, vectorized); and the columns of a batch's fast documents
    (:func:`typed_columns`: the op, then each field :func:`python_typed` names)."""
    import msgspec
    from msgspec import UNSET, Meta, Raw, UnsetType
    from typing import Annotated

    import json

    counter = [0]
    scalar_keys = [True]
    top_index: dict[str, int] = {}
    converters: dict[int, Callable[[Any], Any]] = {}  # top-level index: its value typed (CONVERTERS)

    def leaf(dtype: Any, top: bool = False) -> tuple[Any, Any]:
        """(msgspec type, walker spec) of a declared type; the type accepts null. Timestamps and
        dates are strings (of :data:`document_values.TIMESTAMP_TEXT` or
        :data:`document_values.DATE_TEXT` once checked) and decimals any JSON value, kept raw
        (plain numbers only once checked): at the top level :data:`converters` type them, deeper
        :func:`document_values.collector` gathers them to be checked (``from_json`` types them)."""
        if converted(dtype) is not None:
            if dtype in ("timestamp", "date"):
                # Their texts' form is checked after (per batch in Arrow, or by _timestamp and
                # _date): a pattern here cost msgspec half a microsecond per value.
                return str | None, ("str" if top else ("value", dtype))
            # (msgspec's Raw in a union takes null only: a JSON null is b"null")
            return Raw, (None if top else ("value", dtype))
        if isinstance(dtype, dict):
            kind = dtype["type"]
            if kind == "struct":
                return struct(dtype["fields"], top=False)
            if kind == "array":
                inner, spec = leaf(dtype["elementType"])
                return list[inner] | None, ("list", spec)  # type: ignore[valid-type]
            return type(None), None
        if dtype in _RANGES:
            bits = _RANGES[dtype]
            return Annotated[int, Meta(ge=-(1 << bits), le=(1 << bits) - 1)] | None, None
        if dtype == "double":
            return float | None, None
        if dtype == "boolean":
            return bool | None, None
        if dtype == "string":
            return str | None, "str"
        return type(None), None  # decimals, floats, dates, timestamps, binary, void: null only

    def struct(fields: list[dict[str, Any]], top: bool) -> tuple[Any, Any]:
        members: list[Any] = []
        rename: dict[str, str] = {}
        walk: list[tuple[int, Any]] = []
        for field in fields:
            name = field["name"]
            if top and name in hidden:
                continue
            if top:
                top_index[name] = len(members)
                if (conversion := converted(field["type"])) is not None:
                    converters[len(members)] = conversion if name not in keys else (lambda v, c=conversion: required(c(v)))
            kind, spec = leaf(field["type"], top)
            attr = f"f{len(members)}"
            rename[attr] = name
            if top and name in keys:
                # Required and not null; a key must be a scalar, so a struct, an array or a type
                # typed here only when null makes no document fast.
                scalar_keys[0] = scalar_keys[0] and spec in (None, "str") and kind is not type(None) and not isinstance(field["type"], dict)
                members.append((attr, kind if kind is type(None) or kind is Raw else kind.__args__[0]))
            else:
                members.append((attr, kind | UnsetType, UNSET))
            if spec is not None:
                walk.append((len(members) - 1, spec))
        if top:
            meta = msgspec.defstruct("Meta", [("op", str | None | UnsetType, UNSET)], forbid_unknown_fields=False, gc=False)
            rename[f"f{len(members)}"] = "_meta"
            members.append((f"f{len(members)}", meta | UnsetType, UNSET))
            walk.append((len(members) - 1, ("meta",)))
        counter[0] += 1
        # gc=False: a decoded document holds JSON values only, never a cycle, and structs the
        # cyclic collector does not track cost it nothing to walk: the bench's documents decoded
        # in 0.17 µs each against 0.40 (a batch of 10,000 set off a collection of the young
        # generation every 700 documents, each walking the batch decoded so far).
        cls = msgspec.defstruct(f"Doc{counter[0]}", members, forbid_unknown_fields=True, rename=rename, gc=False)
        colons = sum(name.count(":") for name in rename.values())
        return (cls | None if not top else cls), ("struct", tuple(walk), colons)

    schema = json.loads(schema_json)
    top, spec = struct(schema["fields"], top=True)
    decode = msgspec.json.Decoder(top).decode
    # A decoded document encoded again holds one ":" per key kept and the ":" inside its strings
    # (keys' names included), at any depth: msgspec writes a string's ":" as it is, and leaves out
    # what the decoder dropped (a key's earlier twin, an unknown _meta field).
    encode = msgspec.json.Encoder().encode
    doubles = "double" in schema_json
    # RecursionError: msgspec's own limit, on a value nested past Python's recursion limit where a
    # DECIMAL is declared (taken Raw, at any depth): not fast, so the VARIANT route refuses it
    # (json_text.MAX_DEPTH) instead of the executor's Python failing the job.
    errors = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)

    astuple = msgspec.structs.astuple
    # Without nested values or names holding ":", the keys kept are the top level's fields that
    # are set: when the text has as many ":" there is no string holding one and no dropped key.
    flat = all(inner in ("str", ("meta",)) for _index, inner in spec[1]) and not spec[2]
    # Top-level DOUBLEs holding a negative zero (``-1e-400`` decodes to -0.0, which no pattern
    # sees): not fast, as every negative zero.
    top_doubles = [top_index[f["name"]] for f in schema["fields"] if f["type"] == "double" and f["name"] in top_index]
    from math import copysign

    # Timestamps, dates and decimals inside structs and arrays: collected from the decoded
    # documents and checked, a batch at once in Arrow or a document alone in Python, as the top
    # level's are (from_json types them; a value it could read otherwise is never fast).
    collect = collector(spec, astuple, UNSET)
    deep_conversions: dict[str, Any] = {}

    def deep_values(docs: list[Any]) -> dict[str, list[Any]]:
        found: dict[str, list[Any]] = {}
        for doc in docs:
            collect(doc, found)
        return found

    def deep_fast(doc: Any) -> bool:
        try:
            for kind, values in deep_values([doc]).items():
                conversion = deep_conversions.get(kind) or deep_conversions.setdefault(kind, converted(kind))
                for value in values:
                    conversion(value)
        except CONVERSION_ERRORS:
            return False
        return True

    def fast(text: bytes, colons: int) -> "tuple[Any, ...] | None":
        """``text``'s top-level values when it is fast, given its ``:`` count and that it holds
        nothing :data:`SUSPECT` matches; else None."""
        try:
            doc = decode(text)
        except errors:
            return None
        values = astuple(doc)
        for index in top_doubles:
            value = values[index]
            if value == 0.0 and value is not UNSET and value is not None and copysign(1.0, value) < 0:
                return None
        if not (flat and colons == len(values) - values.count(UNSET)) and colons != encode(doc).count(b":"):
            return None
        if collect is not None and not deep_fast(doc):
            return None
        if converters:
            try:
                return convert(values)
            except CONVERSION_ERRORS:
                return None
        return values

    def convert(values: tuple[Any, ...]) -> tuple[Any, ...]:
        """``values`` with the top-level timestamps, dates and decimals typed (raises
        :data:`CONVERSION_ERRORS` for a value that is not fast)."""
        out = list(values)
        for index, conversion in converters.items():
            value = out[index]
            if value is not None and value is not UNSET:
                out[index] = conversion(value)
        return tuple(out)

    meta = len(top.__struct_fields__) - 1

    def columns(docs: list[Any], names: list[str]) -> list[Any]:
        """The op (``d`` or ``u``) and the fields ``names`` (of :func:`python_typed`) of each fast
        document (its ``astuple``; None for the others, whose columns are NULL), as Python lists."""
        ops = [None if d is None else ("d" if (m := d[meta]) is not UNSET and m.op == "d" else "u") for d in docs]
        out = [ops]
        for index in [top_index[name] for name in names]:
            out.append([None if d is None or (v := d[index]) is UNSET else v for d in docs])
        return out

    strings = [index for index, inner in spec[1] if inner == "str" and index not in converters]

    suspect = SUSPECT_WITH_DOUBLES if doubles else SUSPECT
    # Over a batch's texts joined by "\n": a suspect text, or a line that is not one object alone
    # ("{" first and "}" last, JSON's whitespace aside; a text holding "\n" is two lines).
    whole_pattern = "(?m)" + suspect + r"|^[ \t\r]*[^{ \t\r]|[^} \t\r][ \t\r]*$"
    decode_lines = msgspec.json.Decoder(top).decode_lines

    def whole(text: Any) -> "tuple[list[Any], int, list[int] | None, list[int]] | None":
        """Every document of a batch (``text``, an Arrow string array) decoded, as columns (one
        sequence per top-level field, ``_meta`` last; UNSET where absent; timestamps, dates and
        decimals as decoded, untyped), the ":" they account for, the indexes of the STRING
        columns whose ":" the caller adds (counted by Arrow, as it adds the timestamps' and
        dates'; None: every ":" is counted already) and each column's count of UNSET; None when
        a text is suspect or a document is not fast alone (the caller then decides per document).

        The texts are decoded in one call, joined by line breaks (``decode_lines``), and each one's
        values are its own: every line is one object (``{`` first and ``}`` last, but for JSON's
        whitespace), so no value can span two lines (inside a value a ``}`` is followed by ``,``,
        ``}`` or ``]``, never by a line's ``{``), each line holds at least one value, and as many
        values as texts means one per text, each decoded as its text alone would be."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(text)
        try:
            if text.type != pa.string():
                text = text.cast(pa.string())
            joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), text), "\n")
        except pa.ArrowException:  # (a batch past 2 GiB of text)
            return None
        if joined.null_count or pc.any(pc.match_substring_regex(joined, whole_pattern)).as_py():
            return None  # a NULL text, a suspect one, or a line that is not one object
        try:
            docs = decode_lines(joined[0].as_buffer())
        except errors:
            return None
        if len(docs) != n:
            return None
        cols: list[Any] = list(zip(*map(astuple, docs)))
        unset = [col.count(UNSET) for col in cols]
        for index in top_doubles:
            col = cols[index]
            if 0.0 in col and any(v == 0.0 and copysign(1.0, v) < 0 for v in col if v is not UNSET and v is not None):
                return None
        if not flat:
            if collect is not None:
                found = deep_values(docs)
                if arrow_converted(list(found.values()), [(i, kind, False) for i, kind in enumerate(found)], pa, pc) is None:
                    return None
            # Nested values or names holding ":": the documents encoded again, at C speed.
            return cols, encode(docs).count(b":"), None, unset
        # Top-level fields only: the keys kept are the fields set, the "_meta" key included.
        kept = n * len(cols) - sum(unset)
        if unset[meta] < n:
            for m in filter(None, cols[meta]):  # a decoded _meta (UNSET is false)
                if m.op is not UNSET:
                    kept += 1 + (m.op.count(":") if m.op else 0)
        # (The timestamps', dates' and decimals' columns are typed, and the ":" in the first two
        # counted, by the caller: document_values.arrow_converted, in Arrow.)
        return cols, kept, strings, unset

    if not scalar_keys[0] or any(k not in [f["name"] for f in schema["fields"]] for k in keys):
        return (lambda text, colons: None), SUSPECT, columns, None
    return fast, suspect, columns, whole


PYTHON_TYPES = {"long": "int64", "integer": "int32", "short": "int16", "byte": "int8", "double": "float64", "boolean": "bool_", "string": "string"}
"""The declared types whose values a fast document's decoded value gives exactly (Arrow's type
for each): whole numbers within their range, a DOUBLE correctly rounded (msgspec, as Java's
parser; negative zeros and values out of range are never fast), booleans, and JSON strings (a
STRING field holding another kind is never fast)."""


def python_typed(schema: dict[str, Any], hidden: "tuple[str, ...] | list[str]") -> list[tuple[str, str]]:
    """The top-level fields of ``schema`` (Spark's JSON form) that the validator types itself
    (name, Spark type name), in the schema's order: those of :data:`PYTHON_TYPES`, timestamps,
    dates and decimals (:data:`document_values.CONVERTERS`). A fast document's other fields are nested (typed by
    ``from_json``) or of a type whose value makes no document fast but a null."""
    return [
        (f["name"], f["type"]) for f in schema["fields"]
        if isinstance(f["type"], str) and (f["type"] in PYTHON_TYPES or converted(f["type"]) is not None) and f["name"] not in hidden
    ]


def arrow_type(kind: str, pa: Any) -> Any:
    """The Arrow type of a :func:`python_typed` field's values as the validator sends them back:
    a timestamp as microseconds since the epoch (INT64), a date as days (INT32), Spark turns them
    into its types (``timestamp_micros``, ``date_from_unix_date``)."""
    if kind in PYTHON_TYPES:
        return getattr(pa, PYTHON_TYPES[kind])()
    if kind == "timestamp":
        return pa.int64()
    if kind == "date":
        return pa.int32()
    precision, scale = decimal_type(kind)
    return pa.decimal128(precision, scale)


SUSPECT = r"\\u003[aA]"
"""What makes a text not fast whatever it decodes to (RE2, matched per batch by Arrow): an escaped
colon, which the ``:`` count would miss."""
SUSPECT_WITH_DOUBLES = SUSPECT + r"|[0-9]{39}|-0(\.0*)?([eE][-+]?[0-9]+)?([,}\] \t\r\n]|$)|[eE]\+?0*[1-9][0-9]{2}"
"""With a DOUBLE declared: also a run of 39 digits (refused by the VARIANT route, rounded by a
double), a negative zero (whose sign the VARIANT route drops) and an exponent of 100 or more (a
number beyond a double decodes to Infinity; the VARIANT route refuses it)."""


def check_batches(
    schema_json: str, keys: list[str], hidden: list[str], *, typed: "list[str] | None" = None, keep_text: bool = True,
    whole_batches: bool = True,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function: each batch (``value`` first) with :data:`OK` added; with
    ``typed`` (names of :func:`python_typed` fields), also the fast documents' op
    (:data:`OP_COLUMN`) and those fields (``__p<i>`` for the ``i``-th, NULL for the others). Unless ``keep_text``, a fast document's text is
    dropped (NULL) on the way back: nothing after this function reads it.

    A batch is first tried whole (``whole_batches``): its texts joined by line breaks, matched
    once against the suspect pattern and decoded in one call (each line proven one object of its
    own text), the columns taken from the decoded values at C speed, and the ":" counted over the
    batch (with nested values, over the documents encoded again); when every document is fast
    (the usual batch) that is the answer, else each document is judged alone. Both give the same batch (a test holds them to
    it). The cyclic garbage collector is off while a batch is judged."""
    key = (schema_json, tuple(keys), tuple(hidden))

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import gc
        import json

        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            import msgspec  # noqa: F401
        except ImportError:
            raise RuntimeError(MISSING) from None
        fast, suspect, columns, whole = _compiled(key)
        kinds = dict(python_typed(json.loads(schema_json), hidden))
        types = [arrow_type(kinds[name], pa) for name in typed or []]
        positions = {name: index for index, name in enumerate(_top_names(schema_json, hidden))}
        conversions = [(positions[name], kind, name in keys) for name, kind in kinds.items() if converted(kind) is not None]

        def judged(batch: Any) -> Any:
            text = batch.column(0)
            if text.type not in (pa.string(), pa.large_string()):
                text = text.cast(pa.string())
            if whole_batches and whole is not None and typed is not None and len(text):
                found = whole(text)
                if found is not None:
                    cols, kept, strings, unset = found
                    arrays = {i: pa.array(unset_as_none(cols[i], unset[i]), pa.string()) for i in strings or ()}
                    kept += sum(pc.sum(pc.count_substring(arrays[i], ":")).as_py() or 0 for i in strings or ())
                    typed_here = arrow_converted(cols, conversions, pa, pc) if conversions else ({}, 0)
                    if typed_here is not None and kept + (typed_here[1] if strings is not None else 0) == _colons(text, pa):
                        arrays.update(typed_here[0])
                        # Every document is fast: a text holds at least the ":" its decoded value
                        # accounts for, so equal sums mean equal counts, document by document.
                        return _whole_batch(batch, cols, unset, arrays, typed, types, positions, keep_text, pa, pc)
            # Judged document by document: whether each text is suspect and its ":" count, in
            # Arrow's C++. A NULL line (none from spark.read.text) is not fast: its suspect is
            # filled true.
            suspected = pc.fill_null(pc.match_substring_regex(text, suspect), True)
            colons = pc.count_substring(text, ":").to_pylist()
            suspects = suspected.to_pylist()
            width = "q" if text.type == pa.large_string() else "i"
            offsets = memoryview(text.buffers()[1]).cast(width)[text.offset: text.offset + len(text) + 1].tolist()
            data = text.buffers()[2]
            data = data.to_pybytes() if data is not None else b""
            docs = [None if s else fast(data[a:b], c) for a, b, c, s in zip(offsets, offsets[1:], colons, suspects)]
            ok = pa.array([d is not None for d in docs], pa.bool_())
            out = [*batch.columns, ok]
            names = [*batch.schema.names, OK]
            if typed is not None:
                values = columns(docs, typed)
                out.append(pa.array(values[0], pa.string()))
                names.append(OP_COLUMN)
                for index, (column, sent_as) in enumerate(zip(values[1:], types)):
                    out.append(pa.array(column, sent_as))
                    names.append(f"{TYPED_PREFIX}{index}")
            if not keep_text:
                out[0] = pc.if_else(ok, pa.nulls(len(ok), batch.column(0).type), batch.column(0))
            return pa.RecordBatch.from_arrays(out, names=names)

        for batch in batches:
            # Decoded documents hold no cycle, but nested ones hold lists, which the cyclic
            # collector tracks: with it on, a batch of 10,000 set it off every 700 lists, each
            # time walking the batch decoded so far (decoding nested documents cost 1.5 µs each
            # against 0.37 with it off). What a batch allocates is freed when it is judged.
            collecting = gc.isenabled()
            gc.disable()
            try:
                out = judged(batch)
            finally:
                if collecting:
                    gc.enable()
            yield out

    return run


def _colons(text: Any, pa: Any) -> int:
    """The ":" in all the texts of a string array (none NULL) together: one count over the bytes
    they span in its data buffer, a third of the cost of counting text by text."""
    if not len(text):
        return 0
    width = "q" if text.type == pa.large_string() else "i"
    offsets = memoryview(text.buffers()[1]).cast(width)
    start, end = offsets[text.offset], offsets[text.offset + len(text)]
    return text.buffers()[2].slice(start, end - start).to_pybytes().count(b":")


def _top_names(schema_json: str, hidden: "tuple[str, ...] | list[str]") -> list[str]:
    """The top-level names of the validator's ``Struct`` in its order (hidden names left out)."""
    import json

    return [f["name"] for f in json.loads(schema_json)["fields"] if f["name"] not in hidden]


def _whole_batch(
    batch: Any, cols: list[Any], unset: list[int], arrays: dict[int, Any], typed: list[str], types: list[Any], positions: dict[str, int], keep_text: bool, pa: Any, pc: Any
) -> Any:
    """The output of :func:`check_batches` for a batch whose documents are all fast (``unset``:
    each column's count of UNSET)."""
    from itertools import compress

    n = batch.num_rows
    metas = cols[-1]
    deleted = bytearray(n)
    if unset[-1] < n:
        # The documents with a _meta (UNSET is false, a decoded _meta true), found at C speed.
        for index in compress(range(n), metas):
            if metas[index].op == "d":
                deleted[index] = 1
    flags = pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(deleted)])
    ops = pc.if_else(pc.not_equal(flags, 0), pa.scalar("d", pa.string()), pa.scalar("u", pa.string()))
    out = [*batch.columns, pc.is_valid(batch.column(0)), ops]
    names = [*batch.schema.names, OK, OP_COLUMN]
    for index, (name, sent_as) in enumerate(zip(typed, types)):
        position = positions[name]
        if position in arrays and arrays[position].type == sent_as:
            out.append(arrays[position])
        else:
            out.append(pa.array(unset_as_none(cols[position], unset[position]), sent_as))
        names.append(f"{TYPED_PREFIX}{index}")
    if not keep_text:
        out[0] = pa.nulls(n, batch.column(0).type)
    return pa.RecordBatch.from_arrays(out, names=names)


OP_COLUMN = "__op"
"""With ``typed``: the fast documents' op, ``d`` or ``u`` (``_meta.op`` is ``d`` or not)."""
TYPED_PREFIX = "__p"
"""With ``typed``: ``__p<i>`` holds the ``i``-th :func:`python_typed` field's values."""
