"""The benchmark's options (``materializer bench``'s flags) and the Spark session they describe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

QUICK_TABLE_ROWS = [100_000]
QUICK_EPOCH_ROWS = [10_000]
FULL_TABLE_ROWS = [1_000_000, 10_000_000]
FULL_EPOCH_ROWS = [10_000, 100_000, 1_000_000]


@dataclass
class BenchOptions:
    table_rows: list[int] = field(default_factory=lambda: list(QUICK_TABLE_ROWS))
    epoch_rows: list[int] = field(default_factory=lambda: list(QUICK_EPOCH_ROWS))
    epochs: int = 3
    """Big epochs per configuration (one one-row epoch is added after them)."""
    insert_ratio: float = 0.5
    update_ratio: float = 0.4
    delete_ratio: float = 0.1
    out: Path = Path(".bench")
    seed: int = 7
    peer: bool = True
    replay: bool = True
    recovery: bool = True
    """Kill-and-restart in subprocesses (two extra JVM start-ups per configuration)."""
    master: str = "local[*]"
    driver_memory: str = "2g"
    shuffle_partitions: int | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    """Extra Spark settings for every path (e.g. ``spark.sql.adaptive.enabled=false``)."""
    one_row_epoch: bool = True
    """Follow the big epochs with a one-document epoch (the fixed cost of an epoch)."""
    warmup: bool = True
    """Run every path once on a tiny table first, so JIT and class loading are not charged to the first path."""
    keep_data: bool = False
    """Keep the generated inputs and tables under the run folder (they are deleted by default)."""
    declared_schema: bool = True
    """Ours reads with the documents' schema declared (``source.schema``), as bare and peer are
    given it; False makes ours infer each epoch's types (one more Spark pass per epoch)."""
    interleave: bool = True
    """Epoch by epoch, every path in turn (ours then runs one epoch per run: nothing pipelined);
    False: each path runs all its epochs before the next path starts."""
    pipelined: bool = True
    """Ours applies epoch N while reading N+1 (``transaction.pipelined``; with ``interleave`` off only)."""
    kafka: str | None = None
    """Bootstrap servers of a Kafka broker: also measure ours reading the same documents from a topic."""
    kafka_partitions: int = 2
    """Partitions of the benchmark's topic."""
    deletion_vectors: bool = True
    """The seeded table has deletion vectors, as a table the materializer creates has by default
    (every approach gets a copy of it); False: the seed of the runs before issue #18."""
    mode: str = "custom"

    def __post_init__(self) -> None:
        total = self.insert_ratio + self.update_ratio + self.delete_ratio
        if any(r < 0 for r in (self.insert_ratio, self.update_ratio, self.delete_ratio)) or abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"insert/update/delete ratios must be non-negative and sum to 1, got "
                f"{self.insert_ratio}/{self.update_ratio}/{self.delete_ratio}"
            )
        if self.epochs < 1:
            raise ValueError("epochs must be at least 1")

    @classmethod
    def quick(cls, **overrides: Any) -> "BenchOptions":
        return cls(mode="quick", **{"table_rows": list(QUICK_TABLE_ROWS), "epoch_rows": list(QUICK_EPOCH_ROWS), **overrides})

    @classmethod
    def full(cls, **overrides: Any) -> "BenchOptions":
        return cls(mode="full", **{"table_rows": list(FULL_TABLE_ROWS), "epoch_rows": list(FULL_EPOCH_ROWS), **overrides})


def session_conf(options: BenchOptions) -> dict[str, str]:
    conf = {"spark.driver.memory": options.driver_memory}
    if options.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(options.shuffle_partitions)
    conf.update(options.spark_conf)
    return conf


def session(options: BenchOptions) -> "SparkSession":
    """The one builder (materializer.spark.session_for) with the bench's own master and settings:
    there is no pipeline config to take them from (config_session), and never a Connect server (the
    bench samples the memory and CPU of its own JVM, a child of this process)."""
    from materializer.spark import session_for

    return session_for(options.master, session_conf(options), app_name="materializer-bench", kafka=bool(options.kafka))
