"""``materializer schema``: the JSON Schema of the pipeline YAML."""

from __future__ import annotations

from typing import Any

from .common import echo_json


def schema() -> None:
    """Print the JSON Schema of the pipeline YAML (for editors and CI checks)."""
    echo_json(config_schema())


def config_schema() -> dict[str, Any]:
    """pydantic's JSON Schema of PipelineConfig, with the draft it follows."""
    from materializer.config import PipelineConfig

    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **PipelineConfig.model_json_schema()}
