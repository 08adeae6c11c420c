"""``materializer bench --freshness N``: how long a change waits in follow mode (issue 32).

One binding (``documents`` source, ``source.max_files: 1``, a declared schema) runs in follow mode
in this process (``Runtime(config, spark).run(follow=True)``) while a writer thread lands N
one-document files, one at a time, as a producer with a quiet stream would: each file is written
whole (a hidden name, then a rename), and the next only once the previous change is applied, after
a random pause of up to ``pause`` seconds (so the changes land at random points of the poll cycle).

A change's freshness is from its file's rename to the end of the Acknowledged of the epoch that read
it (its rows are in the table). It is split into the wait for the next poll (rename to the read's
start), the read, staging and log commit (to Committed) and the apply (to Acknowledged). The first
``warmup`` changes (JIT: the MERGE of a cold JVM takes twice as long for its first ten or so epochs; the table's creation) are not counted. Reported: p50, p90 and max.

The goal it checks: p50 freshness at most 2 s.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from materializer import events
from materializer.events import Collector, Event

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GOAL_P50_SECONDS = 2.0


@dataclass
class FreshnessOptions:
    changes: int = 20
    """Changes measured (after the warm-up ones)."""
    warmup: int = 10
    poll: float | None = None
    """``transaction.poll_interval_seconds`` (None: the configuration's default)."""
    pause: float = 1.0
    """Up to this many seconds (uniformly at random) between a change applied and the next written."""
    seed: int = 7
    out: Path = Path(".bench-freshness")
    master: str = "local[*]"
    conf: dict[str, str] = field(default_factory=dict)
    keep_data: bool = False
    timeout: float = 300.0
    """A change not applied within this many seconds stops the bench (the run is stuck)."""


def _wall(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


class ChangeClock(Collector):
    """The read, commit and acknowledgement of each epoch, in wall-clock seconds (``time.time``)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.read: dict[int, tuple[float, int]] = {}
        """epoch -> (when its read began, documents read)."""
        self.committed: dict[int, float] = {}
        self.acknowledged: dict[int, float] = {}
        self.failed: BaseException | None = None

    def emit(self, event: Event) -> None:
        now = time.time()
        with self.lock:
            if isinstance(event, events.Read):
                self.read[event.epoch] = (_wall(event.at), event.documents)
            elif isinstance(event, events.Committed):
                self.committed[event.epoch] = now
            elif isinstance(event, events.Acknowledged):
                self.acknowledged[event.epoch] = now
            self.lock.notify_all()

    def wait_applied(self, after_epoch: int, timeout: float) -> int:
        """The first epoch after ``after_epoch`` that read documents, once it is acknowledged."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                if self.failed is not None:
                    raise RuntimeError(f"the follow-mode run failed: {self.failed}") from self.failed
                done = sorted(e for e, (_at, n) in self.read.items() if e > after_epoch and n > 0 and e in self.acknowledged)
                if done:
                    return done[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"a change written after epoch {after_epoch} was not applied within {timeout:g} s")
                self.lock.wait(min(left, 1.0))


def pipeline_config(work: Path, source: Path, poll: float | None) -> Any:
    from materializer.config import PipelineConfig

    transaction: dict[str, Any] = {}
    if poll is not None:
        transaction["poll_interval_seconds"] = poll
    return PipelineConfig.model_validate({
        "pipeline_id": "bench-freshness",
        "recovery_log": str(work / "log"),
        "staging": str(work / "staging"),
        "transaction": transaction,
        "bindings": [{
            "name": "changes",
            "source": {"format": "documents", "path": str(source), "max_files": 1, "schema": "id BIGINT, name STRING, amount DOUBLE, n BIGINT"},
            "table": str(work / "tables" / "changes"),
            "key": ["id"],
        }],
    })


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_bench_freshness(options: FreshnessOptions, say: Callable[[str], None] = print, spark: "SparkSession | None" = None) -> dict[str, Any]:
    from materializer.runtime import Runtime
    from materializer.spark import session_for

    if spark is None:
        spark = session_for(options.master, {"spark.driver.memory": "2g", **options.conf}, app_name="materializer-bench")
    root = options.out.resolve()
    work = root / "run"
    shutil.rmtree(work, ignore_errors=True)
    source = work / "source"
    source.mkdir(parents=True)
    config = pipeline_config(work, source, options.poll)
    clock = ChangeClock()
    stop = threading.Event()
    changes: list[dict[str, Any]] = []
    rng = random.Random(options.seed)

    def write_changes() -> None:
        last = 0
        try:
            for n in range(options.warmup + options.changes):
                time.sleep(rng.uniform(0, options.pause))
                hidden = source / f".change-{n:05d}.jsonl"
                hidden.write_text(json.dumps({"id": n % 10, "name": f"change {n}", "amount": float(n), "n": n}) + "\n")
                final = source / f"change-{n:05d}.jsonl"
                hidden.rename(final)
                written = time.time()
                epoch = clock.wait_applied(last, options.timeout)
                last = epoch
                with clock.lock:
                    read_at, _docs = clock.read[epoch]
                    committed, acked = clock.committed[epoch], clock.acknowledged[epoch]
                change = {
                    "change": n, "epoch": epoch, "warmup": n < options.warmup,
                    "freshness": round(acked - written, 3), "wait": round(max(0.0, read_at - written), 3),
                    "read_to_commit": round(committed - max(read_at, written), 3), "apply": round(acked - committed, 3),
                }
                changes.append(change)
                if not change["warmup"]:
                    say(f"change {n - options.warmup + 1}/{options.changes}: {change['freshness']:.2f} s (epoch {epoch})")
        finally:
            stop.set()

    writer = threading.Thread(target=write_changes, name="bench-freshness-writer", daemon=True)
    writer.start()
    try:
        Runtime(config, spark, clock).run(follow=True, should_stop=stop.is_set)
    except BaseException as exc:
        clock.failed = exc
        with clock.lock:
            clock.lock.notify_all()
        raise
    finally:
        stop.set()
        writer.join(timeout=options.timeout)
    measured = [c for c in changes if not c["warmup"]]
    if len(measured) < options.changes:
        raise RuntimeError(f"only {len(measured)} of {options.changes} changes were measured (see the writer's error above)")
    fresh = [c["freshness"] for c in measured]
    summary = {
        "p50": round(statistics.median(fresh), 3),
        "p90": round(_percentile(fresh, 0.9), 3),
        "max": round(max(fresh), 3),
        "wait_p50": round(statistics.median(c["wait"] for c in measured), 3),
        "read_to_commit_p50": round(statistics.median(c["read_to_commit"] for c in measured), 3),
        "apply_p50": round(statistics.median(c["apply"] for c in measured), 3),
        "poll_interval_seconds": config.transaction.poll_interval_seconds,
        "goal_p50": GOAL_P50_SECONDS,
    }
    summary["met"] = summary["p50"] <= GOAL_P50_SECONDS
    report = {"options": {k: str(v) if isinstance(v, Path) else v for k, v in options.__dict__.items()}, "summary": summary, "changes": changes}
    root.mkdir(parents=True, exist_ok=True)
    (root / "freshness-report.json").write_text(json.dumps(report, indent=2))
    if not options.keep_data:
        shutil.rmtree(work, ignore_errors=True)
    return report


def summary_lines(report: dict[str, Any]) -> list[str]:
    s = report["summary"]
    return [
        f"freshness over {len(report['changes']) - int(report['options']['warmup'])} changes (poll every "
        f"{s['poll_interval_seconds']:g} s): p50 {s['p50']:.2f} s, p90 {s['p90']:.2f} s, max {s['max']:.2f} s",
        f"  of it (p50): waiting for the poll {s['wait_p50']:.2f} s, read + stage + log commit {s['read_to_commit_p50']:.2f} s, "
        f"apply {s['apply_p50']:.2f} s",
        f"goal: p50 <= {s['goal_p50']:g} s ({'met' if s['met'] else 'not met'})",
    ]
