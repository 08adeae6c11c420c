"""What our SQL and commits call things: quoted identifiers, SQL names, the txn confs, the commit tag."""

from __future__ import annotations

import json
from typing import Any

from materializer.tables import TableRef


TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def quote(name: str) -> str:
    """``name`` as a SQL identifier: in backticks, a backtick inside doubled (```a``b```)."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """``text`` as a Spark SQL string literal: in single quotes, a backslash and a quote escaped.

    Spark reads backslash escapes in string literals (``spark.sql.parser.escapedStringLiterals`` is
    off by default), so the backslash is escaped first and the quote after it; adjacent literals
    concatenate in Spark SQL, so a doubled quote (``''``) would not be one quote but two literals.
    Every text from config or from data that becomes a SQL string goes through here (issue #66).
    """
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def user_metadata(pipeline_id: str, binding: str, epoch: int) -> str:
    """The ``userMetadata`` of every commit we make: who wrote what (DESIGN invariant 7)."""
    return json.dumps({"materializer": {"pipeline": pipeline_id, "binding": binding, "epoch": epoch}}, sort_keys=True)


def parse_user_metadata(value: str | None) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    inner = data.get("materializer") if isinstance(data, dict) else None
    return inner if isinstance(inner, dict) else None


def sql_name(table: TableRef) -> str:
    """The table as Delta's SQL names it: ``delta.`<path>``` or the catalog name as given."""
    if table.is_path:
        return "delta.`" + table.location.replace("`", "``") + "`"
    return table.location
