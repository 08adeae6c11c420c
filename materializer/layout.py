"""Table layout chosen at creation: partitioning, liquid clustering, table properties.

A binding's ``partition_by``, ``cluster_by`` and ``properties`` (and deletion vectors, on unless
the binding opts out) are applied once, by the commit that creates the table: the first epoch's
tagged commit, a ``CREATE TABLE … AS SELECT`` carrying the epoch's txn id. ``CREATE TABLE``
without ``IF NOT EXISTS`` fails when the table exists, and two creations racing meet Delta's
conflict check, so a first epoch repeated or run twice at once never appends blindly onto a
table that exists: the loser reads the table again and merges (or finds the epoch applied).

A table that exists already keeps its layout; a binding whose layout contradicts it is refused
(the options would silently do nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from materializer.delta import error_condition, literal, quote
from materializer.tables import DELETION_VECTORS, retention_problem

if TYPE_CHECKING:
    from materializer.config import BindingConfig

ALREADY_EXISTS = ("TABLE_OR_VIEW_ALREADY_EXISTS", "DELTA_TABLE_ALREADY_EXISTS", "DELTA_PATH_EXISTS")
"""Error classes of a CREATE TABLE that found the table there: someone created it meanwhile."""


def table_properties(binding: "BindingConfig") -> dict[str, str]:
    """The properties a new table gets: the binding's, plus deletion vectors unless opted out."""
    properties = {DELETION_VECTORS: "true" if binding.deletion_vectors else "false"}
    properties.update(binding.properties)
    return properties


def create_table_sql(
    target: str, source_view: str, binding: "BindingConfig", columns: list[str], replace: bool = False
) -> str:
    """``CREATE TABLE target USING delta [PARTITIONED BY|CLUSTER BY] TBLPROPERTIES (…) AS SELECT``.

    No ``IF NOT EXISTS`` and no ``OR REPLACE``: a table that exists makes it fail, which is the
    point (the caller reads the table again and merges into it instead). ``replace``: only over
    a location that holds a killed CREATE's files and no commit (``DeltaDriver._check_created_by_us``)."""
    layout = ""
    if binding.partition_by:
        layout = " PARTITIONED BY (" + ", ".join(quote(c) for c in binding.partition_by) + ")"
    elif binding.cluster_by:
        layout = " CLUSTER BY (" + ", ".join(quote(c) for c in binding.cluster_by) + ")"
    properties = ", ".join(f"{literal(k)} = {literal(v)}" for k, v in table_properties(binding).items())
    select = ", ".join(quote(c) for c in columns)
    create = "CREATE OR REPLACE TABLE" if replace else "CREATE TABLE"
    return f"{create} {target} USING delta{layout} TBLPROPERTIES ({properties}) AS SELECT {select} FROM {quote(source_view)}"


def is_already_exists(exc: BaseException) -> bool:
    """Did a CREATE TABLE find the table there (by Spark's/Delta's error class, not by words)?"""
    return error_condition(exc) in ALREADY_EXISTS


def layout_problems(binding: "BindingConfig", schema: Any) -> list[str]:
    """What a CREATE TABLE with the binding's layout would refuse about the epoch's rows."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    problems = []
    fields = {f.name: f.dataType for f in schema.fields}
    for option, columns in (("partition_by", binding.partition_by), ("cluster_by", binding.cluster_by)):
        for column in columns:
            dtype = fields.get(column)
            if dtype is None:
                problems.append(
                    f"{option} names {column!r}, which the documents of the table's first epoch do not have "
                    "(the table is created with the first epoch's columns)"
                )
            elif isinstance(dtype, (StructType, ArrayType, MapType)):
                problems.append(f"{option} names {column!r}, a {dtype.simpleString()}; Delta lays out tables by scalar columns only")
    return problems


def existing_layout_problems(binding: "BindingConfig", found: dict[str, Any]) -> list[str]:
    """Where an existing table (its DESCRIBE DETAIL) contradicts the binding's layout options."""
    problems = []
    problem = retention_problem(dict(found.get("properties") or {}))
    if problem:
        problems.append(problem)
    partitioned = list(found.get("partitionColumns") or [])
    clustered = list(found.get("clusteringColumns") or [])
    if binding.partition_by and [c.lower() for c in binding.partition_by] != [c.lower() for c in partitioned]:
        problems.append(
            f"partition_by is {binding.partition_by} but the table exists partitioned by {partitioned or 'nothing'} "
            "(layout options apply only when the materializer creates the table)"
        )
    if binding.cluster_by and [c.lower() for c in binding.cluster_by] != [c.lower() for c in clustered]:
        problems.append(
            f"cluster_by is {binding.cluster_by} but the table exists clustered by {clustered or 'nothing'} "
            f"(change it with ALTER TABLE {binding.table} CLUSTER BY (…), or remove cluster_by)"
        )
    return problems
