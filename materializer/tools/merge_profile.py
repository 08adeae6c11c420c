"""What a MERGE of a small epoch costs into a table of N rows, by the way it runs: deletion vectors
written, the touched files rewritten (``transaction.copy_on_write_below_bytes``), or rewritten and
planned without generated code or adaptive re-planning (``transaction.interpreted_below_bytes``);
docs/performance.md "Small tables".

``python -m materializer.tools.merge_profile --rows 1000 --rows 100000 --rows 1000000``

For each N: one one-file table per way, with deletion vectors on, then MERGEs of the same epoch
(``--epoch-rows`` rows, staged as Parquet: half of them updates, half inserts; one row, an update)
in turn into each; CPU seconds of the local JVM (which runs the tasks too) and its children and
wall seconds per MERGE, medians after the warm-up rounds. Every table must end with the same rows.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from materializer.merge.writer import MATERIALIZE_SOURCE, MERGE_DELETION_VECTORS
from materializer.spark.settings import INTERPRETED

MODES: dict[str, dict[str, str]] = {
    "deletion vectors": {MERGE_DELETION_VECTORS: "true"},
    "files rewritten": {MERGE_DELETION_VECTORS: "false"},
    "rewritten, interpreted": {MERGE_DELETION_VECTORS: "false", **INTERPRETED},
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m materializer.tools.merge_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, action="append", help="table rows (repeat; default 1000, 100000, 1000000)")
    parser.add_argument("--merges", type=int, default=5, help="measured MERGEs per way and size (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="MERGE pairs not counted (default 2)")
    parser.add_argument("--epoch-rows", type=int, default=1, help="rows of each MERGE's source (default 1)")
    parser.add_argument("--only", action="append", help="only the ways whose name holds this (repeat; default all)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    from materializer.spark import active_session, build_session, stop_session

    from materializer.tools.bench.measurement import cpu_seconds

    ours = active_session() is None  # else a host's (a test's), left running
    spark = build_session(args.master, {"spark.ui.enabled": "false"}, app_name="merge-profile")

    def jvm_cpu() -> float:
        _python, jvm, workers = cpu_seconds()  # the local JVM (it runs the tasks too) and its children
        return jvm + workers

    root = Path(tempfile.mkdtemp(prefix="merge-profile-"))
    spark.conf.set(MATERIALIZE_SOURCE, "none")  # as the materializer's applies run
    modes = {name: conf for name, conf in MODES.items() if not args.only or any(o in name for o in args.only)}
    own = {key: spark.conf.get(key, None) for conf in modes.values() for key in conf}
    print(f"{'rows':>10} {'MB':>8}  {'way':<22} {'JVM CPU s':>9} {'wall s':>7}   (epochs of {args.epoch_rows} rows)")
    try:
        for n in args.rows or [1000, 100_000, 1_000_000]:
            tables = {mode: str(root / f"{n}-{i}") for i, mode in enumerate(modes)}
            for table in tables.values():
                (
                    spark.range(n).selectExpr("id", "concat('value-', id, '-', sha1(cast(id AS string))) AS v", "id * 3 AS n")
                    .coalesce(1).write.format("delta").option("delta.enableDeletionVectors", "true").save(table)
                )
            first = next(iter(tables.values()))
            size = sum(f.stat().st_size for f in Path(first).glob("*.parquet"))
            seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
            for i in range(args.warmup + args.merges):
                k = args.epoch_rows
                staged = str(root / f"epoch-{n}-{i}")
                # k distinct keys: one row updates a row of the table; more, half update and half insert.
                keys = f"({i * 7919} % {n})" if k == 1 else f"IF(id % 2 = 0, ({i} * 104729 + id * 7919) % {n}, {n} + {i} * {k} + id)"
                (
                    spark.range(k).selectExpr(f"{keys} AS id", f"concat('new-{i}-', id) AS v", f"{i} AS n")
                    .dropDuplicates(["id"]).coalesce(1).write.parquet(staged)
                )
                for mode in (list(modes) if i % 2 == 0 else list(modes)[::-1]):
                    for key, value in modes[mode].items():
                        spark.conf.set(key, value)
                    cpu, wall = jvm_cpu(), time.perf_counter()
                    spark.sql(
                        f"MERGE INTO delta.`{tables[mode]}` t USING parquet.`{staged}` s ON t.id = s.id "
                        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
                    ).collect()
                    if i >= args.warmup:
                        seconds[mode].append((jvm_cpu() - cpu, time.perf_counter() - wall))
                    for key in modes[mode]:
                        # Back to the session's own (set where the session was built, or unset).
                        spark.conf.unset(key) if own[key] is None else spark.conf.set(key, own[key])
            for mode, measured in seconds.items():
                cpu_s = statistics.median(c for c, _ in measured)
                wall_s = statistics.median(w for _, w in measured)
                print(f"{n:>10} {size / 1e6:>8.2f}  {mode:<22} {cpu_s:>9.2f} {wall_s:>7.2f}", flush=True)
            first_table, *others = (spark.read.format("delta").load(t) for t in tables.values())
            for other in others:
                if first_table.exceptAll(other).count() or other.exceptAll(first_table).count():
                    raise SystemExit(f"{n} rows: the tables differ after the same MERGEs")
    finally:
        spark.conf.unset(MATERIALIZE_SOURCE)
        shutil.rmtree(root, ignore_errors=True)
        if ours:  # and its JVM, so the process's CPU as the system counts it is all of it
            stop_session(spark)


if __name__ == "__main__":
    main()
