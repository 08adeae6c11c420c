"""What a drill is asked to do: its options, the kills it plans, the windows between steps a kill
can fall in, the scratch copy of the pipeline and the epoch sizes set on it, the failure points a
configuration cannot reach; and the error of a drill that cannot run."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from materializer.config import PipelineConfig
from materializer.errors import MaterializerError

SCENARIOS = ("kills", "zombie", "damage", "neighbours")

BETWEEN_BINDINGS = "between two bindings' applies"
"""A kill with some of an epoch's tables applied and others not (``after-apply`` and random kills)."""
OVERLAP = "apply N while reading N+1"
"""A kill while epoch N's tables are applied and epoch N+1 is already being read."""
BETWEEN_EPOCHS = "between epochs"
"""A kill after an epoch's last apply and before the next epoch's log commit."""
WINDOWS = (BETWEEN_BINDINGS, OVERLAP, BETWEEN_EPOCHS)


class DrillError(MaterializerError):
    """The drill itself could not run (bad work folder, a run that never ends)."""

    exit_code = 2


# --- plans -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How one run of the pipeline is to die."""

    kind: str
    """``point`` (MATERIALIZER_CRASH_AT), ``random`` (SIGKILL of the group by the drill), ``drain``."""
    point: str | None = None
    """``point``: the failure point (optionally ``point:epoch``)."""
    trigger: str = ""
    """``random``: the event the delay counts from: ``opened``, ``read`` or ``committed``."""
    occurrence: int = 1
    """``random``: which occurrence of the trigger event in the run."""
    delay: float = 0.0
    """``random``: seconds after the trigger; ``committed`` delays fall in the apply (MERGE) window."""

    @property
    def label(self) -> str:
        if self.kind == "point":
            return f"point {self.point}"
        if self.kind == "random":
            return f"random kill {self.delay:.2f}s after {self.trigger} #{self.occurrence}"
        return "drain"


@dataclass
class DrillOptions:
    config: Path
    workdir: Path | None = None
    """Scratch folder (must be empty or absent); None: a temp folder, deleted after a passing drill."""
    scenario: str = "kills"
    kills: int = 3
    """Random kills (scenario ``kills``)."""
    seed: int = 0
    points: list[str] | None = None
    """Failure points to kill at once each (None: every point the configuration can reach)."""
    damages: list[str] | None = None
    """Scenario ``damage``: which damages (None: all)."""
    maintenance: list[str] | None = None
    """Scenario ``neighbours``: which maintenance actions the maintainer runs (None: all of
    :data:`~materializer.tools.drill.maintenance.MAINTENANCE`)."""
    max_documents: int | None = None
    """Override ``transaction.max_documents`` (cdcv2, kafka: more, smaller epochs give the kills more to hit)."""
    max_files: int | None = None
    """Override ``source.max_files`` of documents bindings (their epochs are whole files)."""
    max_records: int | None = None
    """Override ``source.max_records`` of kafka bindings (documents and debezium payloads)."""
    min_epochs: int = 5
    """Unless an override above is given: epoch sizes chosen so a round has at least this many
    epochs (:func:`epoch_sizes`), so kills fall between epochs and not only inside the one."""
    run_timeout: float = 900.0
    """A single run taking longer than this is a hang: the drill kills it and fails."""
    reader: str = "spark"
    """How the verification reads the tables' rows: ``spark`` or ``deltalake`` (delta-rs)."""
    remote: str | None = None
    """A Spark Connect server (``sc://host:port``): every run is ``materializer run --remote``, so a
    kill ends the client only and the server's operation runs on; the drill verifies through it too."""
    keep: bool = False
    report: Path | None = None
    resume: Path | None = None
    """The report of a ``kills`` drill stopped early (SIGUSR1): go on with the rest of its plan, in
    its workdir (new rounds after its last), and write one report of every sitting."""


# --- the scratch copy of the pipeline ----------------------------------------------------------


def _absolute(path: str) -> str:
    if "://" in path or path.startswith(("dbfs:", "/")):
        return path
    return os.path.abspath(path)


def _scratch_name(value: str) -> str:
    """A table name or path (with a template's ``{placeholders}`` kept) as one folder name."""
    return re.sub(r"[^A-Za-z0-9_{}.-]+", "_", value).strip("_") or "table"


def scratch_config(
    config: PipelineConfig, root: Path, max_documents: int | None = None, max_files: int | None = None,
    max_records: int | None = None, remote: str | None = None, spark_conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The configuration with everything it writes moved under ``root``: the log, the staging, every
    binding's table and dead-letter table, the tables its templates make (their placeholders
    kept, so each binding made still gets a table of its own); its views left out (a drill run
    would replace the user's view with one over the scratch table: :func:`scratch_notes`);
    ``spark_conf`` added to ``spark.conf`` where the configuration does not set it. The sources
    are unchanged: they are only read."""
    # Only what the file set: a dump of every default would name other formats' settings (a
    # documents source with kafka's `starting`), which the configuration refuses.
    data = config.model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["recovery_log"] = str(root / "log")
    data["staging"] = str(root / "staging")
    data.setdefault("bindings", [])  # a pipeline of templates only sets none
    dead_letters: dict[str, str] = {}

    def dead_letter_table(value: str) -> str:
        # Bindings that share a dead-letter table share its scratch copy.
        return dead_letters.setdefault(value, str(root / "dead_letters" / f"{len(dead_letters) + 1}_{_scratch_name(value)}"))

    for binding in data["bindings"]:
        binding["table"] = str(root / "tables" / binding["name"])
        if binding["source"].get("path") is not None:
            binding["source"]["path"] = _absolute(binding["source"]["path"])
    for index, template in enumerate(data.get("templates", [])):
        template["table"] = str(root / "templates" / str(index) / _scratch_name(template["table"]))
        if template["source"].get("folders_in") is not None:
            template["source"]["folders_in"] = _absolute(template["source"]["folders_in"])
    for binding in [*data["bindings"], *data.get("templates", [])]:
        if binding.get("dead_letter_table") is not None:
            binding["dead_letter_table"] = dead_letter_table(binding["dead_letter_table"])
        binding.pop("view", None)
        binding.pop("view_internal_columns", None)
    documents = [b for b in [*data["bindings"], *data.get("templates", [])] if b["source"]["format"] == "documents"]
    kafka = [
        b for b in [*data["bindings"], *data.get("templates", [])]
        if b["source"]["format"] == "kafka" and b["source"].get("payload", "documents") != "cdcv2"
    ]
    if max_documents:
        data.setdefault("transaction", {})["max_documents"] = max_documents
    if max_files:
        for binding in documents:
            binding["source"]["max_files"] = max_files
    if remote:
        # Every command of the round (run, recover) then runs on the server: a kill ends the client.
        data.setdefault("spark", {})["remote"] = remote
    if max_records:
        for binding in kafka:
            binding["source"]["max_records"] = max_records
    for name, value in (spark_conf or {}).items():
        # (a setting the configuration gives itself is kept)
        data.setdefault("spark", {}).setdefault("conf", {}).setdefault(name, value)
    return data


def scratch_notes(config: PipelineConfig) -> list[str]:
    """What the scratch copy leaves out of the user's configuration, said in the report."""
    views = [f"{b.name}: {b.view}" for b in config.bindings if b.view] + [
        f"templates[{i}]: {t.view}" for i, t in enumerate(config.templates) if t.view
    ]
    notes = []
    if views:
        notes.append(
            "live-row views left out of the scratch copy (a run would replace them with views of the scratch "
            "tables): " + ", ".join(views)
        )
    return notes


def known_bindings(config: PipelineConfig) -> PipelineConfig:
    """The configuration with the bindings its templates make from what is there now (the
    sub-folders of ``folders_in``, the topics a ``topic_pattern`` matches): what the drill sizes
    epochs and plans kills for. A ``route_by`` template's tables are found by reading records, so
    they are not among them; a listing that fails leaves the templates' bindings out (the
    pipeline's runs will say why)."""
    if not config.templates:
        return config
    from materializer.templates import discover, expand

    try:
        return expand(config, discover(config)).config
    except MaterializerError:
        return config


@dataclass(frozen=True)
class EpochSizes:
    """What the drill sets on its scratch copy so a round has several epochs."""

    max_documents: int | None = None
    max_files: int | None = None
    max_records: int | None = None
    notes: tuple[str, ...] = ()
    """One line per choice, said in the report: what was counted and what was set."""


def _documents_files(binding: Any) -> int:
    from materializer.sources.documents.source import is_document_file
    from materializer.storage import open_store

    return sum(1 for f in open_store(binding.source.path).list() if is_document_file(f.path))


def _cdcv2_statements(binding: Any) -> int:
    from materializer.storage import open_store

    store = open_store(binding.source.path)
    return sum(store.get(f.path).count(b"\n") for f in store.list() if not f.path.rsplit("/", 1)[-1].startswith((".", "_")))


def _kafka_records(binding: Any) -> int:
    from materializer.sources.kafka.source import Offsets

    source = binding.source
    offsets = Offsets(source.bootstrap_servers, dict(source.client_options), f"binding {binding.name}")
    return sum(high - low for low, high in offsets.watermarks(source.topic_names).values())


def epoch_sizes(config: PipelineConfig, options: "DrillOptions") -> EpochSizes:
    """Epoch sizes that give a round at least ``options.min_epochs`` epochs, from what the sources
    hold now (files of a documents folder, statements of a CDC v2 folder, records of the topics);
    an override the user gave is kept as given. A source that cannot be counted keeps its sizes,
    and the note says so."""
    aim = max(1, options.min_epochs)
    notes: list[str] = []
    given = {k: v for k, v in (("max_files", options.max_files), ("max_documents", options.max_documents), ("max_records", options.max_records)) if v}
    if given:
        notes.append("epoch sizes as given: " + ", ".join(f"{k} {v}" for k, v in given.items()))
        return EpochSizes(options.max_documents, options.max_files, options.max_records, tuple(notes))
    # Per setting, each binding's (count, epochs at the current size). A round has as many epochs
    # as its busiest binding: the size is chosen so that binding reaches the aim (the smallest
    # binding's fit would make a fleet's big tables take hundreds of one-record epochs).
    counted: dict[str, list[tuple[int, int]]] = {"max_files": [], "max_documents": [], "max_records": []}
    for binding in config.bindings:
        source = binding.source
        try:
            if source.format == "documents":
                files = _documents_files(binding)
                counted["max_files"].append((files, -(-files // source.max_files)))
                notes.append(f"{binding.name}: {files} document files, {source.max_files} an epoch")
            elif source.format == "cdcv2" or (source.format == "kafka" and source.payload == "cdcv2"):
                statements = _cdcv2_statements(binding) if source.format == "cdcv2" else _kafka_records(binding)
                counted["max_documents"].append((statements, -(-statements // config.transaction.max_documents)))
                notes.append(f"{binding.name}: {statements} CDC v2 statements")
            elif source.format == "kafka":
                records = _kafka_records(binding)
                per_epoch = source.max_records or config.transaction.max_documents
                counted["max_records"].append((records, -(-records // per_epoch)))
                notes.append(f"{binding.name}: {records} records in its topics")
        except Exception as exc:  # noqa: BLE001 - a source the drill cannot count keeps its sizes
            notes.append(f"{binding.name}: not counted ({str(exc).splitlines()[0][:200]}); its epoch sizes are kept")
    chosen_sizes = {
        setting: max(max(1, count // aim) for count, _epochs in found if count)
        for setting, found in counted.items()
        if any(count for count, _epochs in found) and max(epochs for _count, epochs in found) < aim
    }
    max_files, max_documents, max_records = (chosen_sizes.get(k) for k in ("max_files", "max_documents", "max_records"))
    current = {
        "max_files": [b.source.max_files for b in config.bindings if b.source.format == "documents"],
        "max_documents": [config.transaction.max_documents],
        "max_records": [b.source.max_records or config.transaction.max_documents for b in config.bindings if b.source.format == "kafka"],
    }
    chosen = [
        f"{k} {v}" for k, v in (("max_files", max_files), ("max_documents", max_documents), ("max_records", max_records))
        if v and any(v != c for c in current[k])
    ]
    notes.append(
        (f"set {', '.join(chosen)} so a round has at least {aim} epochs" if chosen else f"the configured sizes kept (as small as the sources allow, or already {aim} epochs or more)")
        + " (--max-files / --max-documents / --max-records to choose)"
    )
    return EpochSizes(max_documents, max_files, max_records, tuple(notes))


def unreachable_points(config: PipelineConfig) -> dict[str, str]:
    out = {}
    if not any(b.needs_loads for b in config.bindings):
        out["mid-load"] = "no binding loads current rows (standard mode with a non-lastWriteWins reduction)"
    if len(config.bindings) < 2:
        out["after-apply"] = "fires between two bindings' applies; the pipeline has one binding"
        out[BETWEEN_BINDINGS] = "the pipeline has one binding"
    return out
