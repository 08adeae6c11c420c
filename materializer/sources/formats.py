"""The source that reads a binding's format: the one module that knows every source.

The sources import their interface (:mod:`materializer.sources`), never this module, so none of
them reaches another through it (the import contract "sources are independent", pyproject.toml).
Each source is imported when a binding needs it: a files-only pipeline never loads the Kafka code.
"""

from __future__ import annotations

from materializer.config import BindingConfig
from materializer.sources import Source
from materializer.storage import Store


def open_source(binding: BindingConfig, spool: Store) -> Source:
    """A reader of ``binding``'s source (its ``format``, and for kafka its ``payload``), spooling to ``spool``."""
    if binding.source.format == "documents":
        from materializer.sources.documents.source import DocumentsSource

        return DocumentsSource(binding, spool)
    if binding.source.format == "cdcv2":
        from materializer.sources.cdcv2.source import CdcV2Source

        return CdcV2Source(binding, spool)
    if binding.source.format == "kafka" and binding.source.payload == "cdcv2":
        from materializer.sources.kafka.cdcv2 import KafkaCdcV2Source

        return KafkaCdcV2Source(binding, spool)
    if binding.source.format == "kafka":
        from materializer.sources.kafka.source import KafkaSource

        return KafkaSource(binding, spool)
    raise ValueError(binding.source.format)
