"""The frozen base model of every configuration section, and the field-path rule sections share."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
"""A dotted path of a field inside a record's value (``source.table``)."""


def check_field_paths(paths: dict[str, str], option: str) -> None:
    """The paths of ``option`` (``routed``, ``route_by``): at least one, each a dotted path of field names."""
    if not paths:
        raise ValueError(f"{option}: name at least one field")
    for path in paths:
        if not FIELD_PATH.match(path):
            raise ValueError(f"{option}: {path!r} is not a dotted path of field names, e.g. source.table")


class Model(BaseModel):
    """Frozen base: configuration never changes once loaded; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
