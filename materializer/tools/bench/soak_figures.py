"""The soak's figures (``materializer bench --soak``): each series' least-squares slope per 1,000
epochs with its standard error and a verdict, the table printed per window, and the chart.

Plain Python, no JVM: the unit tests feed it windows by hand.
"""

from __future__ import annotations

import math
from typing import Any, Callable

PER = 1_000
"""Slopes are stated per this many epochs."""

PRACTICAL_FRACTION = 0.02
"""A slope smaller than this share of the series' mean per :data:`PER` epochs is flat whatever its
standard error: over a soak's windows a tiny, steady drift (a few kB of RSS) is significant to the
statistics and to nobody else."""

MIN_POINTS = 3
"""Fewer windows than this leave no degree of freedom for the slope's standard error."""


def slope(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """The least-squares line through (``xs``, ``ys``): its slope per :data:`PER` units of x, the
    slope's standard error (None below :data:`MIN_POINTS` points), the mean and the points used.
    None values of y are left out (a figure not measured in that window)."""
    points = [(float(x), float(y)) for x, y in zip(xs, ys) if y is not None]
    n = len(points)
    out: dict[str, Any] = {"points": n, "slope_per_1000": None, "se_per_1000": None, "mean": None}
    if n == 0:
        return out
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    out["mean"] = mean_y
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if n < 2 or sxx == 0:
        return out
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    out["slope_per_1000"] = b * PER
    if n >= MIN_POINTS:
        residuals = sum((y - (mean_y + b * (x - mean_x))) ** 2 for x, y in points)
        out["se_per_1000"] = math.sqrt(residuals / (n - 2) / sxx) * PER
    return out


def verdict(fit: dict[str, Any], practical: float = PRACTICAL_FRACTION) -> str:
    """``flat``: the slope is within two standard errors of zero, or below ``practical`` of the
    mean per 1,000 epochs; ``growing`` / ``shrinking`` otherwise; ``n/a``: too few windows."""
    b, se, mean = fit.get("slope_per_1000"), fit.get("se_per_1000"), fit.get("mean")
    if b is None or se is None:
        return "n/a"
    if abs(b) < 2 * se:
        return "flat"
    if mean is not None and mean != 0 and abs(b) < practical * abs(mean):
        return "flat"
    if mean == 0 and b == 0:
        return "flat"
    return "growing" if b > 0 else "shrinking"


# --- the series ------------------------------------------------------------------------------------

MB = 2**20

SERIES: list[tuple[str, str, Callable[[dict[str, Any]], float | None]]] = [
    ("driver_rss_mb", "driver (Python) RSS, MB", lambda w: _scaled(w["driver"].get("rss"), MB)),
    ("jvm_rss_mb", "JVM RSS, MB", lambda w: _scaled(w["jvm"].get("rss"), MB)),
    ("jvm_heap_after_gc_mb", "JVM live objects after a full GC, MB", lambda w: _scaled(w["jvm"].get("heap_after_gc"), MB)),
    ("jvm_heap_used_mb", "JVM heap used just after it (jstat), MB", lambda w: _scaled(w["jvm"].get("heap_used"), MB)),
    ("jvm_metaspace_mb", "JVM metaspace used, MB", lambda w: _scaled(w["jvm"].get("metaspace"), MB)),
    ("driver_fds", "driver open file descriptors", lambda w: w["driver"].get("fds")),
    ("jvm_fds", "JVM open file descriptors", lambda w: w["jvm"].get("fds")),
    ("epoch_seconds", "epoch wall, s (read start to applied, mean)", lambda w: w["epochs"].get("mean_seconds")),
    ("epoch_interval_seconds", "seconds between epochs applied (mean)", lambda w: w["epochs"].get("mean_interval")),
    ("epoch_cpu_seconds", "CPU s per epoch (driver + JVM)", lambda w: w["epochs"].get("cpu_per_epoch")),
    ("log_entries", "recovery-log entries", lambda w: w["log"].get("entries")),
    ("log_bytes", "recovery-log bytes", lambda w: w["log"].get("bytes")),
    ("staging_files", "staging files", lambda w: w["staging"].get("files")),
    ("table_live_files", "tables' live data files (sum)", lambda w: _sum(w["tables"], "live_files")),
    ("table_disk_files", "tables' data files on disk (sum)", lambda w: _sum(w["tables"], "disk_files")),
    ("delta_log_bytes", "tables' _delta_log bytes (sum)", lambda w: _sum(w["tables"], "delta_log_bytes")),
    ("delta_checkpoints", "tables' Delta checkpoints (sum)", lambda w: _sum(w["tables"], "checkpoints")),
]
"""The series every window gives: (name, label, its value in a window)."""

TABLE_SERIES = (("live_files", "live data files"), ("delta_log_bytes", "_delta_log bytes"))
"""Per table, also fitted one by one (the issue asks each table's file count and log size)."""


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value / unit


def _sum(tables: dict[str, dict[str, Any]], key: str) -> float | None:
    values = [t.get(key) for t in tables.values()]
    return None if not values or any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]


def fits(windows: list[dict[str, Any]], warmup_windows: int) -> dict[str, dict[str, Any]]:
    """Every series' fit over the windows after the first ``warmup_windows`` (the JVM's start, its
    JIT and class loading fall there), x being the epoch at each window's end."""
    used = windows[warmup_windows:]
    xs = [float(w["epoch"]) for w in used]
    out: dict[str, dict[str, Any]] = {}
    for name, label, get in SERIES:
        fit = slope(xs, [get(w) for w in used])
        out[name] = {"label": label, **fit, "verdict": verdict(fit)}
    tables = sorted(used[0]["tables"]) if used else []
    for table in tables:
        for key, label in TABLE_SERIES:
            fit = slope(xs, [w["tables"].get(table, {}).get(key) for w in used])
            out[f"table[{table}].{key}"] = {"label": f"{table}: {label}", **fit, "verdict": verdict(fit)}
    return out


# --- presentation ---------------------------------------------------------------------------------


WINDOW_COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("epoch", lambda w: f"{w['epoch']}"),
    ("min", lambda w: f"{w['elapsed'] / 60:.1f}"),
    ("drv RSS", lambda w: _fmt(_scaled(w["driver"].get("rss"), MB), 0)),
    ("JVM RSS", lambda w: _fmt(_scaled(w["jvm"].get("rss"), MB), 0)),
    ("heap GC", lambda w: _fmt(_scaled(w["jvm"].get("heap_after_gc"), MB), 1)),
    ("fds d/j", lambda w: f"{_fmt(w['driver'].get('fds'), 0)}/{_fmt(w['jvm'].get('fds'), 0)}"),
    ("epoch s", lambda w: _fmt(w["epochs"].get("mean_seconds"), 2)),
    ("every s", lambda w: _fmt(w["epochs"].get("mean_interval"), 2)),
    ("CPU/ep", lambda w: _fmt(w["epochs"].get("cpu_per_epoch"), 2)),
    ("log n/kB", lambda w: f"{_fmt(w['log'].get('entries'), 0)}/{_fmt(_scaled(w['log'].get('bytes'), 1024), 0)}"),
    ("staged", lambda w: _fmt(w["staging"].get("files"), 0)),
    ("files", lambda w: _fmt(_sum(w["tables"], "live_files"), 0)),
    ("dlog kB", lambda w: _fmt(_scaled(_sum(w["tables"], "delta_log_bytes"), 1024), 0)),
    ("ckpts", lambda w: _fmt(_sum(w["tables"], "checkpoints"), 0)),
]
"""The per-window table: heap after a full GC, fds of the driver / the JVM, tables' figures summed."""


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def window_header() -> str:
    return "  ".join(f"{name:>9}" for name, _ in WINDOW_COLUMNS)


def window_line(window: dict[str, Any]) -> str:
    return "  ".join(f"{get(window):>9}" for _, get in WINDOW_COLUMNS)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """What ``materializer bench --soak`` prints at the end: the windows, each slope, the stores."""
    lines = [window_header()] + [window_line(w) for w in report["windows"]]
    warmup = report["options"]["warmup_windows"]
    lines.append(f"slopes per {PER:,} epochs (least squares over windows {warmup + 1}-{len(report['windows'])}; "
                 f"flat: |slope| < 2 SE or < {PRACTICAL_FRACTION:.0%} of the mean):")
    for fit in report["slopes"].values():
        b, se = fit["slope_per_1000"], fit["se_per_1000"]
        shown = "-" if b is None else f"{b:+.4g}" + ("" if se is None else f" ± {se:.2g}")
        lines.append(f"  {fit['label']:<48} {shown:>22}  mean {_fmt(fit['mean'], 2):>10}  {fit['verdict']}")
    end = report["end"]
    lines.append(
        f"epochs {report['epochs']} ({report['partial_epochs']} with fewer bindings than {report['options']['bindings']}), "
        f"{report['seconds'] / 60:.1f} min; heap after GC: {report['heap_probe']}"
    )
    lines.append(
        f"stop: SIGTERM -> exit code {end['returncode']} in {_fmt(end.get('stop_seconds'), 1)} s; staging files left: "
        f"{end['staging']['files']} ({end['staging']['by_kind']}); tables agree with the files written: {end['tables_agree']}"
    )
    paths = report.get("paths") or {}
    lines.append(f"report: {paths.get('json')}  chart: {paths.get('chart')}")
    return lines


def chart(report: dict[str, Any], path: Any) -> None:
    """Six panels over the epochs: memory, descriptors, epoch time and CPU, the recovery log,
    staging, the tables."""
    from materializer.extras import require

    matplotlib = require("matplotlib", purpose="the soak's chart")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = report["windows"]
    x = [w["epoch"] for w in windows]
    get = {name: fn for name, _label, fn in SERIES}
    panels = [
        ("memory, MB", ["driver_rss_mb", "jvm_rss_mb", "jvm_heap_after_gc_mb", "jvm_heap_used_mb", "jvm_metaspace_mb"]),
        ("open file descriptors", ["driver_fds", "jvm_fds"]),
        ("epoch, s", ["epoch_seconds", "epoch_interval_seconds", "epoch_cpu_seconds"]),
        ("recovery log", ["log_entries"]),
        ("staging files", ["staging_files"]),
        ("tables (sums)", ["table_live_files", "table_disk_files", "delta_checkpoints"]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, names) in zip(axes.flat, panels):
        for name in names:
            ys = [get[name](w) for w in windows]
            if any(y is not None for y in ys):
                fit = report["slopes"].get(name, {})
                tag = "" if fit.get("slope_per_1000") is None else f" ({fit['slope_per_1000']:+.3g}/1k, {fit['verdict']})"
                ax.plot(x, [float("nan") if y is None else y for y in ys], marker="o", markersize=3, label=name + tag)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)
    options = report["options"]
    fig.suptitle(
        f"materializer bench --soak: {report['epochs']} epochs, {options['bindings']} bindings, "
        f"{options['rows']} documents per binding and epoch, {report['machine'].get('cpus')} CPUs"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
