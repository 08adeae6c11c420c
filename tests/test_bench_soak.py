"""``materializer bench --soak`` (issue #68): the slopes and their verdicts, the feeder's rows, the
probes' parsing, without a JVM; and a tiny soak end to end through the CLI, its tables read by
delta-rs against the files it wrote, folded here on their own."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from materializer.tools.bench.soak import EventsTail, Feeder
from materializer.tools.bench.soak_figures import SERIES, fits, slope, summary_lines, verdict
from materializer.tools.bench.soak_probes import parse_histogram_total, parse_jstat_gc, staging_store

# --- slopes, no JVM -------------------------------------------------------------------------------


def test_a_straight_line_has_its_slope_per_thousand_epochs_and_no_error() -> None:
    fit = slope([250, 500, 750, 1000], [100.0, 101.0, 102.0, 103.0])  # +1 per 250 epochs
    assert fit["slope_per_1000"] == pytest.approx(4.0)
    assert fit["se_per_1000"] == pytest.approx(0.0, abs=1e-9)
    assert fit["mean"] == pytest.approx(101.5) and fit["points"] == 4


def test_the_slope_and_its_standard_error_match_the_textbook_formulas() -> None:
    xs = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
    ys = [10.0, 12.5, 11.0, 14.0, 13.5, 16.0]
    fit = slope(xs, ys)
    expected = statistics.linear_regression(xs, ys)
    assert fit["slope_per_1000"] == pytest.approx(expected.slope * 1000)
    residuals = [y - (expected.intercept + expected.slope * x) for x, y in zip(xs, ys)]
    mean_x = sum(xs) / len(xs)
    se = (sum(r * r for r in residuals) / (len(xs) - 2) / sum((x - mean_x) ** 2 for x in xs)) ** 0.5
    assert fit["se_per_1000"] == pytest.approx(se * 1000)


def test_windows_not_measured_are_left_out_and_two_points_give_no_error() -> None:
    assert slope([1, 2, 3], [5.0, None, 7.0])["points"] == 2  # type: ignore[list-item]
    fit = slope([1, 2], [5.0, 7.0])
    assert fit["slope_per_1000"] == pytest.approx(2000.0) and fit["se_per_1000"] is None
    assert verdict(fit) == "n/a"
    assert slope([], [])["slope_per_1000"] is None


@pytest.mark.parametrize(
    ("fit", "expected"),
    [
        ({"slope_per_1000": 5.0, "se_per_1000": 3.0, "mean": 100.0}, "flat"),  # within two standard errors
        ({"slope_per_1000": 5.0, "se_per_1000": 1.0, "mean": 100.0}, "growing"),  # 5% of the mean, five SEs
        ({"slope_per_1000": -5.0, "se_per_1000": 1.0, "mean": 100.0}, "shrinking"),
        ({"slope_per_1000": 1.0, "se_per_1000": 0.01, "mean": 1000.0}, "flat"),  # significant, but 0.1% of the mean
        ({"slope_per_1000": 0.0, "se_per_1000": 0.0, "mean": 0.0}, "flat"),  # a store always empty
        ({"slope_per_1000": 2.0, "se_per_1000": None, "mean": 10.0}, "n/a"),  # two windows
    ],
)
def test_the_verdict_is_flat_within_two_errors_or_below_the_practical_share(fit: dict[str, Any], expected: str) -> None:
    assert verdict(fit) == expected


def _window(epoch: int, rss: float, files: int) -> dict[str, Any]:
    return {
        "window": epoch // 10, "epoch": epoch, "elapsed": float(epoch),
        "driver": {"rss": rss * 2**20, "cpu": 1.0, "fds": 20}, "jvm": {"rss": 900 * 2**20, "cpu": 2.0, "fds": 300, "heap_after_gc": None},
        "epochs": {"mean_seconds": 1.0, "mean_interval": 1.0, "cpu_per_epoch": 0.5},
        "log": {"entries": 10, "bytes": 1000}, "staging": {"files": 0, "by_kind": {}},
        "tables": {"b00": {"live_files": files, "disk_files": files, "delta_log_bytes": 100 * epoch, "checkpoints": epoch // 100}},
    }


def test_fits_leave_the_warm_up_windows_out_and_fit_every_series_and_table() -> None:
    # The first window's RSS is the JVM's start (far higher); after it, RSS grows 1 MB per 10 epochs.
    windows = [_window(10, 500.0, 3)] + [_window(e, 100.0 + e / 10, 3) for e in (20, 30, 40, 50)]
    slopes = fits(windows, warmup_windows=1)
    assert set(slopes) >= {name for name, _label, _get in SERIES}
    assert slopes["driver_rss_mb"]["slope_per_1000"] == pytest.approx(100.0) and slopes["driver_rss_mb"]["points"] == 4
    assert slopes["driver_rss_mb"]["verdict"] == "growing"
    assert slopes["table_live_files"]["verdict"] == "flat"
    assert slopes["jvm_heap_after_gc_mb"]["verdict"] == "n/a"  # not measured: no figure is made up
    assert slopes["table[b00].delta_log_bytes"]["slope_per_1000"] == pytest.approx(100_000.0)
    with_warmup = fits(windows, warmup_windows=0)
    assert with_warmup["driver_rss_mb"]["slope_per_1000"] < 0  # the start's RSS would hide the growth


def test_the_summary_prints_each_window_and_each_slope() -> None:
    windows = [_window(e, 100.0, 3) for e in (10, 20, 30)]
    report = {
        "windows": windows, "slopes": fits(windows, 0), "options": {"warmup_windows": 0, "bindings": 1},
        "epochs": 30, "partial_epochs": 0, "seconds": 60.0, "heap_probe": "jcmd",
        "end": {"returncode": 0, "stop_seconds": 1.0, "staging": {"files": 0, "by_kind": {}}, "tables_agree": True},
        "paths": {"json": "r.json", "chart": "soak.png"},
    }
    lines = summary_lines(report)
    assert len([line for line in lines if line.strip().startswith(("10 ", "20 ", "30 "))]) == 3
    assert any("driver (Python) RSS" in line and "flat" in line for line in lines)
    assert any("exit code 0" in line and "agree with the files written: True" in line for line in lines)


# --- the feeder and the probes, no JVM ------------------------------------------------------------


def _fold(folder: Path) -> dict[int, int]:
    """The rows a folder's files leave, folded here in file order: the test's own oracle."""
    rows: dict[int, int] = {}
    for path in sorted(folder.glob("round-*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            if (doc.get("_meta") or {}).get("op") == "d":
                rows.pop(doc["id"], None)
            else:
                rows[doc["id"]] = doc["v"]
    return rows


def test_the_feeder_writes_whole_files_of_distinct_keys_and_knows_the_rows_they_leave(tmp_path: Path) -> None:
    sources = [tmp_path / "b00", tmp_path / "b01"]
    for folder in sources:
        folder.mkdir()
    feeder = Feeder(sources, rows=10, seed=3)
    for _ in range(30):
        feeder.write_round()
    assert feeder.documents == 2 * 30 * 10
    for b, folder in enumerate(sources):
        files = sorted(folder.glob("round-*.jsonl"))
        assert len(files) == 30 and not list(folder.glob(".*"))  # no hidden file left
        for path in files:
            keys = [json.loads(line)["id"] for line in path.read_text().splitlines()]
            assert len(keys) == 10 == len(set(keys))
        assert _fold(folder) == feeder.expected[b]
        deleted = sum('"op": "d"' in p.read_text() for p in files)
        assert deleted > 0  # deletes are fed too


def test_the_events_tail_reads_progress_records_as_the_file_grows(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventsTail(path)
    tail.poll()  # no file yet
    record = {"event": "progress", "epoch": 1, "documents": 40, "reapplied": False, "started_at": "2026-01-01T00:00:00+00:00",
              "applied_at": "2026-01-01T00:00:02.500000+00:00", "bindings": [{"documents": 20}, {"documents": 20}]}
    reapplied = {**record, "epoch": 0, "reapplied": True, "started_at": None}
    line = json.dumps(record)
    path.write_text(json.dumps(reapplied) + "\n" + line[:30])  # the second line half written
    tail.poll()
    assert tail.epochs == []
    with open(path, "a") as stream:
        stream.write(line[30:] + "\n")
    tail.poll()
    assert [(e["epoch"], e["bindings"], e["applied"] - e["started"]) for e in tail.epochs] == [(1, 2, 2.5)]
    assert tail.documents == 40


def test_jstat_gc_gives_the_heap_used_and_metaspace_in_bytes() -> None:
    text = (
        " S0C    S1C    S0U    S1U      EC       EU        OC         OU       MC     MU    CCSC   CCSU   YGC     YGCT    FGC    FGCT     CGC    CGCT     GCT\n"
        " 0.0   4096.0  0.0   1024.0  65536.0   2048.0   131072.0   51200.0  81920.0 80000.0 9216.0 8500.0  12  0.100  2  0.300  4  0.010  0.410\n"
    )
    assert parse_jstat_gc(text) == {"heap_used": (1024 + 2048 + 51200) * 1024, "metaspace": 80000 * 1024}
    with pytest.raises(ValueError):
        parse_jstat_gc("")


def test_the_class_histogram_gives_the_live_objects_bytes() -> None:
    text = (
        "42:\n num     #instances         #bytes  class name (module)\n-------------------------------------------------------\n"
        "   1:        120000       9600000  [B (java.base@17.0.15)\n   2:         50000       1200000  java.lang.String (java.base@17.0.15)\n"
        "Total        170000      10800000\n"
    )
    assert parse_histogram_total(text) == 10_800_000
    with pytest.raises(ValueError):
        parse_histogram_total("42:\nCommand executed\n")


def test_staging_files_are_counted_by_kind(tmp_path: Path) -> None:
    for rel in ("p/staged/epoch-000000000001/b00-x/part-0.parquet", "p/spool/w/epoch-2/b00.jsonl", "p/_tmp/f"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert staging_store(tmp_path)["by_kind"] == {"staged": 1, "spool": 1, "_tmp": 1}
    assert staging_store(tmp_path / "absent") == {"files": 0, "bytes": 0, "by_kind": {}}


# --- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow  # about 90 s on two shared cores: a JVM, 9 epochs, three full GCs
@pytest.mark.subprocess
def test_a_tiny_soak_through_the_cli_reports_windows_slopes_and_tables_equal_to_the_files(tmp_path: Path) -> None:
    from tests.helpers import delta_rs_list, run_cli

    out = tmp_path / "out"
    result = run_cli(
        "bench", "--soak", "--soak-bindings", "2", "--soak-epochs", "9", "--soak-sample-every", "3", "--soak-rows", "6",
        "--soak-minutes", "4", "--soak-warmup-windows", "0", "--poll-interval", "0.2", "--out", str(out), "--keep-data", "--json",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["stop_reason"] == "epochs" and report["rounds_written"] == 9
    assert [w["epoch"] for w in report["windows"]] == [3, 6, 9]
    assert report["epochs"] >= 9 and report["documents"]["applied"] == report["documents"]["written"] == 2 * 9 * 6
    for window in report["windows"]:
        assert window["driver"]["rss"] > 0 and window["jvm"]["rss"] > 0 and window["jvm"]["fds"] > 0
        assert window["jvm"]["heap_after_gc"] is not None or window["jvm"].get("heap_error")
        if window["jvm"]["heap_after_gc"] is not None:  # the live objects, within the heap jstat saw used
            assert 0 < window["jvm"]["heap_after_gc"] <= window["jvm"]["heap_used"] + 64 * 2**20
        assert window["epochs"]["count"] == 3 and window["epochs"]["mean_seconds"] > 0 and window["epochs"]["cpu_per_epoch"] > 0
        assert window["log"]["entries"] > 0 and set(window["tables"]) == {"b00", "b01"}
    for name, _label, _get in SERIES:
        assert name in report["slopes"]
    assert report["slopes"]["driver_rss_mb"]["se_per_1000"] is not None  # three windows: a slope and its error
    assert report["slopes"]["driver_rss_mb"]["verdict"] in ("flat", "growing", "shrinking")
    end = report["end"]
    assert end["returncode"] == 0 and not end["killed"], "SIGTERM is a graceful stop"
    assert end["staging_empty"], end["staging"]
    assert end["tables_agree"], end["tables"]
    data = Path(report["paths"]["json"]).parent / "data"
    for binding in ("b00", "b01"):
        rows = {r["id"]: r["v"] for r in delta_rs_list(data / "tables" / binding)}
        assert rows == _fold(data / "source" / binding)  # the test's own fold of the files written
    assert Path(report["paths"]["chart"]).stat().st_size > 0
