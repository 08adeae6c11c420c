"""The bench's chart draws only what was measured (no Spark: a small report dict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from materializer.tools.bench import FIXED_COSTS, chart, chart_figure, fixed_costs


def _config(name: str, *, recovery: bool) -> dict[str, Any]:
    return {
        "name": name,
        "ours": {"median_total_seconds": 2.0, "median_apply_seconds": 1.0, "one_row_seconds": 1.5},
        "bare": {"median_stage_seconds": 0.5, "median_merge_seconds": 1.0},
        "replay": {"reapply_seconds": 0.2},
        # --no-recovery: the report has no recovery figures at all
        **({"recovery": {"replay_restart_seconds": 12.0, "restart_seconds": 20.0}} if recovery else {}),
    }


def _report(*configs: dict[str, Any]) -> dict[str, Any]:
    return {"configs": list(configs), "options": {"mode": "quick"}, "machine": {"cpus": 2}}


def test_unmeasured_figures_are_none_not_a_value() -> None:
    values = dict(zip(FIXED_COSTS, fixed_costs(_config("small", recovery=False))))
    assert values["replay (fresh process)"] is None and values["restart after kill"] is None
    assert values["1-row batch (peer)"] is None  # no peer in this report
    assert values["replay (ours, warm)"] == 0.2


def test_the_chart_draws_no_bar_for_a_figure_not_measured(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = chart_figure(_report(_config("small", recovery=False), _config("big", recovery=True)))
    try:
        right = fig.axes[1]
        heights = sorted(round(p.get_height(), 3) for p in right.patches)
        # small: replay + 1-row; big: replay + 1-row + both recovery figures. No 1 ms stand-ins.
        assert heights == [0.2, 0.2, 1.5, 1.5, 12.0, 20.0]
        notes = [t.get_text() for t in right.texts]
        assert notes.count("not measured") == 4  # small: peer, fresh-process replay, restart; big: peer
    finally:
        plt.close(fig)
    chart(_report(_config("small", recovery=False)), tmp_path / "chart.png")
    assert (tmp_path / "chart.png").stat().st_size > 0
