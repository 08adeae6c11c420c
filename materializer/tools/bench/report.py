"""The benchmark's report: a configuration's figures from what its paths measured, the goals,
the machine, ``report.json``, the chart (``bench.png``) and the summary table."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any, Callable


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _summary(epochs: list[dict[str, Any]], big: int, keys: tuple[str, ...]) -> dict[str, Any]:
    big_epochs = [e for e in epochs if e["epoch"] <= big]
    one_row = [e for e in epochs if e["epoch"] == big + 1]
    out: dict[str, Any] = {f"median_{k}_seconds": _median([e[k] for e in big_epochs if k in e]) for k in keys}
    out["one_row_seconds"] = one_row[0]["total"] if one_row else None
    return out


def _cpu(epochs: list[dict[str, Any]], big: int) -> dict[str, Any]:
    """CPU seconds per big epoch, Python and JVM (the approach's process and its JVM): their sum
    over the big epochs divided by their count, not a median, so the figure is what the run cost.
    Ours pipelines: the interval of its epoch N also holds the reading and staging of N+1, so the
    first big epoch's holds two stagings and the last's only its apply (and the one-row epoch's
    staging). Its epochs' CPU differs by design (34, 19 and 9 s in one run); a median of three
    picks the middle interval, one staging and one apply, and leaves out what only the first
    epoch pays (its JVM CPU is higher than two stagings and an apply by about 5 s here; the bare
    path's first epoch pays about 3 s more than its others too)."""
    big_epochs = [e for e in epochs if e["epoch"] <= big]

    def mean(key: str) -> float | None:
        values = [e[key] for e in big_epochs if key in e]
        return sum(values) / len(values) if values else None

    out = {"python_cpu_seconds_per_epoch": mean("python_cpu"), "jvm_cpu_seconds_per_epoch": mean("jvm_cpu")}
    if any("worker_cpu" in e for e in big_epochs):
        out["worker_cpu_seconds_per_epoch"] = mean("worker_cpu")
    return out


def _cpu_total(block: dict[str, Any] | None) -> float | None:
    """Every process's CPU per epoch: the driver's Python, the JVM and Spark's Python workers."""
    if not block or block.get("python_cpu_seconds_per_epoch") is None or block.get("jvm_cpu_seconds_per_epoch") is None:
        return None
    workers = block.get("worker_cpu_seconds_per_epoch") or 0.0
    return float(block["python_cpu_seconds_per_epoch"]) + float(block["jvm_cpu_seconds_per_epoch"]) + float(workers)


def _wall_per_epoch(epochs: list[dict[str, Any]], big: int) -> float | None:
    """Open to the last big epoch's Acknowledged, per big epoch (the pipeline's start-up included)."""
    totals = [e["total"] for e in epochs if e["epoch"] <= big]
    return sum(totals) / len(totals) if len(totals) == big else None


def figures(
    result: dict[str, Any],
    *,
    ours: dict[str, Any],
    bare: dict[str, Any],
    peer: dict[str, Any] | None,
    kafka: dict[str, Any] | None,
    replay: dict[str, Any] | None,
    recovery: dict[str, Any] | None,
    big: int,
    kafka_partitions: int,
) -> None:
    """A configuration's figures, added to its ``result``: per path its medians over the ``big``
    epochs, CPU per epoch, Spark jobs and rows per second; the replay and recovery as measured;
    the ratios between the paths."""
    result["ours"] = {
        "seconds": ours["seconds"],
        "epochs": ours["epochs"],
        **_summary(ours["epochs"], big, ("read", "stage", "apply", "total")),
        **_cpu(ours["epochs"], big),
        "steps": {k: {**v, "seconds_per_epoch": v["seconds"] / max(1, len(ours["epochs"]))} for k, v in ours["steps"].items()},
        "median_spark_jobs": _median([e["spark_jobs"] for e in ours["epochs"] if e["epoch"] <= big and e.get("spark_jobs") is not None]),
        "wall_seconds_per_epoch": _wall_per_epoch(ours["epochs"], big),
    }
    result["bare"] = {
        "seconds": bare["seconds"],
        "epochs": bare["epochs"],
        **_summary(bare["epochs"], big, ("stage", "merge", "total")),
        **_cpu(bare["epochs"], big),
        "median_merge_spark_jobs": _median([e["merge_jobs"] for e in bare["epochs"] if e["epoch"] <= big and "merge_jobs" in e]),
    }
    if peer is not None:
        result["peer"] = {
            "seconds": peer["seconds"], "epochs": peer["epochs"], **_summary(peer["epochs"], big, ("foreach_batch", "total")),
            **_cpu(peer["epochs"], big),
        }
    if kafka is not None:
        result["kafka"] = {
            "seconds": kafka["seconds"],
            "epochs": kafka["epochs"],
            "partitions": kafka_partitions,
            **_summary(kafka["epochs"], big, ("read", "stage", "apply", "total")),
            **_cpu(kafka["epochs"], big),
            "wall_seconds_per_epoch": _wall_per_epoch(kafka["epochs"], big),
        }
    if replay is not None:
        result["replay"] = replay
    if recovery is not None:
        result["recovery"] = recovery

    o, b = result["ours"], result["bare"]
    p = result.get("peer")
    big_rows = result["epoch_rows"]
    for block in [o, b] + ([p] if p else []) + ([result["kafka"]] if "kafka" in result else []):
        median_total = block.get("median_total_seconds")
        block["rows_per_second"] = big_rows / median_total if median_total else None
    result["ratios"] = {
        # ours end to end vs the same rows read, deduplicated, staged and MERGEd without the machinery
        "ours_over_bare": _ratio(o["median_total_seconds"], b["median_total_seconds"]),
        # our apply phase vs the bare MERGE of staged rows: the floor our apply cannot beat
        "ours_apply_over_bare_merge": _ratio(o["median_apply_seconds"], b["median_merge_seconds"]),
        # ours end to end vs the bare MERGE alone
        "ours_over_bare_merge": _ratio(o["median_total_seconds"], b["median_merge_seconds"]),
        "ours_over_peer": _ratio(o["median_total_seconds"], p["median_total_seconds"]) if p else None,
        # CPU seconds (Python + JVM + Python workers) per epoch: steadier than wall time on a shared machine
        "cpu_ours_over_bare": _ratio(_cpu_total(o), _cpu_total(b)),
        "cpu_ours_over_peer": _ratio(_cpu_total(o), _cpu_total(p)) if p else None,
        "one_row_ours_over_peer": _ratio(o["one_row_seconds"], p["one_row_seconds"]) if p else None,
        # the same documents from a topic vs from files, both ours end to end
        "kafka_over_files": _ratio(result["kafka"]["median_total_seconds"], o["median_total_seconds"]) if "kafka" in result else None,
    }


def machine() -> dict[str, Any]:
    from materializer.extras import require

    psutil = require("psutil", purpose="the benchmark's machine description")

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "load_average": list(os.getloadavg()),
    }
    try:
        import pyspark

        info["pyspark"] = pyspark.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        info["delta_spark"] = version("delta-spark")
    except Exception:  # noqa: BLE001
        pass
    cpu = Path("/proc/cpuinfo")
    if cpu.exists():
        for line in cpu.read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    return info


def goals(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the largest epochs measured (reported, never asserted)."""
    out: list[dict[str, Any]] = []
    if not configs:
        return out
    largest = max(c["epoch_rows"] for c in configs)
    at_largest = [c for c in configs if c["epoch_rows"] == largest]
    for c in at_largest:
        ratio = c["ratios"]["ours_over_bare"]
        out.append(
            {
                "goal": "machinery overhead over the bare path <= 15% (target stated at 1M-row epochs)",
                "config": c["name"],
                "value": None if ratio is None else ratio - 1,
                "met": None if ratio is None else ratio - 1 <= 0.15,
            }
        )
        if c["ratios"]["ours_over_peer"] is not None:
            ratio = c["ratios"]["ours_over_peer"]
            out.append({"goal": "throughput >= the peer's (ours/peer time <= 1)", "config": c["name"], "value": ratio, "met": ratio <= 1.0})
    for c in configs:
        if "replay" in c and c["replay"]["reapply_seconds"] is not None:
            value = c["replay"]["reapply_seconds"]
            out.append({"goal": "replayed epoch < 1 s", "config": c["name"], "value": value, "met": value < 1.0})
    return out


def write_json(root: Path, report: dict[str, Any]) -> None:
    """``report.json`` under ``root``, replaced whole (a reader never sees half of it)."""
    tmp = root / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(root / "report.json")


def write_with_chart(
    root: Path, report: dict[str, Any], name: str, draw: Callable[[dict[str, Any], Path], None], say: Callable[[str], None]
) -> None:
    """``report.json`` and, beside it, the chart ``name`` that ``draw`` makes of it; both paths go
    in ``report["paths"]``. A chart that cannot be drawn is said and its path is None: the figures
    matter more than the picture."""
    report["paths"] = {"json": str(root / "report.json"), "chart": str(root / name)}
    try:
        draw(report, root / name)
    except Exception as exc:  # noqa: BLE001 - any failure to draw: the report stands without it
        say(f"chart not written: {exc}")
        report["paths"]["chart"] = None
    write_json(root, report)


# --- presentation ---------------------------------------------------------------------------------


FIXED_COSTS = ("replay (ours, warm)", "replay (fresh process)", "1-row epoch (ours)", "1-row batch (peer)", "restart after kill")


def fixed_costs(c: dict[str, Any]) -> list[float | None]:
    """The right panel's figures for one configuration, in FIXED_COSTS order; None: not measured
    (e.g. ``--no-recovery``, no peer), which the chart must not draw as a value."""
    values = [
        (c.get("replay") or {}).get("reapply_seconds"),
        (c.get("recovery") or {}).get("replay_restart_seconds"),
        c["ours"].get("one_row_seconds"),
        (c.get("peer") or {}).get("one_row_seconds"),
        (c.get("recovery") or {}).get("restart_seconds"),
    ]
    return [float(v) if isinstance(v, (int, float)) else None for v in values]


def chart(report: dict[str, Any], path: Path) -> None:
    from materializer.extras import require

    require("matplotlib", purpose="the benchmark's chart")
    fig = chart_figure(report)
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_figure(report: dict[str, Any]) -> Any:
    """The bench's figure (matplotlib), before it is saved."""
    from materializer.extras import require

    matplotlib = require("matplotlib", purpose="the benchmark's chart")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configs"]
    names = [c["name"] for c in configs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(9, 3 * len(names) + 4), 4.5))
    x = list(range(len(names)))
    width = 0.27
    # Left: median epoch time, ours split into its phases, bare into stage + merge, peer whole.
    # Ours as one bar: its phases overlap (epoch N is applied while N+1 is read), so they do not stack.
    ours = [c["ours"].get("median_total_seconds") or 0 for c in configs]
    apply = [c["ours"].get("median_apply_seconds") or 0 for c in configs]
    opts = report.get("options") or {}
    pipelined = not opts.get("interleave", False) and opts.get("pipelined", True)
    left.bar([i - width for i in x], ours, width, color="#4292c6", label="ours: epoch (pipelined)" if pipelined else "ours: epoch")
    left.bar([i - width for i in x], apply, width * 0.4, color="#08519c", label="ours: of which apply")
    stage = [c["bare"].get("median_stage_seconds") or 0 for c in configs]
    merge = [c["bare"].get("median_merge_seconds") or 0 for c in configs]
    left.bar(x, stage, width, color="#fdae6b", label="bare: stage")
    left.bar(x, merge, width, bottom=stage, color="#e6550d", label="bare: MERGE")
    if any("peer" in c for c in configs):
        peer = [c.get("peer", {}).get("median_total_seconds") or 0 for c in configs]
        left.bar([i + width for i in x], peer, width, color="#31a354", label="peer: foreachBatch")
    left.set_xticks(x, names, rotation=15)
    left.set_ylabel("median seconds per epoch")
    left.set_title("Epoch time")
    left.legend(fontsize=7)
    # Right: fixed costs: replay, one-row epoch, recovery restart.
    labels = list(FIXED_COSTS)
    step = 0.8 / len(configs)
    for i, c in enumerate(configs):
        values = fixed_costs(c)
        # Only what was measured is drawn; a figure not measured is said so, never drawn as a bar
        # (a log axis has no zero: a placeholder value would look like a real, tiny cost).
        measured = [(j, v) for j, v in enumerate(values) if v is not None and v > 0]
        bars = right.bar([j + i * step for j, _ in measured], [v for _, v in measured], step, label=c["name"])
        colour = bars.patches[0].get_facecolor() if bars.patches else None
        for j, v in enumerate(values):
            if v is None:
                right.text(j + i * step, 0.02, "not measured", transform=right.get_xaxis_transform(), rotation=90,
                           ha="center", va="bottom", fontsize=6, color=colour or "grey")
    right.set_xticks(range(len(labels)), labels, rotation=15, fontsize=8)
    # Log scale: a replay (tenths of a second) and a restart (a JVM start and a MERGE) on one axis.
    right.set_yscale("log")
    right.set_ylabel("seconds (log)")
    right.set_title("Fixed costs")
    right.legend(fontsize=7)
    fig.suptitle(f"materializer bench ({report['options']['mode']}), {report['machine'].get('cpus')} CPUs")
    fig.tight_layout()
    return fig


def _per_million(value: float | None, documents: int) -> float | None:
    return None if value is None or not documents else value * 1_000_000 / documents


def _fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "n":
        return f"{value:.0f}"
    if unit == "rows/s":
        return f"{value:,.0f}"
    return f"{value:.2f}"


def summary_table(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The summary: one row per figure, one column per configuration (medians over big epochs)."""
    configs = report["configs"]
    # Interleaved (the default), ours runs one epoch per run: nothing overlaps, each epoch opens.
    interleaved = bool((report.get("options") or {}).get("interleave"))
    figures: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("epoch documents", lambda c: f"{c['epoch_rows']:,}"),
        ("table rows (seeded)", lambda c: f"{c['table_rows']:,}"),
        ("ours: s/epoch end to end", lambda c: _fmt(c["ours"]["median_total_seconds"])),
        ("  read (list, Spark checks" + (")" if interleaved else "; overlaps apply)"), lambda c: _fmt(c["ours"]["median_read_seconds"])),
        ("  Python (driver) CPU s/epoch", lambda c: _fmt(c["ours"].get("python_cpu_seconds_per_epoch"))),
        ("  Python CPU s per 1M documents", lambda c: _fmt(_per_million(c["ours"].get("python_cpu_seconds_per_epoch"), c["epoch_rows"]))),
        ("  JVM CPU s/epoch", lambda c: _fmt(c["ours"].get("jvm_cpu_seconds_per_epoch"))),
        ("  Python workers' CPU s/epoch", lambda c: _fmt(c["ours"].get("worker_cpu_seconds_per_epoch"))),
        ("  stage (parse, wait, Parquet, log)", lambda c: _fmt(c["ours"]["median_stage_seconds"])),
        ("  apply (checks, MERGE, GC)", lambda c: _fmt(c["ours"]["median_apply_seconds"])),
        ("  wall: Open to last big epoch / epochs", lambda c: _fmt(c["ours"].get("wall_seconds_per_epoch"))),
        ("  Spark jobs/epoch", lambda c: _fmt(c["ours"].get("median_spark_jobs"), "n")),
        ("bare: s/epoch (stage + MERGE)", lambda c: _fmt(c["bare"]["median_total_seconds"])),
        ("  bare MERGE alone", lambda c: _fmt(c["bare"]["median_merge_seconds"])),
        ("  Spark jobs/MERGE", lambda c: _fmt(c["bare"].get("median_merge_spark_jobs"), "n")),
        ("  bare CPU s/epoch: Python / JVM / workers", lambda c: _cpu_parts(c["bare"])),
        ("peer: s/batch (trigger)", lambda c: _fmt((c.get("peer") or {}).get("median_total_seconds"))),
        ("  peer CPU s/batch: Python / JVM / workers", lambda c: _cpu_parts(c.get("peer") or {})),
        ("ours rows/s", lambda c: _fmt(c["ours"]["rows_per_second"], "rows/s")),
        ("bare rows/s", lambda c: _fmt(c["bare"]["rows_per_second"], "rows/s")),
        ("peer rows/s", lambda c: _fmt((c.get("peer") or {}).get("rows_per_second"), "rows/s")),
        ("ours from Kafka: s/epoch end to end", lambda c: _fmt((c.get("kafka") or {}).get("median_total_seconds"))),
        ("  read (offsets, Spark reads + checks)", lambda c: _fmt((c.get("kafka") or {}).get("median_read_seconds"))),
        ("  Kafka CPU s/epoch: Python / JVM / workers", lambda c: _cpu_parts(c.get("kafka") or {})),
        ("ours from Kafka rows/s", lambda c: _fmt((c.get("kafka") or {}).get("rows_per_second"), "rows/s")),
        ("Kafka / files (ours)", lambda c: _fmt(c["ratios"].get("kafka_over_files"), "x")),
        ("ours / bare", lambda c: _fmt(c["ratios"]["ours_over_bare"], "x")),
        ("ours apply / bare MERGE", lambda c: _fmt(c["ratios"]["ours_apply_over_bare_merge"], "x")),
        ("ours / bare MERGE", lambda c: _fmt(c["ratios"]["ours_over_bare_merge"], "x")),
        ("ours / peer", lambda c: _fmt(c["ratios"]["ours_over_peer"], "x")),
        ("ours / bare, CPU s (Python + JVM + workers)", lambda c: _fmt(c["ratios"].get("cpu_ours_over_bare"), "x")),
        ("ours / peer, CPU s (Python + JVM + workers)", lambda c: _fmt(c["ratios"].get("cpu_ours_over_peer"), "x")),
        ("replayed epoch: re-ack s (whole run, jobs)", lambda c: _replay(c)),
        ("replay in a fresh process: restart s (in-run s)", lambda c: _recovery(c, "replay_restart")),
        ("one-row epoch: ours s" + (" (a run of its own)" if interleaved else ""), lambda c: _fmt(c["ours"]["one_row_seconds"])),
        ("one-row epoch: bare s", lambda c: _fmt(c["bare"]["one_row_seconds"])),
        ("one-row batch: peer s", lambda c: _fmt((c.get("peer") or {}).get("one_row_seconds"))),
        ("kill mid-apply: restart s (in-run s)", lambda c: _recovery(c, "restart")),
        ("peak driver RSS MB", lambda c: _memory(c, "python_rss")),
        ("peak JVM RSS MB", lambda c: _memory(c, "jvm_rss")),
        ("tables agree", lambda c: "yes" if c.get("tables_agree") else "NO"),
    ]
    header = ["figure"] + [c["name"] for c in configs]
    rows = [[label] + [get(c) for c in configs] for label, get in figures]
    return header, rows


def _cpu_parts(block: dict[str, Any]) -> str:
    keys = ("python_cpu_seconds_per_epoch", "jvm_cpu_seconds_per_epoch", "worker_cpu_seconds_per_epoch")
    return " / ".join(_fmt(block.get(k)) for k in keys)


def _replay(c: dict[str, Any]) -> str:
    replay = c.get("replay")
    if not replay:
        return "-"
    jobs = replay.get("spark_jobs")
    return f"{_fmt(replay.get('reapply_seconds'))} (run {_fmt(replay.get('run_seconds'))}, {'?' if jobs is None else jobs} jobs)"


def _recovery(c: dict[str, Any], which: str) -> str:
    recovery = c.get("recovery")
    if not recovery:
        return "-"
    return f"{_fmt(recovery.get(f'{which}_seconds'))} ({_fmt(recovery.get(f'{which}_run_seconds'))})"


def _memory(c: dict[str, Any], kind: str) -> str:
    # In-process phases only: the recovery subprocesses have their own driver and JVM.
    values = [v[kind] for k, v in (c.get("memory") or {}).items() if not k.startswith("recovery-")]
    return f"{max(values) / 2**20:.0f}" if values else "-"
