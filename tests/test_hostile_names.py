"""Hostile names and forged bounds (issue #66 items 1 and 4): one quoting function for SQL string
literals, and key bounds from the recovery log rendered only from typed values."""

from __future__ import annotations

from typing import Any

import pytest

from materializer.bounds import ForgedBound, bounds_condition
from materializer.delta import literal

HOSTILE = ["x'", "p'||'q", "a\\b", "/**/c", "ü'ñ", "\\'", "'; DROP TABLE t; --", "a\\\\'b"]


def test_a_literal_has_no_unescaped_quote_inside() -> None:
    for text in HOSTILE:
        out = literal(text)
        assert out.startswith("'") and out.endswith("'")
        inner, i = out[1:-1], 0
        while i < len(inner):  # every quote inside is escaped by a backslash that is not itself escaped
            if inner[i] == "\\":
                i += 2
                continue
            assert inner[i] != "'", (text, out)
            i += 1


@pytest.mark.spark
def test_a_literal_reads_back_as_the_same_text_in_spark(spark: Any) -> None:
    for text in HOSTILE:
        assert spark.sql(f"SELECT {literal(text)} AS v").first().v == text
        row = spark.sql(f"SELECT named_struct({literal(text)}, 1) AS s").first()
        assert list(row.s.asDict()) == [text]


@pytest.mark.parametrize("bound", [
    ["integer", "1 OR true", "2"],
    ["integer", "1", "2) OR (true"],
    ["string", "41' OR true OR X'41", "42"],
    ["string", "414", "42"],  # not whole bytes
    ["decimal(10,2)) OR (true", "1.5", "2.5"],
    ["decimal(10,2)", "1.5' OR '1", "2.5"],
    ["date", "1 OR true", "3"],
    ["timestamp", "0", "1;"],
    ["float", "1", "2"],
])
def test_a_forged_bound_is_refused_not_spliced(bound: list[str]) -> None:
    with pytest.raises(ForgedBound, match="recovery log entry"):
        bounds_condition({"id": bound})


def test_true_bounds_render_as_before() -> None:
    got = bounds_condition({"id": ["integer", "-3", "17"], "s": ["string", "4142", "43"], "d": ["decimal(10,2)", "-1.50", "2"]})
    assert got == (
        " AND t.`d` >= CAST('-1.50' AS decimal(10,2)) AND t.`d` <= CAST('2' AS decimal(10,2))"
        " AND t.`id` >= -3 AND t.`id` <= 17"
        " AND t.`s` >= CAST(X'4142' AS STRING) AND t.`s` <= CAST(X'43' AS STRING)"
    )
