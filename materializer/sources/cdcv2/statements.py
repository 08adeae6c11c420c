"""One CDC v2 statement judged alone, as Spark columns: malformed or not (and why), progress or updates.

Shared by the cdcv2 source's files and the kafka ``cdcv2`` payload's records: a statement is the
same text wherever it comes from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from materializer.columns import RESERVED
from materializer.sources.json_text import deep_column, depth_problem, parse_one

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def update_problem(u: "Column", keys: list[str]) -> "Column":
    """What is wrong with one update ``u`` (a VARIANT) of an updates statement (NULL: nothing)."""
    from pyspark.sql import functions as F

    arr = F.try_variant_get(u, "$", "array<variant>")
    data, time_v, diff_v = arr[0], arr[1], arr[2]
    data_map = F.try_variant_get(data, "$", "map<string,variant>")
    time = F.try_variant_get(time_v, "$", "bigint")
    diff = F.try_variant_get(diff_v, "$", "bigint")
    values = [F.try_element_at(data_map, F.lit(k)) for k in keys]
    problem = F.when(
        arr.isNull() | (F.array_size(arr) != 3), F.lit("is not a [data, time, diff] triple")
    ).when(data_map.isNull(), F.lit("has data that is not a JSON object"))
    problem = problem.when(
        F.schema_of_variant(time_v) != "BIGINT", F.lit("has a time that is not an integer")
    ).when(time < 0, F.lit("has a negative time"))
    problem = problem.when(
        (F.schema_of_variant(diff_v) != "BIGINT") | (diff == 0), F.lit("has a diff that is not a non-zero integer")
    )
    for name, value in zip(keys, values):
        problem = problem.when(
            value.isNull() | F.is_variant_null(value), F.lit(f"has data without the key field {name!r}")
        ).when(
            F.schema_of_variant(value).startswith("OBJECT") | F.schema_of_variant(value).startswith("ARRAY"),
            F.lit(f"has data whose key field {name!r} is not a scalar"),
        )
    for name in RESERVED:
        problem = problem.when(
            F.array_contains(F.map_keys(data_map), F.lit(name)),
            F.lit(f"has data with the field {name!r}, which the materializer reserves"),
        )
    return problem

def statements(lines: "DataFrame", keys: list[str]) -> "DataFrame":
    """``lines`` (a ``value`` column and any others) with what each statement is: ``problem``
    (what makes the whole statement malformed, its first bad update included; NULL: none),
    ``is_progress`` and ``updates`` (the updates as VARIANTs). A statement is judged alone."""
    from pyspark.sql import functions as F

    v = parse_one(F.col("value"))
    fields = F.map_keys(F.try_variant_get(v, "$", "map<string,variant>"))
    updates_arr = F.try_variant_get(v, "$.updates", "array<variant>")
    # concat is NULL where the update's problem is: the first non-NULL is the first bad update.
    first_bad_update = F.try_element_at(
        F.filter(
            F.transform(
                updates_arr, lambda u, i: F.concat(F.lit("update #"), (i + 1).cast("string"), F.lit(" "), update_problem(u, keys))
            ),
            lambda p: p.isNotNull(),
        ),
        F.lit(1),
    )
    return lines.select(
        *lines.columns,
        # A statement too deep is never parsed (json_text.MAX_DEPTH): named first.
        F.when(v.isNull() & deep_column(F.col("value")), depth_problem(F.col("value"), "statement"))
        .when(
            v.isNull() & F.try_parse_json("value").isNotNull(),
            F.lit("more than one JSON value, or text after the statement's value: one statement per line"),
        )
        .when(v.isNull(), F.lit("not valid JSON"))
        .when(fields.isNull(), F.lit("a statement must be a JSON object"))
        .when(
            ~(F.array_size(fields) == 1) | ~fields[0].isin("updates", "progress"),
            F.lit('a statement is an object with exactly one field, "updates" or "progress"'),
        )
        .when((fields[0] == "updates") & updates_arr.isNull(), F.lit('"updates" must be a list of [data, time, diff] triples'))
        .otherwise(first_bad_update)
        .alias("problem"),
        (v.isNotNull() & (F.array_size(fields) == 1) & (fields[0] == "progress")).alias("is_progress"),
        updates_arr.alias("updates"),
    )


def lookup(mapping: Mapping[str, str], key: "Column") -> "Column":
    """``mapping[key]`` as a Spark expression (NULL where absent; a few entries, never rows)."""
    from pyspark.sql import functions as F

    if not mapping:
        return F.lit(None).cast("string")
    return F.create_map(*[F.lit(x) for k, v in sorted(mapping.items()) for x in (k, v)])[key]
