"""What a one-row update MERGE costs into a table of N rows, deletion vectors written or the touched
files rewritten (``transaction.copy_on_write_below_bytes``, docs/performance.md "Small tables").

``python -m materializer.tools.merge_profile --rows 1000 --rows 100000 --rows 1000000``

For each N: two one-file tables with deletion vectors on, then one-row update MERGEs alternated
between them, one writing deletion vectors and one rewriting the file it touches (Delta's
``merge.deletionVectors.persistent``); CPU seconds of the local JVM (which runs the tasks too) and its children
and wall seconds per MERGE, medians after the warm-up pairs. Both tables must end with the same rows.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from materializer.merge.writer import MATERIALIZE_SOURCE, MERGE_DELETION_VECTORS

MODES = {"deletion vectors": "true", "files rewritten": "false"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m materializer.tools.merge_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, action="append", help="table rows (repeat; default 1000, 100000, 1000000)")
    parser.add_argument("--merges", type=int, default=5, help="measured MERGEs per way and size (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="MERGE pairs not counted (default 2)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    from materializer.spark import build_session

    from materializer.tools.bench.measurement import cpu_seconds

    spark = build_session(args.master, {"spark.ui.enabled": "false"}, app_name="merge-profile")

    def jvm_cpu() -> float:
        _python, jvm, workers = cpu_seconds()  # the local JVM (it runs the tasks too) and its children
        return jvm + workers

    root = Path(tempfile.mkdtemp(prefix="merge-profile-"))
    spark.conf.set(MATERIALIZE_SOURCE, "none")  # as the materializer's applies run
    print(f"{'rows':>10} {'MB':>8}  {'way':<17} {'JVM CPU s':>9} {'wall s':>7}")
    try:
        for n in args.rows or [1000, 100_000, 1_000_000]:
            tables = {mode: str(root / f"{n}-{i}") for i, mode in enumerate(MODES)}
            for table in tables.values():
                (
                    spark.range(n).selectExpr("id", "concat('value-', id, '-', sha1(cast(id AS string))) AS v", "id * 3 AS n")
                    .coalesce(1).write.format("delta").option("delta.enableDeletionVectors", "true").save(table)
                )
            first = next(iter(tables.values()))
            size = sum(f.stat().st_size for f in Path(first).glob("*.parquet"))
            seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
            for i in range(args.warmup + args.merges):
                key = (i * 7919) % n
                spark.createDataFrame([(key, f"new-{i}", i)], "id long, v string, n long").createOrReplaceTempView("one_row")
                for mode, persistent in MODES.items():
                    spark.conf.set(MERGE_DELETION_VECTORS, persistent)
                    cpu, wall = jvm_cpu(), time.perf_counter()
                    spark.sql(
                        f"MERGE INTO delta.`{tables[mode]}` t USING one_row s ON t.id = s.id "
                        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
                    ).collect()
                    if i >= args.warmup:
                        seconds[mode].append((jvm_cpu() - cpu, time.perf_counter() - wall))
            for mode, measured in seconds.items():
                cpu_s = statistics.median(c for c, _ in measured)
                wall_s = statistics.median(w for _, w in measured)
                print(f"{n:>10} {size / 1e6:>8.2f}  {mode:<17} {cpu_s:>9.2f} {wall_s:>7.2f}", flush=True)
            marked, rewritten = (spark.read.format("delta").load(t) for t in tables.values())
            if marked.exceptAll(rewritten).count() or rewritten.exceptAll(marked).count():
                raise SystemExit(f"{n} rows: the two tables differ after the same MERGEs")
    finally:
        spark.conf.unset(MATERIALIZE_SOURCE)
        spark.conf.unset(MERGE_DELETION_VECTORS)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
