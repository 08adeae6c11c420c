"""The benchmark's inputs: the seeded table, the generated documents (one file per epoch), the
same documents produced to a topic. Setup, never timed as part of a path."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEY = "id"
# The userMetadata of the seed commit: deliberately not the materializer's {"materializer": …} tag,
# so status/history never mistake the seed for a pipeline epoch.
SEED_TAG = "bench-seed"


def input_schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField(KEY, T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("amount", T.DoubleType()),
            T.StructField("qty", T.LongType()),
            T.StructField("updated", T.LongType()),
            T.StructField("_meta", T.StructType([T.StructField("op", T.StringType())])),
        ]
    )


SCHEMA_DDL = "id BIGINT, name STRING, amount DOUBLE, qty BIGINT, updated BIGINT"
"""The generated documents' fields: :func:`input_schema` without ``_meta``."""


def seed_table(spark: "SparkSession", path: Path, rows: int, deletion_vectors: bool = True) -> float:
    """Write the initial table with a plain Delta write (not the materializer), tagged as the seed."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    # Files of about 1M rows: MERGEs with random keys rewrite every file they touch, as they would
    # on a real table of this size with unclustered keys.
    partitions = max(1, rows // 1_000_000)
    df = spark.range(0, rows, numPartitions=partitions).select(
        F.col("id").alias(KEY),
        F.concat(F.lit("seed-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 10_000 / 100.0).alias("amount"),
        (F.col("id") % 97).alias("qty"),
        F.lit(0).cast("long").alias("updated"),
    )
    meta = json.dumps({SEED_TAG: {"rows": rows}})
    (
        df.write.format("delta")
        .mode("errorifexists")
        .option("userMetadata", meta)
        .option("delta.enableDeletionVectors", str(deletion_vectors).lower())
        .save(str(path))
    )
    return time.monotonic() - started


@dataclass
class Collection:
    files: list[Path]
    big_epochs: int
    alive: int
    """Keys the table must hold after every file is applied."""
    documents: int
    seconds: float


def generate_collection(
    folder: Path,
    table_rows: int,
    epoch_rows: int,
    epochs: int,
    ratios: tuple[float, float, float],
    seed: int,
    one_row: bool = True,
) -> Collection:
    """``epochs`` files of ``epoch_rows`` documents, then (``one_row``) one file of one update.

    Keys are distinct within a file (so the bare and peer MERGEs see one source row per key), updates
    and deletes pick live keys, inserts take fresh ones. Files get increasing mtimes because the
    streaming file source orders files by modification time.
    """
    import numpy as np

    started = time.monotonic()
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    alive = np.zeros(table_rows + epochs * epoch_rows + 1, dtype=bool)
    alive[:table_rows] = True
    next_id = table_rows
    files: list[Path] = []
    documents = 0
    insert_ratio, _update_ratio, delete_ratio = ratios
    plan = [epoch_rows] * epochs + ([1] if one_row else [])
    base_mtime = time.time() - 3600
    for index, size in enumerate(plan, start=1):
        if size == 1:
            n_ins, n_del = 0, 0
        else:
            n_ins = int(round(size * insert_ratio))
            n_del = int(round(size * delete_ratio))
        n_upd = size - n_ins - n_del
        live = np.flatnonzero(alive)
        picked = rng.choice(live, size=n_upd + n_del, replace=False) if n_upd + n_del else np.array([], dtype=np.int64)
        updates, deletes = picked[:n_upd], picked[n_upd:]
        inserts = np.arange(next_id, next_id + n_ins, dtype=np.int64)
        next_id += n_ins
        alive[inserts] = True
        alive[deletes] = False
        lines = [
            '{"id":%d,"name":"e%d-%d","amount":%.2f,"qty":%d,"updated":%d}\n' % (k, index, k, (k % 10_000) / 7.0, k % 89, index)
            for k in np.concatenate([inserts, updates]).tolist()
        ]
        lines += ['{"id":%d,"_meta":{"op":"d"}}\n' % k for k in deletes.tolist()]
        order = rng.permutation(len(lines))
        path = folder / f"epoch-{index:06d}.jsonl"
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(lines[i] for i in order.tolist())
        os.utime(path, (base_mtime + index, base_mtime + index))
        files.append(path)
        documents += size
    return Collection(files=files, big_epochs=epochs, alive=int(alive.sum()), documents=documents, seconds=time.monotonic() - started)


def copy_table(seed: Path, target: Path) -> None:
    # A Delta table's log references its files relatively: a folder copy is the same table.
    shutil.copytree(seed, target)


def produce_topic(bootstrap: str, topic: str, partitions: int, files: list[Path]) -> float:
    """The files' documents to a new topic, in file order, keyed by id (so a key's documents stay in
    one partition, in order). Setup, not measured; returns its seconds."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    started = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20, "batch.size": 1 << 20})
    for path in files:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                key = json.loads(line)[KEY]
                while True:
                    try:
                        producer.produce(topic, key=str(key).encode(), value=line.rstrip("\n").encode())
                        break
                    except BufferError:
                        producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"bench: could not produce every document to {topic}")
    return time.monotonic() - started
