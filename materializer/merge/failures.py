"""A Spark failure said in one line, the refused epoch's message with the way out, and the commits
that won over an apply, read from the table's history."""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import BindingConfig
from materializer.delta import OtherCommit, TableRef, parse_user_metadata, sql_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def cause(exc: BaseException) -> str:
    """The line of a Spark failure that says what went wrong, without the JVM stack."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    caused = [line for line in lines if line.startswith("Caused by:")]
    if caused:
        line = caused[-1][len("Caused by:") :].strip()
    else:
        line = next((l for l in lines if "[" in l and not l.startswith("at ")), lines[0] if lines else type(exc).__name__)
    line = line.lstrip(": ")
    if ": [" in line and line.split(": [", 1)[0].count(".") > 1:
        line = "[" + line.split(": [", 1)[1]  # drop the Java class name before Spark's error class
    return line[:500]


def refused(pipeline_id: str, binding: BindingConfig, epoch: int, exc: BaseException) -> str:
    return (
        f"epoch {epoch}, binding {binding.name}: Delta refused to apply the epoch to table {binding.table}: "
        f"{cause(exc)}. Nothing of epoch {epoch} was applied to {binding.table}; the epoch stays committed, so "
        "every run stops here until it is applied. Fix the table (for example drop or relax the constraint the "
        "rows break), then run again; or set the epoch's rows for this table aside, kept in a file, with "
        f"`materializer recover --config F --skip-epoch {epoch} --binding {binding.name}` (docs: 'Stuck epochs')."
    )


def commits_after(spark: "SparkSession", table: TableRef, version: int | None) -> list[OtherCommit] | None:
    """The table's commits after ``version`` (the one an apply read), oldest first, from ``DESCRIBE
    HISTORY`` (path and catalog tables alike; read only after a lost race, so its two Spark jobs
    cost nothing in a quiet run); None when the history cannot be read, which the error then says
    rather than hiding the conflict behind a second failure."""
    try:
        from pyspark.sql import functions as F

        rows = spark.sql(f"DESCRIBE HISTORY {sql_name(table)}").where(F.col("version") > (-1 if version is None else version))
        found = rows.select("version", "operation", "userMetadata", "engineInfo").collect()
    except Exception:  # noqa: BLE001 - any failure to read it: the error names no commit instead
        return None
    out = []
    for row in sorted(found, key=lambda r: int(r["version"])):
        tag = parse_user_metadata(row["userMetadata"])
        out.append(OtherCommit(
            version=int(row["version"]), operation=str(row["operation"] or ""), user_metadata=row["userMetadata"],
            engine_info=row["engineInfo"], pipeline=str(tag["pipeline"]) if tag and "pipeline" in tag else None,
        ))
    return out
