"""Binding templates: a binding per topic a pattern matches, per sub-folder, or per routed value of one topic."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import ValidationError, field_validator, model_validator

from materializer.config.base import check_field_paths
from materializer.config.binding import BindingConfig
from materializer.config.source import SourceConfig

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
"""A ``{placeholder}`` of a template's name or table (``{{`` and ``}}`` are literal braces)."""


def routed_found(topic: str, values: dict[str, str]) -> str:
    """What a ``route_by`` template makes a binding from: the topic and the route fields' values,
    as one text (JSON, keys sorted), recorded in the driver checkpoint as ``route:<text>``."""
    return json.dumps({"topic": topic, "values": dict(sorted(values.items()))}, sort_keys=True, separators=(",", ":"))


def routed_values(found: str) -> tuple[str, dict[str, str]]:
    """The topic and values of a :func:`routed_found` text."""
    data = json.loads(found)
    return str(data["topic"]), {str(k): str(v) for k, v in data["values"].items()}


class TemplateSourceConfig(SourceConfig):
    """A template's source: a binding's source, with a topic pattern or a folder of folders."""

    topic_pattern: str | None = None
    """kafka: a regular expression that a topic's whole name must match; each matching topic is
    one binding (Kafka's own ``__`` topics never match). Its named groups, e.g.
    ``shop\\.(?P<schema>\\w+)\\.(?P<table>\\w+)`` for Debezium's ``<prefix>.<schema>.<table>``
    topics, are placeholders of the template's ``name`` and ``table`` beside ``{topic}``."""
    folders_in: str | None = None
    """documents and cdcv2: a folder (or S3 prefix) whose every sub-folder is one binding reading
    that sub-folder (``{folder}``: its name; names starting with ``.`` or ``_`` are skipped)."""
    route_by: dict[str, str] | None = None
    """kafka, with ``topic`` or ``topic_pattern``: one binding per value of fields of each record,
    e.g. ``{schema: source.schema, table: source.table}`` for Debezium events of several tables in
    one topic (placeholder -> dotted path into the value, Debezium's ``payload`` envelope
    unwrapped); with ``topic_pattern``, per topic it matches and value (each topic has a position
    of its own; its named groups are placeholders too). A value first seen in an epoch is a
    binding from that epoch on; every record must hold the fields, or
    with ``on_invalid: dead_letter`` and a ``dead_letter_table`` without placeholders is a dead
    letter there (docs: 'One topic, many tables')."""

    @model_validator(mode="after")
    def _kafka_fields(self) -> "TemplateSourceConfig":
        # Replaces SourceConfig's check: a template names its topics or folders by pattern.
        if self.route_by is not None:
            if self.format != "kafka" or (self.topic is None) == (self.topic_pattern is None) or self.topics is not None or self.folders_in is not None:
                raise ValueError(
                    "route_by is for a kafka template of topics carrying several tables: give topic (one topic) or "
                    "topic_pattern (every topic it matches, each with a position of its own), not topics or folders_in"
                )
            check_field_paths({path: "" for path in self.route_by.values()}, "route_by")
            for placeholder in self.route_by:
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", placeholder) or placeholder == "topic":
                    raise ValueError(f"route_by: {placeholder!r} is not a placeholder name (letters, digits, '_'; not 'topic')")
            if self.topic_pattern is not None:
                self._check_pattern()
                both = sorted(set(re.compile(self.topic_pattern).groupindex) & set(self.route_by))
                if both:
                    raise ValueError(
                        f"route_by and topic_pattern both fill {', '.join('{' + b + '}' for b in both)}: rename the "
                        "pattern's group or the route_by placeholder, so each placeholder has one source"
                    )
            try:
                SourceConfig.model_validate(self.concrete(routed_found(self.topic or "example", {k: "example" for k in self.route_by})))
            except ValidationError as exc:
                raise ValueError("; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())) from None
            return self
        if self.format == "kafka":
            if self.topic_pattern is None or self.topic is not None or self.topics is not None or self.folders_in is not None:
                raise ValueError(
                    "a kafka template takes topic_pattern (a regular expression of topic names), not topic, topics or folders_in"
                )
            self._check_pattern()
        elif self.folders_in is None or self.path is not None or self.topic_pattern is not None:
            raise ValueError(
                f"a {self.format} template takes folders_in (a folder whose every sub-folder is one binding), not path "
                "or topic_pattern"
            )
        try:
            SourceConfig.model_validate(self.concrete("example"))
        except ValidationError as exc:
            raise ValueError("; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())) from None
        return self

    def _check_pattern(self) -> None:
        try:
            re.compile(self.topic_pattern or "")
        except re.error as exc:
            raise ValueError(f"topic_pattern: {self.topic_pattern!r} is not a regular expression: {exc}") from None
        if isinstance(self.starting, dict) and set(self.starting) != {"timestamp"}:
            raise ValueError(
                "starting: offsets per topic are not for a template (its topics are not known yet): give earliest, "
                "latest or {timestamp: <epoch ms>}"
            )

    @property
    def placeholders(self) -> set[str]:
        """The placeholders a binding made from this source fills."""
        groups = set(re.compile(self.topic_pattern).groupindex) if self.topic_pattern is not None else set()
        if self.route_by is not None:
            return {"topic", *self.route_by, *groups}
        if self.topic_pattern is not None:
            return {"topic", *groups}
        return {"folder"}

    def concrete(self, found: str) -> dict[str, Any]:
        """The source of the binding made for topic or sub-folder ``found`` (with ``route_by``: a
        :func:`routed_found`), unvalidated."""
        data = self.model_dump(by_alias=True, exclude_unset=True, exclude={"topic_pattern", "folders_in", "route_by"})
        if self.route_by is not None:
            topic, values = routed_values(found)
            data["topic"] = topic
            data["routed"] = {path: values[placeholder] for placeholder, path in self.route_by.items()}
        elif self.format == "kafka":
            data["topic"] = found
        else:
            data["path"] = (self.folders_in or "").rstrip("/") + "/" + found
        return data


class BindingTemplate(BindingConfig):
    """A binding per Kafka topic matching a pattern, or per sub-folder of a folder: every key of a
    binding, with ``{placeholders}`` in ``name`` and ``table`` (docs: 'Binding templates')."""

    name: str | None = None  # type: ignore[assignment]
    """Name of each binding made, with placeholders: ``{topic}`` or ``{folder}`` (the default),
    and the named groups of ``source.topic_pattern``. Each must come out as letters, digits and
    underscores; two topics or folders making one name stop the run."""
    source: TemplateSourceConfig  # type: ignore[assignment]
    """Where the bindings' collections come from: ``topic_pattern`` (kafka) or ``folders_in``."""
    table: str
    """Each binding's Delta table, with placeholders, e.g. ``/data/delta/{table}`` or
    ``main.bronze.{table}``; two bindings making one table stop the run."""
    on_missing: Literal["fail", "drop"] = "fail"
    """A topic or sub-folder that a committed epoch covered and that is no longer found (deleted,
    or no longer matched): ``fail`` stops the run naming it, once its committed epochs are applied;
    ``drop`` stops materializing it (its table keeps what it holds) at the next epoch boundary."""

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str | None) -> str | None:
        return value  # checked per binding made, once its placeholders are filled

    @model_validator(mode="after")
    def _layout(self) -> "BindingTemplate":
        # Replaces BindingConfig's: the view name has placeholders; each binding made is checked whole.
        return self

    @model_validator(mode="after")
    def _placeholders(self) -> "BindingTemplate":
        known = self.source.placeholders
        for option in ("name", "table", "dead_letter_table", "view"):
            value = getattr(self, option)
            if value is None:
                continue
            unknown = sorted(set(PLACEHOLDER.findall(value.replace("{{", "").replace("}}", ""))) - known)
            if unknown:
                raise ValueError(
                    f"{option}: {value!r} has placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; this template fills "
                    + ", ".join("{" + k + "}" for k in sorted(known))
                    + (" (named groups of topic_pattern, e.g. (?P<table>\\w+), are placeholders too)" if self.source.format == "kafka" else "")
                )
        if not PLACEHOLDER.search(self.table.replace("{{", "").replace("}}", "")):
            raise ValueError(f"table: {self.table!r} has no placeholder, so every binding would share one table; e.g. /data/delta/{{{min(known)}}}")
        if self.previous_names:
            raise ValueError("previous_names is for a binding, not a template")
        # Every other rule of a binding, checked now on a binding this template could make.
        try:
            example = {k: "example" for k in known}
            found = "example"
            if self.source.route_by is not None:
                found = routed_found(self.source.topic or "example", {k: "example" for k in self.source.route_by})
            BindingConfig.model_validate(self.binding_data(found, example))
        except ValidationError as exc:
            raise ValueError("; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())) from None
        return self

    def binding_data(self, found: str, values: dict[str, str]) -> dict[str, Any]:
        """The binding made for topic or sub-folder ``found``, its placeholders filled with
        ``values``, as the mapping a binding is validated from."""
        data = self.model_dump(by_alias=True, exclude_unset=True, exclude={"name", "source", "on_missing"})
        data["name"] = self.name_pattern.format_map(values)
        data["table"] = self.table.format_map(values)
        for option in ("dead_letter_table", "view"):
            if data.get(option) is not None:
                data[option] = data[option].format_map(values)
        data["source"] = self.source.concrete(found)
        return data

    @property
    def unrouted_dead_letters(self) -> str | None:
        """``route_by`` with ``on_invalid: dead_letter`` and a ``dead_letter_table`` without
        placeholders: that table, where the records that name no table land as dead letters
        (through one binding made for them). None: such a record stops the run."""
        table = self.dead_letter_table
        if self.source.route_by is None or self.on_invalid != "dead_letter" or table is None:
            return None
        if PLACEHOLDER.search(table.replace("{{", "").replace("}}", "")):
            return None
        return table.format_map({})

    @property
    def name_pattern(self) -> str:
        return self.name if self.name is not None else ("{topic}" if self.source.format == "kafka" else "{folder}")
