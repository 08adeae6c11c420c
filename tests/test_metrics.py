"""Prometheus metrics: scraped over loopback during a real (following) run, and as a textfile."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from materializer.config import load_config
from materializer.metrics import PrometheusCollector
from materializer.progress import ProgressTracker
from materializer.runtime import Runtime
from tests.helpers import binding, write_config, write_jsonl
from tests.test_progress import _feed


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_a_textfile_holds_the_records_counters(tmp_path: Path) -> None:
    metrics = PrometheusCollector("p")
    path = tmp_path / "textfile" / "materializer.prom"
    metrics.textfile(str(path))
    tracker = ProgressTracker(metrics, "p")
    _feed(tracker, 1)
    _feed(tracker, 2)
    samples = _samples(path.read_text())
    assert samples[("materializer_epochs_total", (("pipeline", "p"),))] == 2
    assert samples[("materializer_last_applied_epoch", (("pipeline", "p"),))] == 2
    assert samples[("materializer_merge_rows_total", (("action", "updated"), ("binding", "a"), ("pipeline", "p")))] == 2
    assert samples[("materializer_applies_total", (("binding", "b"), ("pipeline", "p"), ("status", "skipped")))] == 2
    assert samples[("materializer_source_lag_files", (("binding", "a"), ("pipeline", "p")))] == 2
    assert samples[("materializer_phase_seconds_count", (("phase", "apply"), ("pipeline", "p")))] == 2
    assert not list(path.parent.glob("*.tmp*"))  # written by rename


@pytest.mark.spark
def test_the_endpoint_is_scraped_over_loopback_during_a_following_run(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_jsonl(src / "f-001.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "c"}])
    write_jsonl(src / "f-002.jsonl", [{"id": 1, "v": "A"}, {"id": 2, "_meta": {"op": "d"}}, {"id": 4, "v": "d"}])
    config = load_config(
        write_config(
            tmp_path,
            [binding("items", src, tmp_path / "tables" / "items", max_files=1)],
            pipeline_id="scraped",
            transaction={"poll_interval_seconds": 0.1},
        )
    )
    metrics = PrometheusCollector(config.pipeline_id)
    host, port, server = metrics.serve(0)  # loopback by default, any free port
    assert host == "127.0.0.1" and server.server_address[0] == "127.0.0.1"
    stop = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["summary"] = Runtime(config, spark, metrics).run(follow=True, should_stop=stop.is_set)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    url = f"http://127.0.0.1:{port}/metrics"
    samples: dict[Any, float] = {}
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and "error" not in outcome:
            with urllib.request.urlopen(url, timeout=10) as response:
                samples = _samples(response.read().decode())
            if samples.get(("materializer_epochs_total", (("pipeline", "scraped"),)), 0) >= 2:
                break
            time.sleep(0.2)
        # Scraped while the run is still following (it stops only when told).
        assert runner.is_alive() and "error" not in outcome, outcome
    finally:
        stop.set()
        runner.join(timeout=300)
        server.shutdown()
    assert "error" not in outcome, outcome
    p, b = ("pipeline", "scraped"), ("binding", "items")
    assert samples[("materializer_epochs_total", (p,))] == 2
    assert samples[("materializer_last_applied_epoch", (p,))] == 2
    assert samples[("materializer_documents_read_total", (b, p))] == 6
    # Epoch 1 creates the table with 3 rows; epoch 2's MERGE: +1 ~1 -1.
    assert samples[("materializer_merge_rows_total", (("action", "inserted"), b, p))] == 4
    assert samples[("materializer_merge_rows_total", (("action", "updated"), b, p))] == 1
    assert samples[("materializer_merge_rows_total", (("action", "deleted"), b, p))] == 1
    assert samples[("materializer_applies_total", (b, p, ("status", "applied")))] == 2
    assert samples[("materializer_phase_seconds_count", (("phase", "log_commit"), p))] == 2


def test_a_one_shot_run_pushes_to_a_gateway(tmp_path: Path) -> None:
    import http.server

    received: list[tuple[str, str, bytes]] = []

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 - http.server's name
            received.append((self.command, self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        metrics = PrometheusCollector("p")
        _feed(ProgressTracker(metrics, "p"), 1)
        metrics.push(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    ((method, path, body),) = received
    assert (method, path) == ("PUT", "/metrics/job/materializer/pipeline/p")
    assert 'materializer_epochs_total{pipeline="p"} 1.0' in body.decode()
