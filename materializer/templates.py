"""Binding templates: one binding per Kafka topic a pattern matches, or per sub-folder of a folder.

Two steps, kept apart so the first is plain Python a unit test drives without a broker or Spark:

* :func:`expand` turns the configuration's templates, the topics and folders found, and the set
  the last committed epoch covered (its driver checkpoint's ``templated``) into a configuration of
  plain bindings (``templates`` empty), so the runtime, the driver and ``status`` see bindings
  only. A binding the last epoch covered is always made, found or not (its staged rows must still
  be applied): :attr:`Expansion.missing` names those no longer found, and the runtime stops (or
  drops them, ``on_missing: drop``) only once their last epoch is applied.
* :func:`discover` lists the topics (confluent-kafka's admin client) and sub-folders.

What a binding is made from is recorded as ``topic:<name>`` or ``folder:<path>``, or for a
``route_by`` template (one topic, many tables) ``route:<topic and values as JSON>``; the recorded
set is what a replay covers, whatever the brokers or folders show by then. A routed binding once
recorded stays covered: an epoch whose records do not name its table simply has no batch for it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from materializer.config import BindingConfig, BindingTemplate, PipelineConfig, routed_found, routed_values
from materializer.errors import ConfigError, SourceError
from materializer.storage import local_path, open_store
from materializer.tables import CATALOG_NAME_FORM, TableRef, catalog_parts, config_identity, suffixed

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Made:
    """One binding made from a template."""

    template: int
    """Position of its template in ``templates``."""
    source: str
    """What it was made from: ``topic:<name>`` or ``folder:<path>``."""
    binding: BindingConfig


@dataclass(frozen=True)
class Expansion:
    config: PipelineConfig
    """The pipeline with every binding made (after the configured ones) and no templates."""
    made: dict[str, Made] = field(default_factory=dict)
    """Per binding made from a template, by name."""
    missing: dict[str, Made] = field(default_factory=dict)
    """Bindings the last committed epoch covered whose topic or folder is no longer found (or no
    longer matched): made so that epoch is applied, then stopped for or dropped."""

    @property
    def covered(self) -> dict[str, str]:
        """What the next epoch covers, as recorded in its driver checkpoint: name -> source."""
        return {name: m.source for name, m in self.made.items() if name not in self.missing}


def source_id(template: BindingTemplate, found: str) -> str:
    """How a binding's topic or folder is recorded."""
    if template.source.route_by is not None:
        return f"route:{found}"
    if template.source.format == "kafka":
        return f"topic:{found}"
    return f"folder:{(template.source.folders_in or '').rstrip('/')}/{found}"


def values_for(template: BindingTemplate, found: str) -> dict[str, str] | None:
    """The placeholders filled for topic or sub-folder ``found``; None: the template does not take it."""
    source = template.source
    if source.route_by is not None:
        topic, values = routed_values(found)
        groups = topic_values(template, topic)
        return {**groups, **values} if groups is not None and set(values) == set(source.route_by) else None
    if source.format != "kafka":
        return {"folder": found}
    return topic_values(template, found)


def topic_values(template: BindingTemplate, topic: str) -> dict[str, str] | None:
    """A kafka template's placeholders filled by ``topic`` (``{topic}`` and the named groups of
    ``topic_pattern``); None: the template does not read that topic."""
    source = template.source
    if source.topic_pattern is None:
        return {"topic": topic} if topic == source.topic else None
    match = re.fullmatch(source.topic_pattern, topic)
    if match is None or topic.startswith("__"):
        return None
    values = {"topic": topic}
    for group, value in match.groupdict().items():
        if value is None:
            raise ConfigError(
                f"templates: topic {topic!r} matches topic_pattern {source.topic_pattern!r} without its group "
                f"{group!r}, which the template's placeholders need: make the group required, or the pattern narrower"
            )
        values[group] = value
    return values


UNROUTED_SUFFIX = "__unrouted"
"""Ends the name of the binding a ``route_by`` template makes for the records that name no table."""


def unrouted_found(topic: str) -> str:
    """What the binding for topic ``topic``'s records that name no table is made from: a
    :func:`routed_found` without values."""
    return routed_found(topic, {})


def takes(template: BindingTemplate, found: str) -> bool:
    """Whether ``template`` makes a binding from ``found`` (a routed table's, or the one for the
    records of its topic that name no table)."""
    if values_for(template, found) is not None:
        return True
    if template.unrouted_dead_letters is None:
        return False
    topic, values = routed_values(found)
    return values == {} and topic_values(template, topic) is not None


def _make_unrouted(template: BindingTemplate, index: int, found: str) -> Made | None:
    """The binding for the records of a ``route_by`` template's topic that name no table: it
    reads every range its routed tables read, keeps those records only, and sets each aside as
    a dead letter in the template's dead-letter table; its own table is never written."""
    dead_letters = template.unrouted_dead_letters
    topic = routed_values(found)[0]
    if dead_letters is None or not takes(template, found):
        return None
    safe = re.sub(r"[^A-Za-z0-9_]", "_", topic)
    name = safe + UNROUTED_SUFFIX
    if not _IDENT.match(name):
        name = "_" + name
    data = template.model_dump(by_alias=True, exclude_unset=True, exclude={"name", "source", "on_missing", "view", "view_internal_columns"})
    source = template.source.model_dump(by_alias=True, exclude_unset=True, exclude={"topic_pattern", "folders_in", "route_by"})
    source.update(topic=topic, unrouted=sorted((template.source.route_by or {}).values()))
    # Never written, but a table is a binding's identity: one per topic when a pattern gives several.
    table = suffixed(dead_letters, UNROUTED_SUFFIX + ("" if template.source.topic_pattern is None else "_" + safe))
    data.update(name=name, table=table, dead_letter_table=dead_letters, source=source)
    try:
        binding = BindingConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'binding'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"templates[{index}]: the binding for topic {topic!r} records that name no table is invalid: {problems}") from None
    return Made(index, source_id(template, found), binding)


def _check_catalog_name(template: BindingTemplate, option: str, values: dict[str, str], what: str) -> None:
    """A catalog name a template fills from a topic, a folder or a routed value (all untrusted)
    must come out as a catalog name with as many parts as the template's own: a value must not
    turn a path into a name (``x:y``), or close its backticked part and open another (``x`.`y``),
    or add a part (``bronze.{folder}`` with folder ``x.y``): each would move the table into a
    schema the template does not name (docs: 'What it never trusts')."""
    pattern = getattr(template, option)
    if pattern is None:
        return
    made = pattern.format_map(values)
    # The template's own shape: its placeholders filled with a value that is one plain part.
    shape = pattern.format_map({k: "x" for k in values})
    if TableRef(shape).is_path:
        return  # a path: the '/' and '..' check above keeps it in the template's folder
    parts, expected = catalog_parts(made), catalog_parts(shape)
    if parts is None or expected is None or len(parts) != len(expected):
        raise ConfigError(
            f"{what} makes the {option} {made!r} ({option}: {pattern!r}), which is not a catalog name of the template's "
            f"{len(expected or [])} part(s): {CATALOG_NAME_FORM}, and a placeholder's value may not add a part. Nothing "
            "was read or written. Rename the topic or folder, or fill the name from parts that are names, e.g. a named "
            "group of topic_pattern, or write the part in backticks: main.bronze.`{topic}`"
        )


def make(config: PipelineConfig, index: int, found: str) -> Made | None:
    """The binding template ``index`` makes for topic or sub-folder ``found`` (None: not its own)."""
    template = config.templates[index]
    if template.source.route_by is not None and routed_values(found)[1] == {}:
        return _make_unrouted(template, index, found)
    values = values_for(template, found)
    if values is None:
        return None
    if template.source.route_by is not None:
        what = f"topic {values['topic']!r} records of " + ", ".join(f"{p}={values[p]!r}" for p in sorted(template.source.route_by))
    else:
        what = f"{'topic' if template.source.format == 'kafka' else 'folder'} {found!r}"
    where = f"templates[{index}]"
    name = template.name_pattern.format_map(values)
    if not _IDENT.match(name):
        raise ConfigError(
            f"{where}: {what} makes the binding name {name!r} (name: {template.name_pattern!r}), which is not letters, "
            "digits and underscores starting with a letter or '_'. Name the bindings from parts that are, e.g. a named "
            "group of topic_pattern: (?P<table>\\w+) with name: '{table}' (docs: 'Binding templates')"
        )
    table = template.table.format_map(values)
    if "/" in "".join(values.values()) or any(v in (".", "..") for v in values.values()):
        raise ConfigError(f"{where}: {what} would make the table {table!r} outside the template's folder; rename it")
    for option in ("table", "dead_letter_table", "view"):
        _check_catalog_name(template, option, values, f"{where}: {what}")
    try:
        binding = BindingConfig.model_validate(template.binding_data(found, values))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'binding'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: the binding made for {what} is invalid: {problems}") from None
    return Made(index, source_id(template, found), binding)


def _found_in(config: PipelineConfig, source: str) -> list[tuple[int, str]]:
    """The templates that could have made a binding from recorded ``source``, with its topic or folder."""
    kind, _, rest = source.partition(":")
    out = []
    for index, template in enumerate(config.templates):
        if kind == "route" and template.source.route_by is not None:
            out.append((index, rest))
        elif kind == "topic" and template.source.format == "kafka" and template.source.route_by is None:
            out.append((index, rest))
        elif kind == "folder" and template.source.folders_in is not None:
            root = template.source.folders_in.rstrip("/") + "/"
            if rest.startswith(root) and "/" not in rest[len(root):]:
                out.append((index, rest[len(root):]))
    return out


def expand(
    config: PipelineConfig,
    found: dict[int, list[str]],
    recorded: dict[str, str] | None = None,
    *,
    dropped: set[str] | frozenset[str] = frozenset(),
    epoch: int = 0,
    routed_topics: dict[int, list[str]] | None = None,
) -> Expansion:
    """The configuration's bindings and those its templates make from ``found`` (per template,
    the topics or sub-folders found) and from ``recorded`` (what epoch ``epoch`` covered).

    ``dropped``: bindings no longer found whose last epoch this process has applied, with
    ``on_missing: drop``: left out. ``routed_topics``: per ``route_by`` template, the topics
    it reads now (:func:`routed_topics`); a routed table of a topic not among them is missing
    (without it: none is). Two bindings on one name or one table are a ConfigError
    naming both topics or folders."""
    recorded = recorded or {}
    made: dict[str, Made] = {}
    names = {b.name: f"binding {b.name!r}" for b in config.bindings}
    tables = {config_identity(b.table): f"binding {b.name!r}" for b in config.bindings}

    def add(item: Made) -> None:
        name, what = item.binding.name, f"{item.source.replace(':', ' ', 1)} (templates[{item.template}])"
        if name in made and made[name].source == item.source:
            return
        if name in names:
            raise ConfigError(
                f"{names[name]} and {what} both make the binding name {name!r}: a name takes one binding. Change the "
                f"template's name (or narrow its pattern) so each topic or folder gets a name of its own"
            )
        identity = config_identity(item.binding.table)
        if identity in tables:
            raise ConfigError(
                f"{tables[identity]} and {what} both make the table {item.binding.table!r}: a table takes one binding, "
                "or the second one's rows would be skipped as already applied. Put a placeholder that tells them apart "
                "in the template's table (or narrow its pattern)"
            )
        names[name] = tables[identity] = what
        made[name] = item

    for index in range(len(config.templates)):
        for name in sorted(found.get(index, [])):
            item = make(config, index, name)
            if item is not None and item.binding.name not in dropped:
                add(item)
    present = set(made)
    missing: dict[str, Made] = {}
    for name, source in sorted(recorded.items()):
        if name in present or name in dropped:
            continue
        candidates = [m for i, f in _found_in(config, source) if (m := make(config, i, f)) is not None and m.binding.name == name]
        if not candidates:
            raise ConfigError(
                f"epoch {epoch} covers binding {name!r}, made from {source.replace(':', ' ', 1)}, and no template makes it "
                "any more: its rows of that epoch could not be applied. Restore the template that made it (its name and "
                "table patterns), run until it is applied, then change the templates"
            )
        add(candidates[0])
        if not source.startswith("route:"):
            missing[name] = candidates[0]
        elif routed_topics is not None and candidates[0].template in routed_topics:
            # A routed table whose records the next epoch does not carry is not missing: its
            # topic is read by the tables found, and the table goes on being covered. One whose
            # topic is gone (or no longer matched) is.
            if routed_values(source.removeprefix("route:"))[0] not in routed_topics[candidates[0].template]:
                missing[name] = candidates[0]
    bindings = [*config.bindings, *(m.binding for m in sorted(made.values(), key=lambda m: m.binding.name))]
    update: dict[str, Any] = {"bindings": bindings, "templates": []}
    expanded = PipelineConfig.model_validate({**{k: getattr(config, k) for k in type(config).model_fields}, **update})
    return Expansion(expanded, made, missing)


def missing_error(expansion: Expansion, epoch: int, config: PipelineConfig) -> SourceError:
    """The run's stop for bindings no longer found whose templates say ``on_missing: fail``."""
    lines = []
    for name, item in sorted(expansion.missing.items()):
        kind, _, what = item.source.partition(":")
        if kind == "route":
            kind, what = "topic", routed_values(what)[0]
        gone = "is gone from the brokers, or topic_pattern no longer matches it" if kind == "topic" else "is gone"
        lines.append(f"binding {name!r} (table {item.binding.table}): {kind} {what!r} {gone}")
    indexes = sorted({item.template for item in expansion.missing.values()})
    return SourceError(
        "no longer found: " + "; ".join(lines) + f". Every committed epoch (up to {epoch}) is applied to its table. "
        "If it was removed on purpose, set `on_missing: drop` on "
        + ", ".join(f"templates[{i}]" for i in indexes)
        + " and run again (its table keeps what it holds); otherwise restore it and run again. Nothing more was read."
    )


def discover(config: PipelineConfig, listings: dict[Any, list[str]] | None = None) -> dict[int, list[str]]:
    """Per template, the topics its pattern matches or the sub-folders of its folder, sorted.
    ``route_by`` templates are not here: the tables of a topic's records are found by reading them
    (the runtime's KafkaRouter), their topics by :func:`routed_topics`. ``listings``: the brokers'
    topics listed so far (shared with :func:`routed_topics`, so one look lists each brokers once)."""
    listings = {} if listings is None else listings
    out: dict[int, list[str]] = {}
    for index, template in enumerate(config.templates):
        source = template.source
        if source.route_by is not None:
            continue
        if source.topic_pattern is not None:
            out[index] = sorted(t for t in _listing(template, index, listings) if values_for(template, t) is not None)
        else:
            out[index] = sub_folders(source.folders_in or "", f"templates[{index}].source.folders_in", follow_links=source.follow_links)
    return out


def routed_topics(config: PipelineConfig, listings: dict[Any, list[str]] | None = None) -> dict[int, list[str]]:
    """Per ``route_by`` template, the topics it reads: its ``topic``, or those its
    ``topic_pattern`` matches now (listed from the brokers; ``listings`` as :func:`discover`), sorted."""
    listings = {} if listings is None else listings
    out: dict[int, list[str]] = {}
    for index, template in enumerate(config.templates):
        source = template.source
        if source.route_by is None:
            continue
        if source.topic_pattern is None:
            out[index] = [source.topic or ""]
        else:
            out[index] = sorted(t for t in _listing(template, index, listings) if topic_values(template, t) is not None)
    return out


def _listing(template: BindingTemplate, index: int, listings: dict[Any, list[str]]) -> list[str]:
    """The topics of ``template``'s brokers, listed once per brokers and client options."""
    source = template.source
    client = (source.bootstrap_servers or "", tuple(sorted(source.client_options.items())))
    if client not in listings:
        listings[client] = list_topics(client[0], dict(client[1]), f"templates[{index}]")
    return listings[client]


def list_topics(bootstrap: str, client_options: dict[str, str], where: str, timeout: float = 30) -> list[str]:
    """Every topic the brokers list (Kafka's own ``__`` topics included: the patterns skip them)."""
    try:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
    except ImportError:
        raise ConfigError(
            "kafka templates list topics with confluent-kafka: pip install 'delta-materializer[kafka]' (or confluent-kafka)"
        ) from None
    try:
        metadata = AdminClient({**client_options, "bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise SourceError(f"{where}: listing the topics failed, the brokers did not answer ({exc}); check bootstrap_servers and client_options") from None
    return sorted(metadata.topics)


def sub_folders(root: str, where: str, *, follow_links: bool = False) -> list[str]:
    """The sub-folders of ``root`` (local, or an S3 prefix: the first part of its keys), without
    hidden ones (``.``, ``_``: Spark's and editors' own). A link to a folder stops the listing (a
    binding would read wherever it points), unless the template's source sets ``follow_links``."""
    path = local_path(root)
    if path is not None:
        try:
            entries = [e for e in os.scandir(path) if e.is_dir() and not e.name.startswith((".", "_"))]
        except FileNotFoundError:
            raise SourceError(f"{where}: the folder {root} does not exist; create it, or fix folders_in") from None
        linked = [e for e in entries if e.is_symlink()]
        if linked and not follow_links:
            shown = ", ".join(f"{e.name} -> {os.readlink(e.path)}" for e in linked[:3])
            raise SourceError(
                f"{where}: {root} holds symbolic link(s) to folders ({shown}); a binding made from one would read "
                "wherever it points, so links are not followed unless the template's source sets follow_links: true "
                "(its files are then read as any folder's: links among them by the same rule). Replace the link with "
                "the folder, or rename it to start with '_'; nothing was read."
            )
        names = [e.name for e in entries]
    else:
        names = list({f.path.split("/", 1)[0] for f in open_store(root).list() if "/" in f.path})
    return sorted(n for n in names if not n.startswith((".", "_")))


def recorded_set(entry: Any) -> dict[str, str]:
    """What a log entry's epoch covered from templates (none: empty)."""
    checkpoint = getattr(entry, "driver_checkpoint", None)
    return dict(checkpoint.templated) if checkpoint is not None else {}
