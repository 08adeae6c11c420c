"""A pipeline's YAML file read and validated; errors name the file, the field and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from materializer.config.pipeline import PipelineConfig
from materializer.errors import ConfigError

DEFAULT_CONFIG = Path("conf/orders-to-delta.yaml")


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_config(data: Any, origin: str) -> PipelineConfig:
    """Validate a parsed mapping; errors name the file, the field and the problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings at the top level, found {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        problems = [f"  {_location(err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(f"{origin}: invalid configuration\n" + "\n".join(problems)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline configuration file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: configuration file not found (run from the project folder, or pass --config FILE)"
        )
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start} cannot be decoded): "
            "save the configuration file as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))
