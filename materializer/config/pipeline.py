"""The pipeline: its stores, bindings and templates, transaction and Spark settings, checked as a whole."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from materializer import redact
from materializer.config.base import Model
from materializer.config.binding import BindingConfig
from materializer.config.templates import BindingTemplate
from materializer.errors import ConfigError
from materializer.storage import check_uri
from materializer.tables import config_identity


class TransactionConfig(Model):
    max_documents: int = Field(default=100_000, gt=0)
    """cdcv2: largest number of CDC updates one binding contributes to an epoch. The documents
    source takes whole files instead, bounded by its ``source.max_files`` / ``source.max_bytes``."""
    poll_interval_seconds: float = Field(default=2.0, gt=0)
    """With ``--follow``: how long to wait before looking for new input again."""
    pipelined: bool = True
    """Apply epoch N in the background while epoch N+1 is read and combined (seed 000's
    pipelining). ``false`` applies first, then reads: slower, one thing at a time."""
    parallel_bindings: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = "auto"
    """How many of an epoch's bindings are staged, checked and applied at once (threads on the one
    Spark cluster, each apply in a SparkSession of its own, each in a FAIR scheduler pool of its own
    so a big binding does not starve the small ones). ``auto`` (the default): half the cores of the
    driver's machine (the applies' planning and Delta's commits are the driver's work), at least 1
    and at most 8; 1 over Spark Connect, whose server's cores the client cannot see. On two cores
    that is 1, one after another in binding order: there side by side saved 14 % of an epoch's wall
    time and no CPU. Every table still gets its epoch once: the epoch is acknowledged only when every
    binding's table is applied, and a failure in one binding stops the epoch, naming it, after the
    others in flight have finished (docs: 'Many bindings')."""
    copy_on_write_below_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    """A MERGE into a table whose data files hold fewer bytes than this rewrites the files it
    touches instead of writing deletion vectors (Delta's default when the table has them on): on
    small tables the deletion vectors' extra Spark jobs cost more than the rewrite (measured in
    docs: 'Small epochs'). Same rows either way. ``0`` always writes deletion vectors. Needs the
    table's size before the MERGE, read from its Delta log by delta-rs: where that is not possible
    (a catalog table, a Spark Connect server's own path), Delta's default applies."""
    interpreted_below_bytes: int = Field(default=2 * 1024 * 1024, ge=0)
    """An apply whose table's data files and staged rows together hold fewer bytes than this runs
    its MERGE (and a dead-letter table's append of fewer staged bytes) without adaptive re-planning
    and without generated code (interpreted): on a few thousand rows, compiling the generated code
    is most of a query's CPU. A one-row MERGE into a table of 1,000 rows cost 1.57 JVM CPU s
    instead of 2.31, into one of 300,000 rows (16 MB) 2.29 instead of 2.14 (measured in docs:
    'Small epochs'). Same rows either way. ``0``: Spark's defaults always. Needs the table's size,
    as ``copy_on_write_below_bytes`` does."""


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
            # Shown redacted: a URL can carry its ;token=… (docs: 'Secrets').
            raise ValueError(f"{redact.text(value)!r} is not a Spark Connect URL: expected sc://host:port")
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
