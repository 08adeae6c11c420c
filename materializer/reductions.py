"""Reductions: combine an epoch's documents per key, and reduce them into the loaded current row.

lastWriteWins is built here: per key, the document with the highest ``_seq`` wins, deletes
included. The other strategies of the configuration are issue #5's work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import BindingConfig
from materializer.errors import ConfigError
from materializer.sources import SEQ

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def check_supported(binding: BindingConfig) -> None:
    unsupported = {f: s for f, s in binding.reductions.items() if s != "lastWriteWins"}
    if unsupported:
        raise ConfigError(
            f"binding {binding.name!r}: reductions {unsupported} are not built yet; only lastWriteWins is"
        )


def combine(documents: "DataFrame", binding: BindingConfig) -> "DataFrame":
    """One row per key: the epoch's last document for it (with its ``_op``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    latest = Window.partitionBy(*[F.col(f"`{k}`") for k in binding.key]).orderBy(F.col(SEQ).desc())
    return documents.withColumn("__rank", F.row_number().over(latest)).filter("__rank = 1").drop("__rank", SEQ)


def reduce(documents: "DataFrame", loaded: "DataFrame | None", binding: BindingConfig) -> "DataFrame":
    """The rows to store for the epoch: combined, then reduced into the current rows if loaded."""
    check_supported(binding)
    return combine(documents, binding)
