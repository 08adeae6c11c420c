"""Line numbers of text files as Spark read them, without sorting a file into one task.

The reader's ``_seq`` (:meth:`materializer.sources.documents.reader.DocumentReader._text`) is each
line's file, the start of the split it was read in (``_metadata.file_block_start``) and
``monotonically_increasing_id``. A split is read by one task, line after line, and that id counts
up by one per line within a task, so a line's number in its file is the lines of the file's
earlier splits plus its place in its own split: one aggregate over the lines (each split's count
and first id: one small row per split) and a broadcast join, where a window ordered over the file
moved the whole file into one task and sorted it there (the error path of a big file, and dead
letters' line numbers).

A line belongs to the split it starts in (Hadoop's line reader finishes a line across the split's
end, and the next split skips it), so splits never share a line and, in block order, are the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.columns import SEQ

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def with_line_numbers(
    lines: "DataFrame", name: str, columns: "tuple[str, str, str] | None" = None, *, counted: "DataFrame | None" = None
) -> "DataFrame":
    """``lines`` and ``name``: each line's 1-based number in its file (a LONG), blank lines
    counted. ``columns``: the names of the file, block and row columns (default: ``_seq``'s, as
    the documents reader makes it). ``counted``: the lines whose splits are counted, when
    ``lines`` holds only some of them (default: ``lines``). Both sides of the join read the
    lines: their row ids must be the same on each read, as they are for a scan of the same files
    with the same settings."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    file, block, row = (F.col(c) for c in (columns or (f"{SEQ}.file", f"{SEQ}.block", f"{SEQ}.row")))
    splits = (lines if counted is None else counted).groupBy(file.alias("__nf"), block.alias("__nb")).agg(
        F.count(F.lit(1)).alias("__nn"), F.min(row).alias("__first")
    )
    # Lines of the file's splits before this one, and where this split's ids start.
    before = F.sum("__nn").over(Window.partitionBy("__nf").orderBy("__nb")) - F.col("__nn")
    shifts = splits.select("__nf", "__nb", (before + F.lit(1) - F.col("__first")).alias("__shift"))
    joined = lines.join(F.broadcast(shifts), (file == F.col("__nf")) & (block == F.col("__nb")))
    return joined.select(*[F.col(c) for c in lines.columns], (row + F.col("__shift")).alias(name))
