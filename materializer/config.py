"""Pipeline configuration: a YAML file validated by pydantic before Spark starts.

Relative paths in the file are resolved against the directory the command runs in (like Spark's
own paths); URIs (``s3://``, ``s3a://``, ``dbfs:/``, ``/Volumes/…``) and catalog table names are
kept as they are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from materializer.errors import ConfigError
from materializer.storage import check_uri
from materializer.tables import DELETION_VECTORS, config_identity, retention_problem

DEFAULT_CONFIG = Path("conf/orders-to-delta.yaml")

Strategy = Literal["lastWriteWins", "firstWriteWins", "sum", "min", "max", "merge", "append"]
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VIEW_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
_VIEW_NAME = re.compile(rf"^{_VIEW_PART}(?:\.{_VIEW_PART}){{0,2}}$")


FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
"""A dotted path of a field inside a record's value (``source.table``)."""


def _check_field_paths(paths: dict[str, str], option: str) -> None:
    if not paths:
        raise ValueError(f"{option}: name at least one field")
    for path in paths:
        if not FIELD_PATH.match(path):
            raise ValueError(f"{option}: {path!r} is not a dotted path of field names, e.g. source.table")


class Model(BaseModel):
    """Frozen base: configuration never changes once loaded; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


KAFKA_FIELDS = (
    "bootstrap_servers", "topic", "topics", "starting", "max_records", "payload", "key_from", "options", "client_options",
    "on_data_loss", "unavailable_value", "routed",
)
"""SourceConfig fields that only the kafka format takes."""
KAFKA_RESERVED_OPTIONS = (
    "kafka.bootstrap.servers", "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "failondataloss", "kafka.group.id", "groupidprefix", "kafka.enable.auto.commit",
)
"""Spark Kafka reader options the source sets itself (the epoch's exact range, data-loss handling)."""


class SourceConfig(Model):
    format: Literal["documents", "cdcv2", "kafka"]
    """``documents``: JSON Lines documents; ``cdcv2``: Materialize CDC v2 statements; ``kafka``: a
    Kafka topic's records (see ``payload``)."""
    path: str | None = None
    """documents and cdcv2: folder (or S3 prefix) holding the source's files."""
    schema_: str | None = Field(default=None, alias="schema")
    """documents (and kafka's documents and debezium payloads): the documents' fields as Spark DDL
    (``id BIGINT, name STRING, at TIMESTAMP``); for Debezium events without the schema envelope,
    declared DECIMAL, DATE and BINARY fields are read as Debezium encodes them (docs:
    'Debezium's types').
    Declared, Spark parses with it instead of inferring each epoch's types (one pass fewer), the
    table gets exactly these types, and a document with an undeclared field or a value of another
    JSON kind stops the run naming the file and line. Absent: types are inferred per epoch."""
    max_files: int = Field(default=1000, gt=0)
    """documents only: most files one epoch takes (Auto Loader's maxFilesPerTrigger). An epoch is a
    set of whole files in file-name order, at least one."""
    max_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    """documents: most bytes one epoch takes (maxBytesPerTrigger); a single larger file is still
    taken whole. 512 MiB holds a million documents of up to ~500 bytes. kafka (only when given: it
    costs a pass over the records): most bytes of keys and values one epoch takes, shared among the
    partitions like ``max_records``; at least one record."""
    bootstrap_servers: str | None = None
    """kafka: the brokers, ``host:9092[,host2:9092]`` (Spark's ``kafka.bootstrap.servers``)."""
    topic: str | None = None
    """kafka: the topic to read (or ``topics`` for several)."""
    topics: list[str] | None = Field(default=None, min_length=1)
    """kafka: several topics read as one collection."""
    starting: Any = "earliest"
    """kafka: where a new pipeline starts: ``earliest``, ``latest``, ``{timestamp: <epoch ms>}`` (the
    first record at or after it, per partition), or offsets ``{topic: {partition: offset}}``
    (partitions not listed start at their earliest). Once an epoch is committed the recovery log's
    offsets are the only position used."""
    max_records: int | None = Field(default=None, gt=0)
    """kafka: most records one epoch takes, shared among partitions in proportion to their backlog
    (Spark's maxOffsetsPerTrigger); default ``transaction.max_documents``."""
    payload: Literal["documents", "debezium", "cdcv2"] = "documents"
    """kafka: what a record's value holds: ``documents`` (a JSON document, as the documents source
    reads), ``debezium`` (a Debezium change event, JSON, with or without its schema envelope),
    ``cdcv2`` (one CDC v2 statement, as a line of the cdcv2 format's files)."""
    key_from: Literal["value", "message"] = "value"
    """kafka, documents payload: where the key fields are. ``value``: in the document. ``message``: in
    the record's key, a JSON object of the key fields (``{"id": 17}``, as Kafka Connect's JSON
    converter writes it, with or without its schema envelope), or with one key field any JSON
    scalar or plain text; a record with a null value (a tombstone) then deletes that key."""
    options: dict[str, str] = Field(default_factory=dict)
    """kafka: options handed to Spark's Kafka reader as they are, e.g. security
    (``kafka.security.protocol: SASL_SSL``, ``kafka.sasl.jaas.config: …``).
    ``kafka.isolation.level`` is ``read_committed`` unless set to ``read_uncommitted`` here (then
    records of aborted and open transactions are read too: not exactly once)."""
    client_options: dict[str, str] = Field(default_factory=dict)
    """kafka: librdkafka settings of the driver's offset look-ups (the Python admin client), e.g.
    ``security.protocol``, ``sasl.mechanism``, ``sasl.username``; ``bootstrap.servers`` is set."""
    unavailable_value: str = Field(default="__debezium_unavailable_value", min_length=1)
    """kafka, debezium payload: the placeholder Debezium writes for a value it does not have (an
    unchanged TOASTed Postgres column; the connector's ``unavailable.value.placeholder``). A field
    holding it (as text, base64 bytes, or an array of it) keeps the table's stored value."""
    on_data_loss: Literal["fail", "skip"] = "fail"
    """kafka: records the pipeline had not read that the broker no longer has (retention, deleted
    records). ``fail`` stops the run naming the partition and offsets; ``skip`` goes on from the
    earliest offset still there and logs a warning naming what was lost."""

    routed: dict[str, str] | None = None
    """kafka, documents and debezium payloads: only the records whose fields hold these values
    (``{source.table: orders}``: a dotted path into the record's value, Debezium's ``payload``
    envelope unwrapped), the others passed over. Set by a template's ``route_by`` on the bindings
    it makes (docs: 'One topic, many tables'); a binding may set it by hand too. A record without
    the field is not this binding's (a Debezium tombstone, say)."""

    @property
    def schema_ddl(self) -> str | None:
        return self.schema_

    @property
    def kafka_max_bytes(self) -> int | None:
        """kafka: the byte bound per epoch, if one was given (the default is the documents format's)."""
        return self.max_bytes if "max_bytes" in self.model_fields_set else None

    @property
    def topic_names(self) -> list[str]:
        """kafka: the topics read, in order."""
        return [self.topic] if self.topic is not None else list(self.topics or [])

    @model_validator(mode="after")
    def _schema_only_for_documents(self) -> "SourceConfig":
        documents_like = self.format == "documents" or (self.format == "kafka" and self.payload in ("documents", "debezium"))
        if self.schema_ is not None and not documents_like:
            raise ValueError("schema is only for documents (the documents format, or kafka's documents and debezium payloads)")
        defaults = SourceConfig.model_fields
        byte_bound = self.format == "documents" or (self.format == "kafka" and self.payload != "cdcv2")
        if (self.format != "documents" and self.max_files != defaults["max_files"].default) or (
            not byte_bound and self.max_bytes != defaults["max_bytes"].default
        ):
            raise ValueError(
                "max_files is only for the documents format, max_bytes for documents and kafka (cdcv2 and kafka's "
                "cdcv2 payload take whole complete times, up to transaction.max_documents)"
            )
        if self.schema_ is not None and not self.schema_.strip():
            raise ValueError("schema is empty: give the documents' fields as Spark DDL, or leave it out")
        return self

    @model_validator(mode="after")
    def _kafka_fields(self) -> "SourceConfig":
        if self.format != "kafka":
            given = [name for name in KAFKA_FIELDS if name in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: only for the kafka format (this source is {self.format})")
            if self.path is None:
                raise ValueError(f"path is required for the {self.format} format: the folder (or S3 prefix) of its files")
            return self
        if self.path is not None:
            raise ValueError("path is not for the kafka format: give bootstrap_servers and topic (or topics)")
        if not self.bootstrap_servers:
            raise ValueError("bootstrap_servers is required for the kafka format, e.g. 'broker1:9092,broker2:9092'")
        if (self.topic is None) == (self.topics is None):
            raise ValueError("give exactly one of topic (one topic) or topics (a list)")
        names = self.topic_names
        if len(set(names)) != len(names) or any(not n for n in names):
            raise ValueError(f"topics must be distinct, non-empty names: {names}")
        if self.payload == "cdcv2" and self.max_records is not None:
            raise ValueError(
                "max_records is not for payload cdcv2: an epoch reads every statement still needed (a time's "
                "statements may be anywhere in the topic) and takes whole complete times up to transaction.max_documents"
            )
        if "unavailable_value" in self.model_fields_set and self.payload != "debezium":
            raise ValueError("unavailable_value is for payload debezium (Debezium's placeholder of a value it does not have)")
        if self.key_from == "message" and self.payload != "documents":
            raise ValueError("key_from: message is for payload documents (Debezium events carry their keys in before/after)")
        if self.routed is not None:
            if self.payload not in ("documents", "debezium") or self.key_from == "message":
                raise ValueError(
                    "routed (and a template's route_by) is for payloads documents and debezium with the key in the value: "
                    "a tombstone of key_from: message names no table, so it could not be routed"
                )
            _check_field_paths(self.routed, "routed")
        _check_starting(self.starting, names)
        for key, value in self.options.items():
            if key.lower() == "kafka.isolation.level" and value.strip().lower() not in ("read_committed", "read_uncommitted"):
                raise ValueError(
                    f"options.{key}: {value!r} is not an isolation level: read_committed (the default: records of "
                    "committed transactions only) or read_uncommitted (not exactly once for transactional producers)"
                )
            if key.lower() in KAFKA_RESERVED_OPTIONS:
                raise ValueError(
                    f"options.{key}: the kafka source sets this itself (the epoch's exact offsets, data-loss checks); "
                    "use bootstrap_servers, topic(s), starting and on_data_loss instead"
                )
        return self


def _check_starting(starting: Any, topics: list[str]) -> None:
    """``earliest``, ``latest``, ``{timestamp: ms}`` or ``{topic: {partition: offset}}``."""
    if starting in ("earliest", "latest"):
        return
    hint = "starting must be 'earliest', 'latest', {timestamp: <epoch milliseconds>} or {<topic>: {<partition>: <offset>}}"
    if not isinstance(starting, dict) or not starting:
        raise ValueError(f"{hint}; found {starting!r}")
    if set(starting) == {"timestamp"}:
        if not isinstance(starting["timestamp"], int) or isinstance(starting["timestamp"], bool) or starting["timestamp"] < 0:
            raise ValueError(f"{hint}; the timestamp must be a whole number of milliseconds, found {starting['timestamp']!r}")
        return
    for topic, offsets in starting.items():
        if topic not in topics:
            raise ValueError(f"{hint}; {topic!r} is not one of the source's topics {topics}")
        if not isinstance(offsets, dict):
            raise ValueError(f"{hint}; starting.{topic} must map partitions to offsets")
        for partition, offset in offsets.items():
            if not str(partition).isdigit() or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"{hint}; starting.{topic}: partition {partition!r} -> {offset!r} is not a partition number and an offset >= 0")


class BindingConfig(Model):
    name: str
    """Name of the binding, unique in the pipeline; used in staged file names and log entries."""
    source: SourceConfig
    """Where the collection's changes come from."""
    table: str
    """Delta table: a path, an ``s3a://`` URI, or a catalog name ``catalog.schema.table``."""
    key: list[str] = Field(min_length=1)
    """Key fields: one row per key in standard mode."""
    mode: Literal["standard", "delta_updates", "scd2"] = "standard"
    """``standard``: fully reduced rows, MERGE by key; ``delta_updates``: append per-epoch combines;
    ``scd2``: every version of a key kept, with ``__start_at`` / ``__end_at`` / ``__current``
    (docs: 'Change semantics')."""
    reductions: dict[str, Strategy] = Field(default_factory=dict)
    """Per-field reduction strategy; fields not listed are lastWriteWins."""
    previous_names: list[str] = Field(default_factory=list)
    """Names this binding had before (a rename): its recovery-log state and the table's commits
    tagged with an old name are taken over, so the source is not read again from the start."""
    sequence_by: list[str] = Field(default_factory=list)
    """Fields that order the changes of a key, compared in the order given (dotted paths, e.g.
    ``updated_at`` or ``_meta.source.lsn``; ``_meta`` paths order but never land in the table).
    The highest sequence wins, within an epoch and across epochs (a late, older change is
    ignored, in the MERGE); ties go by file order. Deletes leave a tombstone row
    (``__deleted``); the table keeps the sequence in ``__sequence``."""
    columns: list[str] | None = None
    """Only these top-level fields land in the table (the key fields always do)."""
    except_columns: list[str] = Field(default_factory=list)
    """These top-level fields never land in the table."""
    ignore_null_updates: bool = False
    """A NULL (or missing) field in a change keeps the stored value instead of overwriting it."""
    delete_when: str | None = None
    """A Spark SQL condition over a document's fields that makes it a delete (as ``_meta.op: d``
    does), e.g. ``"op = 'DELETE'"``."""
    soft_delete: bool = False
    """Deletes mark the row (``__deleted = true``, ``__deleted_at`` = the time of the apply)
    instead of removing it; a later upsert of the key clears the mark."""
    track_history: list[str] | None = None
    """``mode: scd2``: only a change of these fields opens a new version; a change of the others
    updates the current version in place."""
    track_history_except: list[str] = Field(default_factory=list)
    """``mode: scd2``: a change of only these fields updates the current version in place."""
    adopt_table: bool = False
    """Write to a table that holds commits of another pipeline, another binding, or another
    writer's Delta transaction ids. Off, such a table stops the run (exit 7) before anything is
    written; on, the table is written on top of what it holds (docs: 'Sharing or taking over a
    table')."""
    partition_by: list[str] = Field(default_factory=list)
    """Columns to partition the table by, applied when the materializer creates it (docs:
    'Table layout'). Not with ``cluster_by``."""
    cluster_by: list[str] = Field(default_factory=list)
    """Columns to cluster the table by (Delta liquid clustering), applied at creation."""
    properties: dict[str, str] = Field(default_factory=dict)
    """Table properties set at creation (``delta.enableChangeDataFeed: true``, ``owner: team``);
    ``delta.setTransactionRetentionDuration`` is refused (expired txn ids break exactly-once)."""
    deletion_vectors: bool = True
    """Create the table with deletion vectors, so a MERGE marks replaced rows instead of rewriting
    whole files (an epoch costs what it touches). ``false`` for readers that cannot read them."""
    on_invalid: Literal["fail", "dead_letter"] = "fail"
    """A document that fails the checks: ``fail`` stops the run naming file and line (nothing of
    the epoch is committed); ``dead_letter`` commits the epoch without it and writes it, with its
    file, line and reason, to ``dead_letter_table`` under the epoch's txn id (documents and cdcv2
    sources; kafka's payloads, with the record's topic, partition, offset, timestamp, key and
    value). For CDC v2 only a malformed statement is a dead letter; input whose statements
    contradict each other still stops the run (docs: 'The cdcv2 source')."""
    dead_letter_table: str | None = None
    """With ``on_invalid: dead_letter``: the dead-letter Delta table (default: the table's path or
    name with ``_dead_letters`` appended)."""

    view: str | None = None
    """A catalog name (``catalog.schema.view``, ``schema.view`` or ``view``) for a view of the
    table's live rows, created or replaced with the table: no tombstones (``__deleted``), the
    ``__current`` versions for ``mode: scd2``, no ``__`` columns (docs: 'Live-row views'). With the
    embedded local Spark the catalog lives as long as the run; point Spark at a metastore (or run
    on Databricks) to keep it."""
    view_internal_columns: bool = False
    """With ``view``: the view keeps the materializer's ``__`` columns (``__sequence``,
    ``__start_at``, ...) too."""

    @property
    def dead_letters(self) -> str | None:
        """The dead-letter table, when this binding has one."""
        if self.on_invalid != "dead_letter":
            return None
        return self.dead_letter_table or self.table.rstrip("/") + "_dead_letters"

    @field_validator("properties", mode="before")
    @classmethod
    def _properties_as_text(cls, value: Any) -> Any:
        # YAML reads `true` and `5` as a bool and an int; Delta's properties are text.
        if isinstance(value, dict):
            return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _layout(self) -> "BindingConfig":
        if self.partition_by and self.cluster_by:
            raise ValueError("partition_by and cluster_by cannot both be given: Delta clusters or partitions a table, not both")
        for option, columns in (("partition_by", self.partition_by), ("cluster_by", self.cluster_by)):
            if len({c.lower() for c in columns}) != len(columns) or any(not c for c in columns):
                raise ValueError(f"{option}: columns must be distinct, non-empty names: {columns}")
        problem = retention_problem(dict(self.properties))
        if problem:
            raise ValueError(f"properties: {problem}. Remove it")
        if self.dead_letter_table is not None and self.on_invalid != "dead_letter":
            raise ValueError("dead_letter_table is for on_invalid: dead_letter")
        if self.view is not None:
            if not _VIEW_NAME.match(self.view):
                raise ValueError(
                    f"view: {self.view!r} is not a catalog name: give `view`, `schema.view` or `catalog.schema.view` "
                    "(letters, digits and underscores, or a part in backticks); a path table's live rows are a query "
                    "(docs: 'Live-row views')"
                )
            if self.view.replace("`", "").lower() == self.table.replace("`", "").lower():
                raise ValueError(f"view: {self.view!r} is the table's own name; give the view a name of its own")
        elif self.view_internal_columns:
            raise ValueError("view_internal_columns is for a binding with a `view`")
        if any(k.lower() == DELETION_VECTORS.lower() for k in self.properties):
            raise ValueError(f"properties: set {DELETION_VECTORS} with `deletion_vectors: true|false` on the binding")
        return self

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        if not _IDENT.match(value):
            raise ValueError("must be letters, digits and underscores, not starting with a digit")
        return value

    @field_validator("key")
    @classmethod
    def _keys_are_unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"key fields repeat: {value}")
        for field in value:
            if field.startswith("_"):
                raise ValueError(f"key field {field!r} starts with '_', which is reserved")
        return value

    @model_validator(mode="after")
    def _reductions_not_on_key(self) -> "BindingConfig":
        for field in self.reductions:
            if field in self.key:
                raise ValueError(f"reductions: {field!r} is a key field and cannot be reduced")
        for old in self.previous_names:
            if not _IDENT.match(old):
                raise ValueError(f"previous_names: {old!r} is not a binding name (letters, digits, underscores)")
            if old == self.name:
                raise ValueError(f"previous_names: {old!r} is the binding's own name")
        return self

    @model_validator(mode="after")
    def _change_semantics(self) -> "BindingConfig":
        """Sequencing, column control and history: combinations that are built, paths that parse."""
        for path in self.sequence_by:
            parts = path.split(".")
            if not all(_IDENT.match(p) for p in parts):
                raise ValueError(
                    f"sequence_by: {path!r} is not a dotted field path (letters, digits, underscores, e.g. 'updated_at' "
                    "or '_meta.source.lsn')"
                )
            if parts[0] == "_meta" and len(parts) < 2:
                raise ValueError("sequence_by: '_meta' is not a field: name one inside it, e.g. '_meta.source.lsn'")
            if parts[0] in ("_op", "_seq"):
                raise ValueError(f"sequence_by: {path!r} is reserved by the materializer")
        if len(set(self.sequence_by)) != len(self.sequence_by):
            raise ValueError(f"sequence_by: fields repeat: {self.sequence_by}")
        if self.columns is not None and self.except_columns:
            raise ValueError("give columns (what lands) or except_columns (what does not), not both")
        for field in self.except_columns:
            if field in self.key:
                raise ValueError(f"except_columns: {field!r} is a key field, and key fields always land")
        controlled = bool(
            self.sequence_by or self.columns is not None or self.except_columns or self.ignore_null_updates
            or self.delete_when or self.soft_delete
        )
        if self.mode == "delta_updates" and controlled:
            raise ValueError(
                "sequence_by, columns, except_columns, ignore_null_updates, delete_when and soft_delete are for "
                "mode standard or scd2 (delta_updates appends every epoch's changes as they are)"
            )
        if (controlled or self.mode == "scd2" or self.placeholders_kept) and any(s != "lastWriteWins" for s in self.reductions.values()):
            raise ValueError(
                "reductions other than lastWriteWins do not combine with sequence_by, column control, soft deletes, "
                "mode scd2 or Debezium events yet: a change is the whole latest row there (docs: 'Change semantics')"
            )
        if self.mode != "scd2" and (self.track_history is not None or self.track_history_except):
            raise ValueError("track_history and track_history_except are for mode scd2")
        if self.track_history is not None and self.track_history_except:
            raise ValueError("give track_history or track_history_except, not both")
        if self.mode == "scd2" and self.soft_delete:
            raise ValueError("soft_delete is for mode standard: in mode scd2 a delete closes the current version")
        if self.mode == "scd2" and self.ignore_null_updates:
            raise ValueError("ignore_null_updates is for mode standard (not built for scd2 yet)")
        if self.source.format == "cdcv2" and (self.sequence_by or self.mode == "scd2"):
            raise ValueError("sequence_by and mode scd2 are for documents sources (CDC v2 statements carry their own times)")
        return self

    @property
    def change_controlled(self) -> bool:
        """Rows go through :mod:`materializer.changes` (sequence, tombstones, column control, history)."""
        return self.options_controlled or self.placeholders_kept

    @property
    def options_controlled(self) -> bool:
        """The binding's own options (not its source) ask for :mod:`materializer.changes`."""
        return bool(
            self.sequence_by or self.columns is not None or self.except_columns or self.ignore_null_updates
            or self.delete_when or self.soft_delete or self.mode == "scd2"
        )

    @property
    def placeholders_kept(self) -> bool:
        """Debezium events in standard mode: a placeholder keeps the stored value (changes.UNAVAILABLE)."""
        return self.mode == "standard" and self.source.format == "kafka" and self.source.payload == "debezium"

    @property
    def needs_loads(self) -> bool:
        """Standard mode needs the current rows only when some field is not lastWriteWins."""
        return self.mode == "standard" and any(
            strategy != "lastWriteWins" for strategy in self.reductions.values()
        )


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
    """kafka, with ``topic``: one binding per value of fields of each record, e.g. ``{schema:
    source.schema, table: source.table}`` for Debezium events of several tables in one topic
    (placeholder -> dotted path into the value, Debezium's ``payload`` envelope unwrapped). A value
    first seen in an epoch is a binding from that epoch on; every record must hold the fields
    (docs: 'One topic, many tables')."""

    @model_validator(mode="after")
    def _kafka_fields(self) -> "TemplateSourceConfig":
        # Replaces SourceConfig's check: a template names its topics or folders by pattern.
        if self.route_by is not None:
            if self.format != "kafka" or self.topic is None or self.topic_pattern is not None or self.folders_in is not None:
                raise ValueError(
                    "route_by is for a kafka template of one topic: give topic (the topic carrying several tables), "
                    "not topic_pattern, topics or folders_in"
                )
            _check_field_paths({path: "" for path in self.route_by.values()}, "route_by")
            for placeholder in self.route_by:
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", placeholder) or placeholder == "topic":
                    raise ValueError(f"route_by: {placeholder!r} is not a placeholder name (letters, digits, '_'; not 'topic')")
            try:
                SourceConfig.model_validate(self.concrete(routed_found(self.topic, {k: "example" for k in self.route_by})))
            except ValidationError as exc:
                raise ValueError("; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())) from None
            return self
        if self.format == "kafka":
            if self.topic_pattern is None or self.topic is not None or self.topics is not None or self.folders_in is not None:
                raise ValueError(
                    "a kafka template takes topic_pattern (a regular expression of topic names), not topic, topics or folders_in"
                )
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern: {self.topic_pattern!r} is not a regular expression: {exc}") from None
            if isinstance(self.starting, dict) and set(self.starting) != {"timestamp"}:
                raise ValueError(
                    "starting: offsets per topic are not for a template (its topics are not known yet): give earliest, "
                    "latest or {timestamp: <epoch ms>}"
                )
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

    @property
    def placeholders(self) -> set[str]:
        """The placeholders a binding made from this source fills."""
        if self.route_by is not None:
            return {"topic", *self.route_by}
        if self.topic_pattern is not None:
            return {"topic", *re.compile(self.topic_pattern).groupindex}
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
                found = routed_found(self.source.topic or "", {k: "example" for k in self.source.route_by})
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
    def name_pattern(self) -> str:
        return self.name if self.name is not None else ("{topic}" if self.source.format == "kafka" else "{folder}")


class TransactionConfig(Model):
    max_documents: int = Field(default=100_000, gt=0)
    """cdcv2: largest number of CDC updates one binding contributes to an epoch. The documents
    source takes whole files instead, bounded by its ``source.max_files`` / ``source.max_bytes``."""
    poll_interval_seconds: float = Field(default=2.0, gt=0)
    """With ``--follow``: how long to wait before looking for new input again."""
    pipelined: bool = True
    """Apply epoch N in the background while epoch N+1 is read and combined (seed 000's
    pipelining). ``false`` applies first, then reads: slower, one thing at a time."""
    parallel_bindings: int = Field(default=1, ge=1, le=64)
    """How many of an epoch's bindings are staged, checked and applied at once (threads on the one
    Spark cluster, each apply in a SparkSession of its own, each in a FAIR scheduler pool of its own
    so a big binding does not starve the small ones). ``1`` (the default) does them one after
    another, in binding order: on two cores side by side saved 14 % of an epoch's wall time and no
    CPU, so raise it where the cluster has cores to spare. Every table still gets its epoch once: the epoch is acknowledged only when every
    binding's table is applied, and a failure in one binding stops the epoch, naming it, after the
    others in flight have finished (docs: 'Many bindings')."""


class SparkConfig(Model):
    master: str = "local[*]"
    """Spark master; ignored when a SparkSession already exists (Databricks)."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Extra Spark configuration."""
    remote: str | None = None
    """A Spark Connect server to run on (``sc://host:15002``) instead of a local or cluster master;
    ``--remote`` on the command line overrides it. Local staging and log folders must then be
    paths the server sees too (the same machine, or a shared volume)."""

    @field_validator("remote")
    @classmethod
    def _remote_is_connect_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("sc://"):
            raise ValueError(f"{value!r} is not a Spark Connect URL: expected sc://host:port")
        return value


class PipelineConfig(Model):
    pipeline_id: str
    """Names the pipeline; Delta's txnAppId of every commit it makes."""
    recovery_log: str
    """Folder or ``s3://`` prefix of the recovery log."""
    staging: str
    """Folder or ``s3://`` prefix where staged files live until applied."""
    bindings: list[BindingConfig] = Field(default_factory=list)
    """Source collections and their Delta tables; they share the pipeline's epochs."""
    templates: list[BindingTemplate] = Field(default_factory=list)
    """Binding templates: each makes one binding per Kafka topic its pattern matches, or per
    sub-folder of its folder, found when a run opens and again at every epoch boundary; which
    bindings an epoch covers is recorded with it (docs: 'Binding templates')."""
    transaction: TransactionConfig = Field(default_factory=TransactionConfig)
    """How much one transaction takes."""
    spark: SparkConfig = Field(default_factory=SparkConfig)
    """Spark session settings for the embedded and cluster runs."""
    log_retention: int = Field(default=10, ge=2)
    """How many committed log entries are kept; older ones are compacted away."""

    @field_validator("pipeline_id")
    @classmethod
    def _pipeline_id_shape(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", value):
            raise ValueError("must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @model_validator(mode="after")
    def _something_to_do(self) -> "PipelineConfig":
        if not self.bindings and not self.templates:
            raise ValueError("bindings: give at least one binding (or a binding template under templates)")
        return self

    @model_validator(mode="after")
    def _stores_supported(self) -> "PipelineConfig":
        # Files the materializer itself reads or writes (not tables: Spark reaches those).
        try:
            check_uri(self.recovery_log, "recovery_log")
            check_uri(self.staging, "staging")
            for binding in self.bindings:
                if binding.source.path is not None:  # a kafka source has no path
                    check_uri(binding.source.path, f"bindings[{binding.name}].source.path")
            for i, template in enumerate(self.templates):
                if template.source.folders_in is not None:
                    check_uri(template.source.folders_in, f"templates[{i}].source.folders_in")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None  # reported with the file's name, as every field error
        return self

    @model_validator(mode="after")
    def _bindings_distinct(self) -> "PipelineConfig":
        names = [b.name for b in self.bindings]
        for old in (n for b in self.bindings for n in b.previous_names):
            names.append(old)
        seen = {v for v in names if names.count(v) > 1}
        if seen:
            raise ValueError(f"two bindings share the name {sorted(seen)[0]!r} (names and previous_names)")
        # Two spellings of one path (relative/absolute, ./, a trailing slash, s3a:// vs s3://) are
        # one table: the second binding's MERGE would carry the same txn id and be skipped.
        # Catalog names are resolved at Open, when Spark can tell where they live.
        identities: dict[str, str] = {}
        for b in self.bindings:
            identity = config_identity(b.table)
            if identity in identities:
                raise ValueError(
                    f"bindings {identities[identity]!r} and {b.name!r} share the table {identity} (however spelled); "
                    "a table takes one binding: give each its own table"
                )
            identities[identity] = b.name
        return self

    @property
    def staging_root(self) -> str:
        """This pipeline's own area of the staging store: ``<staging>/<pipeline_id>``.

        Two pipelines given one ``staging`` folder thus never list, let alone delete, each
        other's staged files or spools (DESIGN invariant 10)."""
        return self.staging.rstrip("/") + "/" + self.pipeline_id

    def binding(self, name: str) -> BindingConfig:
        for binding in self.bindings:
            if binding.name == name:
                return binding
        raise KeyError(name)


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
