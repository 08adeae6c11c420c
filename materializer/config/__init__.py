"""Pipeline configuration: a YAML file validated by pydantic before Spark starts.

Relative paths in the file are resolved against the directory the command runs in (like Spark's
own paths); URIs (``s3://``, ``s3a://``, ``dbfs:/``, ``/Volumes/…``) and catalog table names are
kept as they are.

The package, one section a module (each imports only those listed after it):

* :mod:`~materializer.config.load`: the file read and validated (``load_config``, ``parse_config``);
* :mod:`~materializer.config.pipeline`: the pipeline, its transaction and Spark settings;
* :mod:`~materializer.config.templates`: binding templates and their sources;
* :mod:`~materializer.config.binding`: a binding (mode, change semantics, layout, dead letters, view);
* :mod:`~materializer.config.source`: a binding's source (files formats, Kafka);
* :mod:`~materializer.config.base`: the frozen base model and the field-path rule;
* :mod:`~materializer.config.secrets`: ``${env:…}``, ``${file:…}``, ``${secret:…}`` references resolved.

Every name other modules, the CLI, the tools, tests and docs import is re-exported here.
"""

from __future__ import annotations

from materializer.config.base import FIELD_PATH, Model, check_field_paths
from materializer.config.binding import BindingConfig, Strategy
from materializer.config.load import DEFAULT_CONFIG, load_config, parse_config
from materializer.config.pipeline import PipelineConfig, SparkConfig, TransactionConfig
from materializer.config.secrets import SecretScopes, resolve_references, unresolve, use_secret_scopes
from materializer.config.source import KAFKA_FIELDS, KAFKA_RESERVED_OPTIONS, SourceConfig
from materializer.config.templates import (
    PLACEHOLDER,
    BindingTemplate,
    TemplateSourceConfig,
    routed_found,
    routed_values,
)

__all__ = [
    "DEFAULT_CONFIG",
    "FIELD_PATH",
    "KAFKA_FIELDS",
    "KAFKA_RESERVED_OPTIONS",
    "PLACEHOLDER",
    "BindingConfig",
    "BindingTemplate",
    "Model",
    "PipelineConfig",
    "SecretScopes",
    "SourceConfig",
    "SparkConfig",
    "Strategy",
    "TemplateSourceConfig",
    "TransactionConfig",
    "check_field_paths",
    "load_config",
    "parse_config",
    "resolve_references",
    "routed_found",
    "routed_values",
    "unresolve",
    "use_secret_scopes",
]
