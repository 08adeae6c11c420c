"""References to secrets in the configuration: ``${env:NAME}``, ``${file:/path}``, ``${secret:scope/key}``.

Resolved once, when the file is loaded (:func:`resolve_references`, before pydantic sees the
values), anywhere in any string value of the YAML, nested in lists and maps, whole or inside a longer
value (``password="${env:KAFKA_PASSWORD}";`` in a JAAS line):

* ``${env:NAME}``: the environment variable ``NAME``;
* ``${file:/path/to/secret}``: the file's content, one trailing newline taken off (as Kubernetes
  and Docker mount secrets);
* ``${secret:scope/key}``: in the Databricks job, ``dbutils.secrets.get(scope, key)``
  (:func:`use_secret_scopes`, called by :mod:`materializer.databricks`); anywhere else an error.

``$${`` is a literal ``${`` (``$${env:X}`` is the text ``${env:X}``); a ``${`` that starts no
reference of these three kinds is refused, so a typo (``${evn:X}``) is never taken as text.

Every resolved value is registered with :mod:`materializer.redact`, so every output shows it as
``***``; nothing writes it back: the drill's scratch configuration is written with the references
(:func:`unresolve`). A missing variable or file is a :class:`~materializer.errors.ConfigError`
naming the file, the option's path and the variable or file, never a value.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Callable

from materializer import redact
from materializer.errors import ConfigError

REFERENCE = re.compile(r"\$\$\{|\$\{(?:(?P<kind>[A-Za-z_][A-Za-z0-9_]*):(?P<name>[^}]*)\}|)")
"""A literal ``$${``, a reference ``${kind:name}``, or a ``${`` that is neither (refused)."""

KINDS = ("env", "file", "secret")

SecretScopes = Callable[[str, str], str]
"""``(scope, key) -> value``: how ``${secret:scope/key}`` is read (Databricks' ``dbutils.secrets.get``)."""

_scopes: SecretScopes | None = None
_lock = threading.Lock()
_references: dict[str, str] = {}
"""Each resolved value -> the reference it came from (:func:`unresolve`)."""


def use_secret_scopes(get: SecretScopes | None) -> None:
    """Read ``${secret:scope/key}`` with ``get`` from now on (None: refuse them again)."""
    global _scopes
    _scopes = get


def _location(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _resolve_one(kind: str, name: str, where: str) -> str:
    if kind == "env":
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"{where}: ${{env:{name}}} does not name an environment variable (letters, digits and _)")
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"{where}: environment variable {name} is not set (referenced as ${{env:{name}}}): set it, or write the value")
        return value
    if kind == "file":
        path = Path(name).expanduser()
        try:
            value = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{where}: secret file {name} not found (referenced as ${{file:{name}}})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{where}: secret file {name} cannot be read ({type(exc).__name__}; referenced as ${{file:{name}}})"
            ) from None
        return value[:-1] if value.endswith("\n") else value
    if kind == "secret":
        scope, _, key = name.partition("/")
        if not scope or not key:
            raise ConfigError(f"{where}: ${{secret:{name}}} must name a scope and a key, ${{secret:scope/key}}")
        if _scopes is None:
            raise ConfigError(
                f"{where}: ${{secret:{name}}} reads a Databricks secret scope, which only the Databricks job "
                "(materializer.databricks) can read; elsewhere use ${env:NAME} or ${file:/path}"
            )
        try:
            return _scopes(scope, key)
        except Exception as exc:  # noqa: BLE001 - dbutils raises its own kinds
            raise ConfigError(
                f"{where}: Databricks secret {scope}/{key} cannot be read ({type(exc).__name__}): check the scope, "
                "the key and the job's permission on the scope"
            ) from None
    raise ConfigError(
        f"{where}: ${{{kind}:…}} is not a reference: use ${{env:NAME}}, ${{file:/path}} or ${{secret:scope/key}}, "
        "or write $${ for a literal ${"
    )


def resolve_string(value: str, where: str) -> str:
    """``value`` with its references resolved and ``$${`` made ``${`` (each resolved value registered)."""
    if "${" not in value:
        return value
    out: list[str] = []
    last = 0
    for found in REFERENCE.finditer(value):
        out.append(value[last:found.start()])
        last = found.end()
        if found.group(0) == "$${":
            out.append("${")
            continue
        kind, name = found.group("kind"), found.group("name")
        if kind is None:
            raise ConfigError(
                f"{where}: '${{' starts no reference: use ${{env:NAME}}, ${{file:/path}} or ${{secret:scope/key}}, "
                "or write $${ for a literal ${"
            )
        resolved = _resolve_one(kind, name, where)
        redact.remember(resolved)
        with _lock:
            _references.setdefault(resolved, f"${{{kind}:{name}}}")
        out.append(resolved)
    out.append(value[last:])
    return "".join(out)


def resolve_references(data: Any, origin: str, path: tuple[Any, ...] = ()) -> Any:
    """The parsed YAML ``data`` with every reference in its string values resolved; errors name
    ``origin`` (the file) and the option's path."""
    if isinstance(data, str):
        return resolve_string(data, f"{origin}: {_location(path)}")
    if isinstance(data, dict):
        return {key: resolve_references(value, origin, (*path, key)) for key, value in data.items()}
    if isinstance(data, list):
        return [resolve_references(value, origin, (*path, i)) for i, value in enumerate(data)]
    return data


def unresolve(data: Any) -> Any:
    """``data`` (a configuration dumped to plain values) as it was written: each resolved value put
    back as its reference, each other ``${`` escaped as ``$${``, so writing it out (the drill's
    scratch configuration) stores no secret and loads again as the same configuration."""
    if isinstance(data, dict):
        return {key: unresolve(value) for key, value in data.items()}
    if isinstance(data, list):
        return [unresolve(value) for value in data]
    if not isinstance(data, str):
        return data
    with _lock:
        references = dict(_references)
    if data in references:
        return references[data]
    values = sorted((v for v in references if len(v) >= redact.MIN_LENGTH), key=len, reverse=True)
    if not values:
        return data.replace("${", "$${")
    out: list[str] = []
    last = 0
    for found in re.finditer("|".join(map(re.escape, values)), data):
        out.append(data[last:found.start()].replace("${", "$${"))
        out.append(references[found.group(0)])
        last = found.end()
    out.append(data[last:].replace("${", "$${"))
    return "".join(out)
