"""A binding's source: the files formats and the Kafka topic, each option checked against its format."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from materializer.config.base import Model, check_field_paths


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
    follow_links: bool = False
    """documents and cdcv2, local folders: read the symbolic links in the folder whose targets are
    files (by the link's name). Without it a link the source would read stops the run, naming it and
    its target (a link can point anywhere this process can read). A link to a folder or to nothing
    stops the run either way: a linked folder is never walked into. A template's ``folders_in``: a
    linked sub-folder is made a binding only with it (docs: 'Symbolic links')."""
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
    unrouted: list[str] | None = None
    """kafka, documents and debezium payloads: only the records that lack one of these fields
    (dotted paths into the value, as ``routed``; a Debezium tombstone is not one), each of them a
    dead letter: it names no table. Set by a ``route_by`` template with ``on_invalid:
    dead_letter`` on the binding it makes for such records (docs: 'One topic, many tables')."""

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
        if self.format == "kafka" and self.follow_links:
            raise ValueError("follow_links is for the documents and cdcv2 formats (folders of files), not kafka")
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
            check_field_paths(self.routed, "routed")
        if self.unrouted is not None:
            if self.routed is not None or self.payload not in ("documents", "debezium") or self.key_from == "message" or not self.unrouted:
                raise ValueError("unrouted is for payloads documents and debezium with the key in the value, without routed, naming one field or more")
            check_field_paths({path: "" for path in self.unrouted}, "unrouted")
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
