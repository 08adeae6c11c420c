"""A Spark failure said in one line, and the refused epoch's message with the way out."""

from __future__ import annotations

from materializer.config import BindingConfig


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
