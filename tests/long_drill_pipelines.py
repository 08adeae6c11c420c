"""The pipelines of the long drills in docs/operations.md ("Measured"), for running them again.

    python -m tests.long_drill_pipelines documents DIR   # writes DIR/source and DIR/prod/pipeline.yaml
    python -m tests.long_drill_pipelines kafka DIR       # starts a broker on loopback, fills the topic,
                                                         # writes DIR/prod/pipeline.yaml; runs until SIGTERM

Then start a Connect server (``tests/connect_server.py``'s ``start``; for kafka with
``session_jars(False, kafka=True)`` as its ``spark.jars``) and run ``materializer drill --remote``.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from tests.helpers import binding, write_config


def documents(root: Path) -> Path:
    """Three bindings (standard, delta_updates, sequence_by) on 20 files of 30 documents, 40 keys;
    every change carries its sequence ``n``, deletes too (sequence_by refuses one without)."""
    from tests.test_drill import make_collection

    source = make_collection(root / "source", files=20, per_file=30, keys=40, seed=11)
    n = 0
    for path in sorted(source.glob("*.jsonl")):
        docs = [json.loads(line) for line in path.read_text().splitlines()]
        for doc in docs:
            n += 1
            doc.setdefault("n", n)
        path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    prod = root / "prod"
    prod.mkdir(parents=True, exist_ok=True)
    return write_config(prod, [
        binding("items", source, prod / "tables" / "items"),
        binding("item_events", source, prod / "tables" / "item_events", mode="delta_updates"),
        binding("items_seq", source, prod / "tables" / "items_seq", sequence_by=["n"]),
    ], pipeline_id="long-drill")


def kafka(root: Path) -> None:
    """tests/test_kafka_drill.py's pipeline: 620 records in two waves, a partition added between."""
    from tests.kafka_broker import Broker
    from tests.test_kafka_drill import _pipeline

    broker = Broker(root / "broker").start()
    print(_pipeline(broker, root, "drill-long", 3, 400), flush=True)

    def stop(*_: object) -> None:
        broker.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        time.sleep(5)


if __name__ == "__main__":
    kind, folder = sys.argv[1], Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "documents":
        print(documents(folder))
    else:
        kafka(folder)
