"""Progress reporting: core code emits events to a collector; only the CLI prints."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("materializer")


class Collector:
    """Receives events; the null collector ignores them."""

    def event(self, name: str, **fields: Any) -> None:
        pass


class LogCollector(Collector):
    """Sends events to the ``materializer`` logger (Databricks jobs, tests)."""

    def event(self, name: str, **fields: Any) -> None:
        details = " ".join(f"{k}={v}" for k, v in fields.items())
        log.info("%s %s", name, details)


class ListCollector(Collector):
    """Keeps events in memory (tests)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, name: str, **fields: Any) -> None:
        self.events.append((name, fields))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [fields for n, fields in self.events if n == name]
