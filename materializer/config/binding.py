"""A binding: one source collection into one Delta table, with its mode, change semantics and layout."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from materializer.config.base import Model
from materializer.config.source import SourceConfig
from materializer.tables import CATALOG_NAME, CATALOG_NAME_FORM, DELETION_VECTORS, TableRef, retention_problem, suffixed

Strategy = Literal["lastWriteWins", "firstWriteWins", "sum", "min", "max", "merge", "append"]
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class BindingConfig(Model):
    name: str
    """Name of the binding, unique in the pipeline; used in staged file names and log entries."""
    source: SourceConfig
    """Where the collection's changes come from."""
    table: str
    """Delta table: a path, an ``s3a://`` URI, or a catalog name ``catalog.schema.table`` (each part
    letters, digits and underscores, or in backticks holding no backtick: ``main.bronze.`orders-v2```)."""
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
    others_may_write: bool = True
    """Others' commits that change rows (a person's ``DELETE``, ``UPDATE``, ``MERGE`` or ``INSERT``)
    are part of the table: later changes of the same key land over them as usual. ``false``: such a
    commit made since the pipeline's last one stops the run at start (exit 7), naming it, before
    anything is written; maintenance (``OPTIMIZE``, ``VACUUM``) and ``ALTER`` never count (docs:
    'Sharing the table with maintenance and people')."""
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
    name with ``_dead_letters`` appended; a catalog name of the same form as ``table``). Several bindings may share one (its ``binding`` column
    tells their rows apart); it may not be a binding's table."""

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
        return self.dead_letter_table or suffixed(self.table, "_dead_letters")

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
        if self.source.unrouted is not None and self.on_invalid != "dead_letter":
            raise ValueError("source.unrouted is for on_invalid: dead_letter (every record it keeps is a dead letter)")
        for option in ("table", "dead_letter_table"):
            value = getattr(self, option)
            # Our SQL splices a catalog name as it is written (DESCRIBE HISTORY main.s.t): only the
            # one form that cannot hold a second statement or another schema's name gets there.
            if value is not None and not TableRef(value).is_path and not CATALOG_NAME.match(value):
                raise ValueError(
                    f"{option}: {value!r} is neither a path nor a catalog name: {CATALOG_NAME_FORM}. Give a path "
                    "(/data/delta/t, s3a://bucket/t) or a catalog name of that form"
                )
        if self.view is not None:
            if not CATALOG_NAME.match(self.view):
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
