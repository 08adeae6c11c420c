"""Pipeline configuration: a YAML file validated by pydantic before Spark starts.

Relative paths in the file are resolved against the directory the command runs in (like Spark's
own paths); URIs (``s3://``, ``s3a://``, ``dbfs:/``, ``/Volumes/…``) and catalog table names are
kept as they are.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from materializer.errors import ConfigError

DEFAULT_CONFIG = Path("conf/orders-to-delta.yaml")

Strategy = Literal["lastWriteWins", "firstWriteWins", "sum", "min", "max", "merge", "append"]
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Model(BaseModel):
    """Frozen base: configuration never changes once loaded; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceConfig(Model):
    format: Literal["documents", "cdcv2"]
    """``documents``: JSON Lines documents; ``cdcv2``: Materialize CDC v2 statements."""
    path: str
    """Folder (or S3 prefix) holding the source's files."""
    schema_: str | None = Field(default=None, alias="schema")
    """documents only: the documents' fields as Spark DDL (``id BIGINT, name STRING, at TIMESTAMP``).
    Declared, Spark parses with it instead of inferring each epoch's types (one pass fewer), the
    table gets exactly these types, and a document with an undeclared field or a value of another
    JSON kind stops the run naming the file and line. Absent: types are inferred per epoch."""

    @property
    def schema_ddl(self) -> str | None:
        return self.schema_

    @model_validator(mode="after")
    def _schema_only_for_documents(self) -> "SourceConfig":
        if self.schema_ is not None and self.format != "documents":
            raise ValueError("schema is only for the documents format (cdcv2 updates carry their own types)")
        if self.schema_ is not None and not self.schema_.strip():
            raise ValueError("schema is empty: give the documents' fields as Spark DDL, or leave it out")
        return self


class BindingConfig(Model):
    name: str
    """Name of the binding, unique in the pipeline; used in staged file names and log entries."""
    source: SourceConfig
    """Where the collection's changes come from."""
    table: str
    """Delta table: a path, an ``s3a://`` URI, or a catalog name ``catalog.schema.table``."""
    key: list[str] = Field(min_length=1)
    """Key fields: one row per key in standard mode."""
    mode: Literal["standard", "delta_updates"] = "standard"
    """``standard``: fully reduced rows, MERGE by key; ``delta_updates``: append per-epoch combines."""
    reductions: dict[str, Strategy] = Field(default_factory=dict)
    """Per-field reduction strategy; fields not listed are lastWriteWins."""

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
        return self

    @property
    def needs_loads(self) -> bool:
        """Standard mode needs the current rows only when some field is not lastWriteWins."""
        return self.mode == "standard" and any(
            strategy != "lastWriteWins" for strategy in self.reductions.values()
        )


class TransactionConfig(Model):
    max_documents: int = Field(default=100_000, gt=0)
    """Largest number of source documents (or CDC updates) one binding contributes to an epoch."""
    poll_interval_seconds: float = Field(default=2.0, gt=0)
    """With ``--follow``: how long to wait before looking for new input again."""
    pipelined: bool = True
    """Apply epoch N in the background while epoch N+1 is read and combined (seed 000's
    pipelining). ``false`` applies first, then reads: slower, one thing at a time."""


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
    bindings: list[BindingConfig] = Field(min_length=1)
    """Source collections and their Delta tables; they share the pipeline's epochs."""
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
    def _stores_supported(self) -> "PipelineConfig":
        # Files the materializer itself reads or writes (not tables: Spark reaches those).
        from materializer.storage import check_uri

        try:
            check_uri(self.recovery_log, "recovery_log")
            check_uri(self.staging, "staging")
            for binding in self.bindings:
                check_uri(binding.source.path, f"bindings[{binding.name}].source.path")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None  # reported with the file's name, as every field error
        return self

    @model_validator(mode="after")
    def _bindings_distinct(self) -> "PipelineConfig":
        names = [b.name for b in self.bindings]
        tables = [b.table for b in self.bindings]
        for what, values in (("name", names), ("table", tables)):
            seen = {v for v in values if values.count(v) > 1}
            if seen:
                raise ValueError(f"two bindings share the {what} {sorted(seen)[0]!r}")
        return self

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
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))
