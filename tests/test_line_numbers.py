"""Line numbers without a sort (materializer.sources.line_numbers): each line of files that Spark
splits into several pieces, and of small files packed into one task, gets its number in its file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from materializer.storage.local import LocalStore


@pytest.mark.spark
def test_lines_of_split_and_packed_files_get_their_numbers_in_their_file(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from materializer.sources.documents.reader import DocumentReader
    from materializer.sources.line_numbers import with_line_numbers

    src = tmp_path / "src"
    src.mkdir()
    sizes = {"a.jsonl": 400, "b.jsonl": 3, "c.jsonl": 1, "d.jsonl": 250}
    for name, count in sizes.items():
        # Each line says where it is; some are blank (counted, as an editor counts them).
        lines = ["" if i % 37 == 5 else f'{{"file": "{name}", "line": {i}, "pad": "{"x" * (i % 29)}"}}' for i in range(1, count + 1)]
        (src / name).write_text("\n".join(lines) + "\n")
    reader = DocumentReader(spark, LocalStore(str(src)), ["file"], None, None)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "2000")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        text = reader._text(sorted(sizes))
        assert text.select("_seq.file", "_seq.block").distinct().count() > len(sizes) + 4  # split, and
        assert text.rdd.getNumPartitions() < text.select("_seq.file", "_seq.block").distinct().count()  # packed
        numbered = with_line_numbers(text, "n").select(F.col("_seq.file").alias("uri"), "value", "n").collect()
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")
    assert len(numbered) == sum(sizes.values())
    by_file: dict[str, list[int]] = {}
    for row in numbered:
        name = row["uri"].rsplit("/", 1)[-1]
        by_file.setdefault(name, []).append(row["n"])
        if row["value"]:
            assert f'"file": "{name}", "line": {row["n"]},' in row["value"], (row["n"], row["value"])
    assert {name: sorted(ns) for name, ns in by_file.items()} == {name: list(range(1, count + 1)) for name, count in sizes.items()}
