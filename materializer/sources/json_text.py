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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

FLAT_OBJECT = r"^[ \t\r\n]*\{[^{}\[\]]*\}[ \t\r\n]*$"
r"""A line that is one object with no nested object or array (and no brace or bracket in its
strings): its only ``}`` is its last character, so no text can follow its value. Around it JSON's
whitespace only (space, tab, CR, LF: a regex's ``\s`` would let a form feed or vertical tab
after the value pass)."""

END_MARKER = "__materializer_end_of_value_5c19d2e7__"


def parse_one(text: "Column") -> "Column":
    """``try_parse_json(text)``, and NULL too when the text holds more than one JSON value or
    anything but whitespace after its value (see the module's docstring)."""
    from pyspark.sql import functions as F

    value = F.try_parse_json(text)
    wrapped = F.try_parse_json(F.concat(F.lit("["), text, F.lit(f',"{END_MARKER}"]')))
    # OR and AND evaluate their right side only when needed: the second parse is for the lines
    # that are not flat objects.
    alone = text.rlike(FLAT_OBJECT) | (
        ~text.contains(END_MARKER) & (F.try_variant_get(wrapped, "$[1]", "string") == F.lit(END_MARKER))
    )
    return F.when(alone, value)
