"""conf/prometheus/alerts.yml and conf/grafana/materializer-dashboard.json name only series the
exporter has: every metric and label in their expressions is checked against a PrometheusCollector
fed one progress record with every field set. No JVM, no promtool (the rule file is parsed here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from materializer import events
from materializer.events import BindingProgress, EpochProgress
from materializer.metrics import PrometheusCollector

REPO = Path(__file__).resolve().parent.parent
ALERTS = REPO / "conf" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "conf" / "grafana" / "materializer-dashboard.json"

METRIC = re.compile(r"\bmaterializer_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\b([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"")
DURATION = re.compile(r"^\d+[smhd]$")


def _every_field_set() -> EpochProgress:
    binding = BindingProgress(
        binding="orders", table="/t/orders", documents=10, bytes_read=1000, rows_staged=9, bytes_staged=800,
        status="applied", inserted=5, updated=3, deleted=1, delta_version=4, apply_seconds=1.5, lag_files=2,
        lag_bytes=300, dead_letters=1, lag_records=40, oldest_unread_ms=5000, delete_retention_ms=86_400_000,
        conflicts_retried=1, lag_seconds=12.5,
    )
    return EpochProgress(
        pipeline_id="p", epoch=3, started_at="t0", committed_at="t1", applied_at="t2", reapplied=False, documents=10,
        bytes_read=1000, rows_staged=9, bytes_staged=800, inserted=5, updated=3, deleted=1, applied=1, skipped=0,
        phase_seconds={"read": 0.5, "stage": 1.0, "log_commit": 0.01, "apply": 1.5}, lag_files=2, lag_bytes=300,
        bindings=(binding,), dead_letters=1, lag_records=40, oldest_unread_ms=5000, delete_retention_ms=86_400_000,
        conflicts_retried=1, lag_seconds=12.5,
    )


@pytest.fixture(scope="module")
def exported() -> tuple[set[str], set[str]]:
    """(series names, label names) the collector exports once it has seen a whole record."""
    metrics = PrometheusCollector("p")
    metrics.emit(events.Progress(_every_field_set()))
    names: set[str] = set()
    labels: set[str] = set()
    for family in metrics.registry.collect():
        for sample in family.samples:  # counters as _total, histograms as _bucket/_sum/_count
            names.add(sample.name)
            labels.update(sample.labels)
    return names, labels


def _check_expression(expr: str, where: str, exported: tuple[set[str], set[str]]) -> set[str]:
    names, labels = exported
    assert expr.count("(") == expr.count(")"), f"{where}: unbalanced parentheses in {expr!r}"
    used = set(METRIC.findall(expr))
    assert used, f"{where}: no materializer metric in {expr!r}"
    unknown = used - names
    assert not unknown, f"{where}: {sorted(unknown)} are not exported (exported: {sorted(n for n in names if not n.endswith('_created'))})"
    grouped = {name.strip() for group in GROUPING.findall(expr) for name in group.split(",") if name.strip()}
    matched = set(MATCHER.findall(expr))
    assert grouped | matched <= labels, f"{where}: labels {sorted((grouped | matched) - labels)} are not exported"
    return used


def _rules() -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        assert group["name"] and group["rules"]
        yield from group["rules"]


def test_the_alert_rules_use_only_exported_series(exported: tuple[set[str], set[str]]) -> None:
    rules = list(_rules())
    assert {r["alert"] for r in rules} == {
        "MaterializerLagHigh", "MaterializerLagGrowing", "MaterializerStalled", "MaterializerCommitConflicts",
    }
    used: set[str] = set()
    for rule in rules:
        where = f"alerts.yml {rule['alert']}"
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, where
        assert DURATION.match(rule["for"]), f"{where}: 'for' {rule['for']!r} is not a duration"
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, where
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], where
        used |= _check_expression(rule["expr"], where, exported)
    # What the rules are about (docs: 'Alerting').
    assert {
        "materializer_source_lag_seconds", "materializer_last_applied_timestamp_seconds",
        "materializer_commit_conflicts_retried_total",
    } <= used


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_the_dashboard_uses_only_exported_series_and_its_variables(exported: tuple[set[str], set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    _check_expression(variables["pipeline"]["definition"], "dashboard variable pipeline", exported)
    used: set[str] = set()
    ids = []
    for panel in _panels(dashboard):
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        where = f"dashboard panel {panel['title']!r}"
        assert panel["datasource"]["uid"] == "${datasource}", where
        assert panel["targets"], where
        for target in panel["targets"]:
            expr = target["expr"]
            used |= _check_expression(expr, where, exported)
            # Every selector follows the pipeline picked at the top.
            assert expr.count("{") == expr.count('pipeline=~"$pipeline"'), f"{where}: a selector without the pipeline variable"
    assert len(ids) == len(set(ids)), "panel ids repeat"
    wanted = {
        "materializer_epochs_total", "materializer_last_applied_timestamp_seconds", "materializer_source_lag_seconds",
        "materializer_source_lag_records", "materializer_source_lag_files", "materializer_source_lag_bytes",
        "materializer_phase_seconds_bucket", "materializer_rows_staged_total", "materializer_merge_rows_total",
        "materializer_applies_total", "materializer_commit_conflicts_retried_total",
    }
    assert wanted <= used, f"no panel for {sorted(wanted - used)}"


def test_a_metric_the_exporter_lacks_is_caught(exported: tuple[set[str], set[str]]) -> None:
    with pytest.raises(AssertionError, match="not exported"):
        _check_expression("rate(materializer_epochs[5m])", "here", exported)  # the counter is _total
    with pytest.raises(AssertionError, match="labels"):
        _check_expression("sum by (table) (materializer_source_lag_seconds)", "here", exported)
