"""Parsing a line or record of JSON text to a VARIANT: one value, or nothing.

Spark's ``parse_json`` (like its JSON reader and ``from_json``) reads the first JSON value of the
text and ignores what follows it: ``{"id": 1}{"id": 2}`` on one line parses as ``{"id": 1}``, and
the second document would be lost without a word; ``{"id": 1} x`` would pass as valid. A document
with anything but whitespace after its value is not valid JSON here.

Checking that costs a second parse, so it runs only where trailing text is possible at all: a flat
object (no nested ``{``/``[``, one ``}`` at the end) has nothing after its value, and most lines of
a change stream are flat. The others are parsed again as ``[<text>, "<end marker>"]``: the text is
one value exactly when the array's second element is the marker (the parser ignores what follows a
value, so a wrapper alone would not do: ``{"id": 1}] x`` closes ``[`` early). A line that holds the
marker itself is refused rather than trusted.

A text nested deeper than :data:`MAX_DEPTH` is not parsed at all (NULL, as for invalid JSON):
Spark's own walks of a VARIANT (``schema_of_variant_agg``, casts, ``to_json``) recurse once per
level, and a document 990 levels deep overflowed an executor thread's stack and took the JVM
down. The depth is found without parsing and without recursion (:func:`depth_column`, and
:func:`nesting_depth` in Python): brackets outside strings, counted.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

MAX_DEPTH = 32
"""The deepest a JSON text may nest (objects and arrays; a flat object is 1 level): deeper ones are
refused (dead letters with ``on_invalid: dead_letter``) before Spark parses them. Spark parses up
to 1000 levels (Jackson's ``maxNestingDepth``) but does not survive them: on the development
machine 990 levels of arrays killed the JVM in ``schema_of_variant_agg`` on an executor, and a
document of objects 125 levels deep failed Delta's MERGE of its inferred table with a
StackOverflowError in the driver (119 passed). The table must open in every reader too: delta-rs
decodes the table's schema with serde_json, whose limit of 128 levels a schema of objects reaches
at 43 levels (each struct is three levels of the schema's JSON), and a table 64 levels deep did
not open. 32 keeps a margin below both, and is deeper than any schema written by hand
(tests/test_deep_documents.py lands a document of exactly 32 levels, inferred and declared,
through MERGE, and reads it with delta-rs)."""

_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[{]|[\]}]', re.DOTALL)
"""A JSON string (an unterminated one runs to the end), or a bracket."""

FLAT_OBJECT = r"^[ \t\r\n]*\{[^{}\[\]]*\}[ \t\r\n]*$"
r"""A line that is one object with no nested object or array (and no brace or bracket in its
strings): its only ``}`` is its last character, so no text can follow its value. Around it JSON's
whitespace only (space, tab, CR, LF: a regex's ``\s`` would let a form feed or vertical tab
after the value pass)."""

END_MARKER = "__materializer_end_of_value_5c19d2e7__"


def nesting_depth(text: str) -> int:
    """How deep ``text`` nests: the most objects and arrays open at once, brackets inside strings
    (escaped quotes too) not counted; 0 for a scalar. No recursion and no parse, so any text is
    measured, valid JSON or not (for valid JSON, exactly what a parser would reach).
    :func:`depth_column` is the same count in Spark."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif token == "]" or token == "}":
            depth -= 1
    return deepest


def too_deep(text: str) -> bool:
    """Whether ``text`` nests deeper than :data:`MAX_DEPTH` (a cheap count first, as in Spark)."""
    return text.count("[") + text.count("{") > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH


def depth_column(text: "Column") -> "Column":
    """:func:`nesting_depth` as a Spark column, in Spark's own functions (no Python worker, no
    recursion): escapes dropped, then strings, then all but brackets, and the brackets left summed
    in one ``aggregate``. Meant for the few texts :func:`deep_column` lets through its cheap count."""
    from pyspark.sql import functions as F

    bare = F.regexp_replace(F.regexp_replace(text, r"(?s)\\.", ""), r'"[^"]*+"?', "")  # escapes, then strings (one unterminated runs to the end)
    brackets = F.regexp_replace(bare, r"[^\[\]{}]+", "")
    start = F.struct(F.lit(0).alias("d"), F.lit(0).alias("m"))

    def step(acc: "Column", c: "Column") -> "Column":
        opens = c.isin("[", "{")
        d = F.when(opens, acc["d"] + 1).otherwise(acc["d"] - 1)
        return F.struct(d.alias("d"), F.when(opens, F.greatest(acc["m"], d)).otherwise(acc["m"]).alias("m"))

    return F.aggregate(F.split(brackets, ""), start, step, lambda acc: acc["m"])


def deep_column(text: "Column") -> "Column":
    """Whether ``text`` nests deeper than :data:`MAX_DEPTH`: false at once for a text of no more
    opening brackets than that (nearly every document), else :func:`depth_column` decides."""
    from pyspark.sql import functions as F

    opens = F.length(text) - F.length(F.translate(text, "[{", ""))
    return (opens > F.lit(MAX_DEPTH)) & (depth_column(text) > F.lit(MAX_DEPTH))


def depth_problem(text: "Column", what: str = "document") -> "Column":
    """Why a text :func:`deep_column` finds too deep is refused (for those texts only: it counts
    the text's depth again)."""
    from pyspark.sql import functions as F

    return F.concat(
        F.lit(f"the {what} is nested "), depth_column(text).cast("string"),
        F.lit(
            f" levels deep (objects and arrays); at most {MAX_DEPTH} levels are supported (Spark, Delta and "
            "delta-rs fail on deeper ones): flatten it, or keep the deep part as a JSON string"
        ),
    )


def parse_one(text: "Column") -> "Column":
    """``try_parse_json(text)``, and NULL too when the text holds more than one JSON value or
    anything but whitespace after its value, or nests deeper than :data:`MAX_DEPTH` (see the
    module's docstring)."""
    from pyspark.sql import functions as F

    value = F.try_parse_json(text)
    wrapped = F.try_parse_json(F.concat(F.lit("["), text, F.lit(f',"{END_MARKER}"]')))
    # OR and AND evaluate their right side only when needed: the second parse is for the lines
    # that are not flat objects, the depth's exact count for those of many brackets; a line too
    # deep is never parsed (CASE WHEN evaluates its value only where its condition holds).
    alone = text.rlike(FLAT_OBJECT) | (
        ~deep_column(text)
        & ~text.contains(END_MARKER)
        & (F.try_variant_get(wrapped, "$[1]", "string") == F.lit(END_MARKER))
    )
    return F.when(alone, value)
