"""A pipeline's YAML file read, its secret references resolved, and validated; errors name the file,
the field and the problem, never a secret (docs: 'Secrets')."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from materializer import redact
from materializer.config.pipeline import PipelineConfig
from materializer.config.secrets import resolve_references
from materializer.errors import ConfigError

DEFAULT_CONFIG = Path("conf/orders-to-delta.yaml")


def _location(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


OPTION_MAPS = ("options", "client_options", "conf")
"""Mappings of options handed on as they are (Kafka's reader and client, Spark's conf): a value
under a key that names a secret is one (:data:`materializer.redact.SECRET_KEY`)."""


def remember_secrets(data: Any, key: Any = None) -> None:
    """Register the secrets of the parsed configuration ``data`` with :mod:`materializer.redact`:
    the values of secret-bearing keys of its option maps, the passwords of URLs and the tokens of
    Connect URLs anywhere (resolved references are registered as they are resolved)."""
    if isinstance(data, dict):
        if key in OPTION_MAPS:
            redact.remember_options({k: v for k, v in data.items() if isinstance(k, str)})
        for k, value in data.items():
            remember_secrets(value, k)
    elif isinstance(data, list):
        for value in data:
            remember_secrets(value, key)
    elif isinstance(data, str):
        redact.remember_in(data)


def parse_config(data: Any, origin: str) -> PipelineConfig:
    """Validate a parsed mapping (its references resolved already); errors name the file, the field
    and the problem, with every secret as ``***``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings at the top level, found {type(data).__name__}")
    remember_secrets(data)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        problems = [f"  {_location(err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(redact.text(f"{origin}: invalid configuration\n" + "\n".join(problems))) from None


def _yaml_error(path: Path, exc: yaml.YAMLError, text: str) -> ConfigError:
    """A YAML syntax error by line and column, and the key of that line: never the line itself,
    which may hold a password written inline."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    context = getattr(exc, "context", None)
    where = ""
    if mark is not None:
        where = f" at line {mark.line + 1}, column {mark.column + 1}"
        lines = text.splitlines()
        line = lines[mark.line] if 0 <= mark.line < len(lines) else ""
        found = re.match(r"\s*(?:-\s+)?([^\s:#'\"][^:#]*?|'[^']*'|\"[^\"]*\")\s*:(?:\s|$)", line)
        if found:
            where += f" (the line of {found.group(1).strip()!r})"
    detail = f"{problem}" + (f", {context}" if context else "")
    return ConfigError(redact.text(f"{path}: not valid YAML: {detail}{where}; the line itself is not shown, it may hold a secret"))


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline configuration file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: configuration file not found (run from the project folder, or pass --config FILE)"
        )
    try:
        text = path.read_bytes().decode("utf-8")
        data = yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start} cannot be decoded): "
            "save the configuration file as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc, text) from None
    return parse_config(resolve_references(data, str(path)), str(path))
