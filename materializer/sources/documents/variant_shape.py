"""Schemas as ``schema_of_variant`` writes them, parsed in plain Python (no Spark).

The documents reader learns each document's shape from Spark (``schema_of_variant``) and checks
it here; its Arrow-batch checks (:mod:`materializer.sources.documents.check`) read the same text.
Both import this module, which imports neither.
"""

from __future__ import annotations

import re
from typing import Any

from materializer.errors import SourceError
from materializer.sources.json_text import MAX_DEPTH

Shape = Any
"""A parsed ``schema_of_variant`` type: ("object", [(name, shape), …]), ("array", shape),
("decimal", precision, scale), or a scalar's name ("BIGINT", "STRING", "VOID", "VARIANT", …)."""

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_$]*)|(\d+)|(.))")


def parse_shape(text: str) -> Shape:
    """Parse ``OBJECT<a: BIGINT, `b c`: ARRAY<STRING>>`` (what schema_of_variant returns).

    Without recursion (a stack of the objects and arrays open), and no deeper than
    :data:`~materializer.sources.json_text.MAX_DEPTH`: a document deeper is refused before Spark
    gives it a shape, so every walk of a parsed shape (:mod:`materializer.sources.documents.shapes`,
    the types made from it) recurses at most that many levels. A deeper shape raises SourceError."""
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

    # Each open container: ["object", fields, name of the field being read] or ["array"].
    stack: list[list[Any]] = []
    while True:
        word = take().upper()
        done: Shape
        if word == "OBJECT":
            take()  # <
            if len(stack) >= MAX_DEPTH:
                raise _too_deep(text)
            if peek() != ">":
                stack.append(["object", [], _name(take())])
                take()  # :
                continue
            take()  # >
            done = ("object", [])
        elif word == "ARRAY":
            take()  # <
            if len(stack) >= MAX_DEPTH:
                raise _too_deep(text)
            stack.append(["array"])
            continue
        elif word == "DECIMAL" and peek() == "(":
            take()
            precision = int(take())
            take()
            scale = int(take())
            take()
            done = ("decimal", precision, scale)
        else:
            done = word
        # A value is done: it closes the containers it ends, or is followed by the next field.
        while stack:
            top = stack[-1]
            if top[0] == "array":
                take()  # >
                stack.pop()
                done = ("array", done)
                continue
            top[1].append((top[2], done))
            if peek() == ",":
                take()
            if peek() != ">":
                top[2] = _name(take())
                take()  # :
                break
            take()  # >
            stack.pop()
            done = ("object", top[1])
        else:
            return done


def _name(token: str) -> str:
    return token[2:] if token.startswith("q:") else token


def _too_deep(text: str) -> SourceError:
    return SourceError(
        f"a document's shape nests deeper than {MAX_DEPTH} levels ({text[:200]}…), which the checks before "
        "Spark should have refused; nothing was applied. Report this as a bug, with the document."
    )
