"""Schemas as ``schema_of_variant`` writes them, parsed in plain Python (no Spark).

The documents reader learns each document's shape from Spark (``schema_of_variant``) and checks
it here; its Arrow-batch checks (:mod:`materializer.sources.documents.check`) read the same text.
Both import this module, which imports neither.
"""

from __future__ import annotations

import re
from typing import Any

Shape = Any
"""A parsed ``schema_of_variant`` type: ("object", [(name, shape), …]), ("array", shape),
("decimal", precision, scale), or a scalar's name ("BIGINT", "STRING", "VOID", "VARIANT", …)."""

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_$]*)|(\d+)|(.))")


def parse_shape(text: str) -> Shape:
    """Parse ``OBJECT<a: BIGINT, `b c`: ARRAY<STRING>>`` (what schema_of_variant returns)."""
    tokens = [m for m in _TOKEN.finditer(text) if m.group(0).strip()]
    pos = 0

    def take() -> str:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        quoted, word, number, other = token.groups()
        if quoted is not None:
            return "q:" + quoted[1:-1].replace("``", "`")
        return word or number or other  # type: ignore[return-value]

    def peek() -> str:
        return tokens[pos].group(0).strip() if pos < len(tokens) else ""

    def shape() -> Shape:
        word = take().upper()
        if word == "OBJECT":
            take()  # <
            fields = []
            while peek() != ">":
                name = take()
                name = name[2:] if name.startswith("q:") else name
                take()  # :
                fields.append((name, shape()))
                if peek() == ",":
                    take()
            take()  # >
            return ("object", fields)
        if word == "ARRAY":
            take()
            inner = shape()
            take()
            return ("array", inner)
        if word == "DECIMAL" and peek() == "(":
            take()
            precision = int(take())
            take()
            scale = int(take())
            take()
            return ("decimal", precision, scale)
        return word

    return shape()
