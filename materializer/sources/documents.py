"""The ``documents`` source: a folder of JSON Lines files, read in file-name order.

Each file is immutable once it appears. A document whose ``_meta.op`` is ``"d"`` deletes its key.
The runtime checkpoint is the file reached and the line (and byte offset) within it.

Reading a batch has two steps. A streaming pass in Python finds the batch's extent and checks
every line (valid JSON, an object, key fields present): it holds one line at a time, and a bad
line stops the run naming the file and line before anything of the batch is staged. It copies the
batch's lines, numbered, into one spool file that Spark then parses; rows live in DataFrames from
there on.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

from materializer.errors import SourceError
from materializer.sources import OP, RESERVED, SEQ, Source, SourceBatch
from materializer.storage import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SUFFIXES = (".jsonl", ".json", ".ndjson")


class DocumentsSource(Source):
    def _files(self) -> list[str]:
        store = open_store(self.binding.source.path)
        return [f.path for f in store.list() if f.path.endswith(SUFFIXES) and not os.path.basename(f.path).startswith(".")]

    def next_batch(
        self, spark: "SparkSession", checkpoint: dict[str, Any] | None, max_documents: int, spool_path: str
    ) -> SourceBatch | None:
        store = open_store(self.binding.source.path)
        files = self._files()
        start_file = (checkpoint or {}).get("file")
        start_line = int((checkpoint or {}).get("line", 0))
        start_offset = int((checkpoint or {}).get("offset", 0))
        keys = self.binding.key
        if start_file is not None and "before" in (checkpoint or {}):
            earlier = [name for name in files if name < start_file]
            if len(earlier) != checkpoint["before"]:  # type: ignore[index]
                raise SourceError(
                    f"{store.uri}: {len(earlier) - checkpoint['before']} file(s) appeared that sort before "  # type: ignore[index]
                    f"{start_file!r}, which the pipeline has already passed; they would never be read. Files "
                    f"are read in name order: rename them to sort after {start_file!r} (nothing was applied "
                    "from this transaction)."
                )

        count = 0
        extents: list[str] = []
        cursor: dict[str, Any] | None = None
        fd, local_spool = tempfile.mkstemp(prefix="spool-", suffix=".jsonl", dir=self.spool.local_temp_dir())
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                for name in files:
                    if start_file is not None and name < start_file:
                        continue
                    resume = name == start_file
                    line_no = start_line if resume else 0
                    offset = start_offset if resume else 0
                    first_line = line_no
                    where = f"{store.uri}/{name}"
                    with store.open_read(name, offset) as handle:
                        for raw in handle:
                            if count >= max_documents:
                                break
                            line_no += 1
                            offset += len(raw)
                            text = raw.strip()
                            if not text:
                                continue
                            doc = _parse(text, where, line_no, keys, cursor or checkpoint)
                            count += 1
                            # Numbered, so Spark keeps the file order however it splits the spool.
                            out.write('{"%s":%d,"d":%s}\n' % (SEQ, count, text.decode("utf-8")))
                            del doc
                    if line_no > first_line:
                        extents.append(f"{name}:{first_line + 1}-{line_no}")
                    # "before" counts the files passed, so a file that arrives late with an earlier
                    # name is reported instead of silently skipped.
                    cursor = {"file": name, "line": line_no, "offset": offset, "before": files.index(name)}
                    if count >= max_documents:
                        break
            if count == 0:
                return None
            self.spool.put_file(spool_path, local_spool)
        finally:
            if os.path.exists(local_spool):
                os.unlink(local_spool)

        assert cursor is not None
        return SourceBatch(
            documents=_dataframe(spark, self.spool.spark_path(spool_path)),
            checkpoint=cursor,
            count=count,
            description=", ".join(extents),
        )


def _parse(text: bytes, where: str, line: int, keys: list[str], resume_from: Any) -> dict[str, Any]:
    hint = (
        f"Fix or remove that line and run again: nothing from this transaction was applied, and the run "
        f"resumes from {json.dumps(resume_from) if resume_from else 'the start of the source'}."
    )
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        detail = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise SourceError(f"{where}:{line}: not valid JSON ({detail}). {hint}", file=where, line=line) from None
    if not isinstance(doc, dict):
        raise SourceError(
            f"{where}:{line}: a document must be a JSON object, found {type(doc).__name__}. {hint}",
            file=where,
            line=line,
        )
    for key in keys:
        value = doc.get(key)
        if value is None or isinstance(value, (dict, list)):
            problem = "is missing" if value is None else "must be a scalar"
            raise SourceError(f"{where}:{line}: key field {key!r} {problem}. {hint}", file=where, line=line)
    for field in RESERVED:
        if field in doc:
            raise SourceError(f"{where}:{line}: field {field!r} is reserved by the materializer. {hint}", file=where, line=line)
    return doc


def _dataframe(spark: "SparkSession", spool_uri: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    raw = spark.read.json(spool_uri)
    doc_type = raw.schema["d"].dataType
    fields = [f.name for f in doc_type.fields]  # type: ignore[attr-defined]
    meta = "_meta" in fields
    op = (
        F.when(F.col("d._meta.op") == F.lit("d"), F.lit("d")).otherwise(F.lit("u"))
        if meta and "op" in [f.name for f in doc_type["_meta"].dataType.fields]  # type: ignore[index]
        else F.lit("u")
    )
    columns = [F.col(f"d.`{name}`").alias(name) for name in fields if name != "_meta"]
    return raw.select(*columns, op.alias(OP), F.col(SEQ).cast("long").alias(SEQ))
