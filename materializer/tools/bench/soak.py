"""``materializer bench --soak``: follow mode over many small epochs and many bindings, watched for
growth (issue #68).

A real pipeline (``documents`` sources in local folders, local Spark) runs in a child process, the
CLI an operator would start (``materializer run --follow --events-file …``). This process feeds it
and watches it:

* **feeding**: one small JSON Lines file per binding per round (inserts, updates of live keys, a
  few deletes), each written under a hidden name and renamed; ``source.max_files: 1``, so an epoch
  reads one round. A new round is written only while fewer than ``lead`` rounds wait unapplied, so
  the pipeline always has work and never a backlog: the epochs measured are its own pace;
* **watching**: the events file's progress records (each epoch's read start, applied time and
  documents); at the end of every window of ``sample_every`` epochs the probes of
  :mod:`~materializer.tools.bench.soak_probes` (RSS, CPU, descriptors, heap after a full GC; the
  recovery log, staging, each table) and the window's epoch time and CPU;
* **the end**: after ``epochs`` epochs or ``minutes`` minutes, no more rounds; the pipeline drains
  what was written, then gets SIGTERM (its graceful stop, as a service manager sends): its exit
  code, the staging left behind, and every table read by delta-rs against the rows the feeder
  wrote, key by key.

Each series' slope per 1,000 epochs, its standard error and verdict (:mod:`soak_figures`), the
windows, ``report.json`` and ``soak.png`` go under ``<out>/<UTC time>/`` as the bench's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml

from materializer.tools.bench.paths import REPO
from materializer.tools.bench.report import machine, write_json, write_with_chart
from materializer.tools.bench.soak_figures import chart, fits, window_header, window_line
from materializer.tools.bench.soak_probes import ProcessProbe, log_store, staging_store, table_store

SCHEMA = "id BIGINT, v BIGINT, round BIGINT, note STRING"


@dataclass
class SoakOptions:
    epochs: int = 5000
    """Rounds of files fed (one epoch each, unless a poll catches a round half written)."""
    bindings: int = 8
    sample_every: int = 250
    """A window: the probes run each time this many more epochs are applied."""
    minutes: float | None = None
    """Stop feeding after this many minutes whatever the epochs (then drain and stop)."""
    rows: int = 20
    """Documents per binding per round."""
    warmup_windows: int = 1
    """Windows left out of the slopes: the JVM's start, JIT and class loading fall in the first."""
    lead: int = 3
    """Rounds written ahead of the last applied epoch."""
    poll: float = 0.5
    """``transaction.poll_interval_seconds`` of the pipeline."""
    master: str = "local[2]"
    driver_memory: str = "1g"
    conf: dict[str, str] = field(default_factory=dict)
    seed: int = 7
    out: Path = Path(".bench")
    keep_data: bool = False
    drain_seconds: float = 180.0
    """After the last round, how long the pipeline gets to apply it before it is stopped anyway."""
    stop_seconds: float = 120.0
    """How long a SIGTERMed run gets to stop before it is killed."""

    def __post_init__(self) -> None:
        if min(self.epochs, self.bindings, self.sample_every, self.rows, self.lead) < 1:
            raise ValueError("--soak-epochs, --soak-bindings, --soak-sample-every and the rows must be at least 1")


class Feeder:
    """Each binding's files and the rows its table must end with (key -> v)."""

    def __init__(self, sources: list[Path], rows: int, seed: int) -> None:
        self.sources = sources
        self.rows = rows
        self.rounds = 0
        self.documents = 0
        self.expected: list[dict[int, int]] = [{} for _ in sources]
        self._keys: list[list[int]] = [[] for _ in sources]  # live keys, for picking (swap-remove)
        self._where: list[dict[int, int]] = [{} for _ in sources]
        self._next = [0 for _ in sources]
        self._rng = random.Random(seed)

    def _drop(self, b: int, key: int) -> None:
        keys, where = self._keys[b], self._where[b]
        i = where.pop(key)
        last = keys.pop()
        if last != key:
            keys[i] = last
            where[last] = i

    def write_round(self) -> None:
        """One file per binding: half inserts, the rest updates of live keys and 1 in 10 deletes;
        keys distinct within a file."""
        self.rounds += 1
        r = self.rounds
        for b, folder in enumerate(self.sources):
            live, expected = self._keys[b], self.expected[b]
            changes = min(len(live), self.rows // 2)
            picked = self._rng.sample(live, changes) if changes else []
            deletes = set(picked[: max(0, changes // 5)]) if r % 2 == 0 else set()
            lines = []
            for key in picked:
                if key in deletes:
                    lines.append(json.dumps({"id": key, "_meta": {"op": "d"}}))
                    del expected[key]
                    self._drop(b, key)
                else:
                    value = r * 1_000 + key % 997
                    lines.append(json.dumps({"id": key, "v": value, "round": r, "note": f"u{r}"}))
                    expected[key] = value
            for _ in range(self.rows - len(picked)):
                key = self._next[b]
                self._next[b] += 1
                value = r * 1_000 + key % 997
                lines.append(json.dumps({"id": key, "v": value, "round": r, "note": f"i{r}"}))
                expected[key] = value
                self._where[b][key] = len(live)
                live.append(key)
            hidden = folder / f".round-{r:07d}.jsonl"
            hidden.write_text("\n".join(lines) + "\n")
            hidden.rename(folder / f"round-{r:07d}.jsonl")  # whole or absent, as a producer lands a file
            self.documents += len(lines)


def pipeline_config(work: Path, bindings: int, options: SoakOptions) -> dict[str, Any]:
    return {
        "pipeline_id": "bench-soak",
        "recovery_log": str(work / "log"),
        "staging": str(work / "staging"),
        "transaction": {"poll_interval_seconds": options.poll},
        "spark": {"master": options.master, "conf": {"spark.driver.memory": options.driver_memory, **options.conf}},
        "bindings": [
            {"name": f"b{b:02d}", "source": {"format": "documents", "path": str(work / "source" / f"b{b:02d}"), "max_files": 1,
                                             "schema": SCHEMA},
             "table": str(work / "tables" / f"b{b:02d}"), "key": ["id"]}
            for b in range(bindings)
        ],
    }


class EventsTail:
    """The run's events file, read as it grows: its progress records (the re-apply after Open left out)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""
        self.epochs: list[dict[str, Any]] = []
        self.documents = 0
        self.finished: dict[str, Any] | None = None

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as stream:
            stream.seek(self._offset)
            text = stream.read()
            self._offset = stream.tell()
        text, self._partial = self._partial + text, ""
        lines = text.split("\n")
        self._partial = lines.pop()  # a line being written
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("event") == "progress" and not record.get("reapplied"):
                self.epochs.append({
                    "epoch": record["epoch"], "documents": record["documents"],
                    "bindings": sum(1 for b in record.get("bindings", []) if b.get("documents")),
                    "started": _ts(record.get("started_at")), "applied": _ts(record.get("applied_at")),
                })
                self.documents += int(record["documents"])
            elif record.get("event") == "finished":
                self.finished = record


def _ts(at: str | None) -> float | None:
    return None if at is None else datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def _epoch_figures(epochs: list[dict[str, Any]], previous_applied: float | None, cpu: float | None) -> dict[str, Any]:
    walls = [e["applied"] - e["started"] for e in epochs if e["started"] is not None and e["applied"] is not None]
    applied = [e["applied"] for e in epochs if e["applied"] is not None]
    chain = ([previous_applied] if previous_applied is not None else []) + applied
    intervals = [b - a for a, b in zip(chain, chain[1:])]
    return {
        "count": len(epochs),
        "mean_seconds": sum(walls) / len(walls) if walls else None,
        "max_seconds": max(walls) if walls else None,
        "mean_interval": sum(intervals) / len(intervals) if intervals else None,
        "cpu_per_epoch": None if cpu is None or not epochs else cpu / len(epochs),
        "documents": sum(e["documents"] for e in epochs),
    }


def _stores(work: Path, bindings: int) -> dict[str, Any]:
    return {
        "log": log_store(work / "log"),
        "staging": staging_store(work / "staging"),
        "tables": {f"b{b:02d}": table_store(work / "tables" / f"b{b:02d}") for b in range(bindings)},
    }


def _tables_agree(work: Path, feeder: Feeder) -> dict[str, Any]:
    """Every table read by delta-rs (deletion vectors applied) against the feeder's rows."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    out: dict[str, Any] = {}
    for b, expected in enumerate(feeder.expected):
        name = f"b{b:02d}"
        try:
            reader = QueryBuilder().register("t", DeltaTable(str(work / "tables" / name))).execute('SELECT "id", "v" FROM t')
            rows = pa.table(reader.read_all()).to_pylist()
        except Exception as exc:  # noqa: BLE001 - said in the report
            out[name] = {"expected_rows": len(expected), "rows": None, "agree": False, "error": str(exc)[:300]}
            continue
        found = {int(r["id"]): int(r["v"]) for r in rows}
        out[name] = {"expected_rows": len(expected), "rows": len(rows), "agree": len(rows) == len(found) and found == expected}
    return out


def _cpu(reading: dict[str, dict[str, Any]]) -> float | None:
    values = [reading["driver"].get("cpu"), reading["jvm"].get("cpu")]
    return None if any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]


def run_soak(options: SoakOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The soak, start to end; the report (also written as ``report.json`` beside ``soak.png``)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    root = Path(options.out).resolve() / stamp
    work = root / "data"
    sources = [work / "source" / f"b{b:02d}" for b in range(options.bindings)]
    for folder in sources:
        folder.mkdir(parents=True)
    config = work / "pipeline.yaml"
    config.write_text(yaml.safe_dump(pipeline_config(work, options.bindings, options), sort_keys=False))
    events_path = work / "events.jsonl"
    feeder = Feeder(sources, options.rows, options.seed)
    tail = EventsTail(events_path)
    report: dict[str, Any] = {
        "kind": "soak", "started_at": stamp, "machine": machine(), "windows": [],
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "command": ["materializer", "run", "--config", str(config), "--follow", "--events-file", str(events_path), "--quiet"],
    }
    env = dict(os.environ)
    env.pop("MATERIALIZER_CRASH_AT", None)
    started = time.monotonic()
    deadline = started + options.minutes * 60 if options.minutes else None
    while feeder.rounds < min(options.lead, options.epochs):
        feeder.write_round()
    with open(work / "run.out", "w") as out, open(work / "run.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "materializer_cli", *report["command"][1:]], cwd=REPO, env=env, stdout=out, stderr=err
        )
    probe = ProcessProbe(proc.pid)
    report["heap_probe"] = probe.heap_probe()
    say(f"soak: {options.bindings} bindings, up to {options.epochs} epochs of {options.rows} documents each per binding, "
        f"window {options.sample_every} epochs; pipeline pid {proc.pid}; under {root}/")
    last_cpu: float | None = 0.0  # from the processes' start: the first window holds the JVM's start
    last_applied: float | None = None
    seen = 0
    stop_reason = "epochs"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the pipeline's run exited ({proc.returncode}) during the soak: {_tail(work / 'run.err')}")
            tail.poll()
            applied = len(tail.epochs)
            feeding = feeder.rounds < options.epochs and (deadline is None or time.monotonic() < deadline)
            while feeding and feeder.rounds < min(options.epochs, applied + options.lead):
                feeder.write_round()
            if applied >= seen + options.sample_every:
                seen += options.sample_every
                window_epochs = tail.epochs[seen - options.sample_every : seen]
                reading = probe.read(heap=True)
                cpu = _cpu(reading)
                window = {
                    "window": len(report["windows"]) + 1, "epoch": seen, "elapsed": time.monotonic() - started, **reading,
                    "epochs": _epoch_figures(window_epochs, last_applied, None if cpu is None or last_cpu is None else cpu - last_cpu),
                    **_stores(work, options.bindings),
                }
                last_cpu, last_applied = cpu, window_epochs[-1]["applied"]
                report["windows"].append(window)
                if len(report["windows"]) == 1:
                    say(window_header())
                say(window_line(window))
                write_json(root, report)  # a soak cut short keeps its windows
            if not feeding and tail.documents >= feeder.documents:
                stop_reason = "epochs" if feeder.rounds >= options.epochs else "minutes"
                break
            if not feeding and time.monotonic() > (deadline or started) + options.drain_seconds and tail.documents < feeder.documents:
                stop_reason = "drain timed out"
                break
            time.sleep(0.2)
        report["end"] = _stop(proc, options.stop_seconds)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    tail.poll()
    report["stop_reason"] = stop_reason
    report["seconds"] = time.monotonic() - started
    report["epochs"] = len(tail.epochs)
    report["rounds_written"] = feeder.rounds
    report["documents"] = {"written": feeder.documents, "applied": tail.documents}
    report["partial_epochs"] = sum(1 for e in tail.epochs if e["bindings"] < options.bindings)
    report["finished"] = tail.finished
    end = report["end"]
    end.update(_stores(work, options.bindings))
    end["tables"] = {name: {**t, **agree} for (name, t), agree in zip(end["tables"].items(), _tables_agree(work, feeder).values())}
    end["tables_agree"] = all(t["agree"] for t in end["tables"].values())
    end["staging_empty"] = end["staging"]["files"] == 0
    report["slopes"] = fits(report["windows"], min(options.warmup_windows, max(0, len(report["windows"]) - 1)))
    write_with_chart(root, report, "soak.png", chart, say)
    if not options.keep_data:
        import shutil

        for folder in ("source", "tables", "log", "staging"):
            shutil.rmtree(work / folder, ignore_errors=True)
    return report


def _stop(proc: subprocess.Popen[bytes], seconds: float) -> dict[str, Any]:
    """SIGTERM: the run ends its transaction and stops (cli/run.py); killed if it does not within ``seconds``."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=seconds)
        killed = False
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
        killed = True
    return {"returncode": code, "stop_seconds": time.monotonic() - t0, "killed": killed}


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text()[-chars:]
    except OSError:
        return ""
