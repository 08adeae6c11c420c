"""What our SQL and commits call things: quoted identifiers, SQL names, the txn confs, the commit tag."""

from __future__ import annotations

import json
from typing import Any

from materializer.sqltypes import literal, quote  # noqa: F401 - re-exported: the floor of all SQL text holds them
from materializer.errors import ConfigError
from materializer.tables import CATALOG_NAME_FORM, TableRef, catalog_parts


TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


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
    """The table as Delta's SQL names it: ``delta.`<path>``` or the catalog name as given, once it
    is one (:func:`materializer.tables.catalog_parts`, the check the configuration makes too)."""
    if table.is_path:
        return "delta." + quote(table.location)
    if catalog_parts(table.location) is None:
        # Spliced as written: anything but the one form could end the statement or name another schema.
        raise ConfigError(
            f"table {table.location!r} is neither a path nor a catalog name: {CATALOG_NAME_FORM}. Nothing was read or "
            "written; give the binding's table (or dead_letter_table) as a path or a catalog name of that form"
        )
    return table.location
