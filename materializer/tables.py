"""Tables as the configuration names them, without Spark: where one is, and the Delta properties
that decide whether it can be written exactly once.

The configuration checks a pipeline with these before any session exists (two spellings of one
table, a retention property that would break the txn ids); :mod:`materializer.delta` and
:mod:`materializer.layout` use the same names once Spark is there. This module imports nothing of
the package, so the configuration, below Delta access in the layers, can use it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

RETENTION = "delta.settransactionretentionduration"
"""Delta forgets a txn id older than this: a replay of its epoch would then apply twice."""
DELETION_VECTORS = "delta.enableDeletionVectors"
RETENTION_DEFAULT_CONF = "spark.databricks.delta.properties.defaults.setTransactionRetentionDuration"
"""The session default new tables inherit their retention from."""

RETENTION_WHY = (
    "delta.setTransactionRetentionDuration makes Delta forget a writer's transaction ids after that "
    "time, and the materializer's exactly-once rests on them: a committed epoch re-applied after a "
    "crash (or a recovery) would no longer be recognised as applied and its rows would be written twice"
)


CATALOG_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|`[^`]+`")
"""One part of a catalog name: letters, digits and underscores, or any text but a backtick in
backticks. A backtick inside is refused, not doubled: a name filled from a topic or a folder
(``x`.`y``) must not be able to close its part and open another."""
CATALOG_NAME = re.compile(rf"^(?:{CATALOG_PART.pattern})(?:\.(?:{CATALOG_PART.pattern})){{0,2}}$")
"""A catalog name as our SQL may splice it: ``table``, ``schema.table`` or ``catalog.schema.table``."""
CATALOG_NAME_FORM = (
    "a catalog name is `table`, `schema.table` or `catalog.schema.table`, each part letters, digits and "
    "underscores, or in backticks holding no backtick (main.bronze.`orders-v2`)"
)


def catalog_parts(name: str) -> list[str] | None:
    """The parts of catalog name ``name`` (backticks kept), or None if it is not one
    (:data:`CATALOG_NAME`): the one check every catalog name passes before it reaches SQL text."""
    if not CATALOG_NAME.match(name):
        return None
    return CATALOG_PART.findall(name)


def suffixed(table: str, suffix: str) -> str:
    """``table`` with ``suffix`` appended to its last part: inside the backticks of a catalog
    name's quoted part (main.b.`t-1` -> main.b.`t-1_dead_letters`), so the result is still one."""
    if table.endswith("`") and not TableRef(table).is_path:
        return table[:-1] + suffix + "`"
    return table.rstrip("/") + suffix


@dataclass(frozen=True)
class TableRef:
    """A binding's ``table``: a path (absolute, relative, ``s3a://…``) or a catalog name."""

    spec: str
    """As written in the configuration."""

    @property
    def is_path(self) -> bool:
        return "/" in self.spec or ":" in self.spec or self.spec.startswith(".")

    @property
    def location(self) -> str:
        """Absolute path or URI for path tables; the name for catalog tables."""
        if not self.is_path or "://" in self.spec or self.spec.startswith(("dbfs:", "file:", "/")):
            return self.spec
        return os.path.abspath(self.spec)

    def __str__(self) -> str:
        return self.location


def normalise_location(location: str) -> str:
    """One spelling per place: ``s3a://``/``s3n://`` as ``s3://``, no ``file:``, no trailing or
    doubled slash, ``./`` and ``..`` resolved, local paths absolute with symlinks followed."""
    loc = location.strip()
    for alias in ("s3a://", "s3n://"):
        if loc.startswith(alias):
            loc = "s3://" + loc[len(alias) :]
    if loc.startswith("file:"):
        loc = loc[len("file:") :]
        if loc.startswith("//"):
            loc = loc[2:]
    if "://" in loc:
        scheme, _, rest = loc.partition("://")
        bucket, _, key = rest.partition("/")
        parts = [p for p in key.split("/") if p not in ("", ".")]
        return f"{scheme.lower()}://{bucket}/" + "/".join(parts)
    if loc.startswith("dbfs:"):
        return "dbfs:" + os.path.normpath(loc[len("dbfs:") :] or "/")
    return os.path.realpath(os.path.abspath(loc))


def config_identity(spec: str) -> str:
    """What can be told from the configuration alone: a path's normalised location, or the name."""
    table = TableRef(spec)
    return normalise_location(table.location) if table.is_path else spec.strip().lower()


def retention_problem(properties: dict[str, Any]) -> str | None:
    """Why a table (or a binding's properties) cannot be written exactly once; None if it can."""
    for key, value in properties.items():
        if key.lower() == RETENTION and value not in (None, ""):
            return f"{key} = {value}: {RETENTION_WHY}"
    return None
