"""Where the documents source's staging job spends its JVM CPU, piece by piece (issue #12).

``python -m materializer.tools.stage_profile [--documents N] [--repeats R]`` generates one epoch
of the bench's documents (:func:`materializer.tools.bench.generate_collection`), then runs each
variant below as its own Spark job, ``R`` times after one warm-up run, and prints the CPU seconds
of each run of the JVM and of Spark's Python workers (its child processes, which run
``mapInArrow``: psutil, user + system, :func:`materializer.tools.bench.cpu_seconds`) and its wall
seconds. Variants ending in ``noop`` write to Spark's ``noop`` sink, so they measure reading,
parsing and checking alone; the ``parquet`` ones combine (last per key) and write Parquet as a
staging job does. Compare figures of one run only: they are taken side by side on one machine.

The variants are built from the source's own code (``DocumentReader``), the bench's bare path, and the
alternatives a reader could take (Spark's JSON parser, ``from_json``, ``json_object_keys``), so
the cost of each piece shows as a difference between two lines.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


def _variants(spark: Any, folder: Path, out: Path, documents: int) -> dict[str, Callable[[], None]]:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from materializer import reductions
    from materializer.config import BindingConfig
    from materializer.sources.documents.source import plan_epoch
    from materializer.sources.documents.reader import DocumentReader
    from materializer.spark.settings import ARROW_BATCHES_BY_RECORDS, session_confs
    from materializer.storage import open_store
    from materializer.tools import bench

    store = open_store(str(folder))
    declared = spark.createDataFrame([], bench.SCHEMA_DDL).schema  # what ours is given (source.schema)
    path = str(next(folder.glob("*.jsonl")))
    args_documents = documents

    def reader(validator: str = "variant", dead_letter: bool = False) -> tuple[DocumentReader, Any]:
        found, legacy = store.list(), []
        r = DocumentReader(spark, store, [bench.KEY], declared, None, dead_letter=dead_letter)
        r.validator = validator
        return r, r.parsed(plan_epoch(found, None, 1000, 1 << 40, store.uri, legacy))

    def noop(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    def parquet(df: Any, name: str) -> None:
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        df.write.parquet(str(target))

    binding = BindingConfig.model_validate(
        {"name": "docs", "source": {"format": "documents", "path": str(folder)}, "table": str(out / "table"), "key": [bench.KEY]}
    )

    def combine(rows: Any) -> Any:
        return reductions.combine(rows, binding)  # the staging job's own combine

    def lines() -> Any:
        return spark.read.option("lineSep", "\n").text(path)

    def ours_noop() -> None:
        r, parsed = reader()
        rows, verify = r.deferred(parsed)
        noop(rows)
        verify()

    def ours_unchecked_noop() -> None:
        r, parsed = reader()
        noop(r.rows(parsed, declared))

    def ours_parquet() -> None:
        r, parsed = reader()
        rows, verify = r.deferred(parsed)
        parquet(combine(rows), "ours")
        verify()

    def ours_arrow_noop() -> None:
        r, parsed = reader("arrow")
        rows, verify = r.deferred(parsed)
        noop(rows)
        verify()

    def ours_arrow_parquet(conf: "dict[str, str] | None" = None, combined: Callable[[Any], Any] = combine) -> None:
        # The arrow validator (issue #25): msgspec in mapInArrow, from_json for the fast documents;
        # with the Spark settings the runtime stages a files epoch with (SourceBatch.job_conf).
        r, parsed = reader("arrow")
        rows, verify = r.deferred(parsed)
        with session_confs(spark, ARROW_BATCHES_BY_RECORDS if conf is None else conf):
            parquet(combined(rows), "ours-arrow")
        verify()
        assert r.fast == args_documents, f"{r.fast} of {args_documents} documents fast"

    def combine_max_by(rows: Any) -> Any:
        # The combine until 2026-11-29: max_by(struct(...), _seq), a sort-based aggregate whose
        # partial aggregate sorts the epoch before the shuffle as well as after.
        keys = set(binding.key)
        columns = [c for c in rows.columns if c != "_seq"]
        values = ", ".join(f"`{c}`" for c in columns if c not in keys)
        latest = rows.groupBy(*binding.key).agg(F.expr(f"max_by(struct({values}), `_seq`) AS __last"))
        return latest.selectExpr(*[f"`{c}`" if c in keys else f"__last.`{c}` AS `{c}`" for c in columns])

    def ours_arrow_dead_letter_parquet() -> None:
        # on_invalid: dead_letter, no bad document: the validator's set-aside job first (it finds
        # none to set aside), then staged as fail's epochs are.
        from materializer.sources.documents.route import set_aside

        r, parsed = reader("arrow", dead_letter=True)
        assert set_aside(r, open_store(str(out)), "spool-not-fast", files=True).others is None
        rows, verify = r.deferred(parsed)
        parquet(combine(rows), "ours-arrow-dead-letter")
        verify()

    def ours_dead_letter_checked_parquet(marked: bool = True) -> None:
        # on_invalid: dead_letter's own path (an epoch with a bad document) as the runtime ran it
        # until 2026-11-29 14:00 (since, the check job reads the documents set aside): the check
        # job, then the staging job, on the documents the validator marks (only the others parsed
        # and judged); marked=False: every document on the VARIANT route (until 2026-11-29).
        from materializer.sources.documents.route import marked_documents

        r, parsed = reader("arrow", dead_letter=True)
        conf = ARROW_BATCHES_BY_RECORDS if marked else {}
        if marked:
            parsed = marked_documents(r)
        with session_confs(spark, conf):
            _count, schema = r.check(parsed)
            parquet(combine(r.rows(parsed, schema)), "ours-dead-letter-checked")

    def ours_arrow_from_json_parquet() -> None:
        # The arrow validator as it was before it typed the scalars itself: from_json types all.
        from materializer.sources.documents import route as document_route

        r, parsed = reader("arrow")
        r.deferred_documents = parsed
        rows, verify = document_route.deferred(r, parsed, python_types=False)
        parquet(combine(rows), "ours-arrow-from-json")
        verify()

    def ours_arrow_alone_parquet() -> None:
        # The arrow validator judging each document alone, as before it tried a batch whole.
        import functools

        from materializer.sources.documents import check as document_check

        whole = document_check.check_batches
        document_check.check_batches = functools.partial(whole, whole_batches=False)
        try:
            ours_arrow_parquet()
        finally:
            document_check.check_batches = whole

    def variant_inference() -> None:
        # Without source.schema: the VARIANT route's check job (parse, checks, schema_of_variant_agg).
        r = DocumentReader(spark, store, [bench.KEY], None, None)
        found, legacy = store.list(), []
        r.check(r.parsed(plan_epoch(found, None, 1000, 1 << 40, store.uri, legacy)))

    def python_kinds() -> None:
        # Issue #25 item 2's question: the same pass in Python (msgspec decode, each top-level
        # field's JSON kinds folded per batch), without any of the checks or the nested types.
        kinds = lines().mapInArrow(_fold_kinds, "kinds string").agg(F.collect_set("kinds")).first()
        assert kinds is not None and kinds[0]

    def arrow_only_noop() -> None:
        # The validator's pass alone: lines to Python and back, no typing.
        from materializer.sources.documents.check import OK, check_batches

        text = lines()
        marked = text.mapInArrow(
            check_batches(declared.json(), [bench.KEY], []), T.StructType([*text.schema.fields, T.StructField(OK, T.BooleanType(), False)])
        )
        noop(marked)

    def ours_parquet_full_checks() -> None:
        # The staging job as it was before its lean checks: every per-document rule in the job.
        import uuid

        from pyspark.sql import Observation

        r, parsed = reader()
        tallies = Observation(f"profile_{uuid.uuid4().hex[:12]}")
        good = r.checked(parsed).observe(tallies, *r.tallies()).where(F.col("__problem").isNull())
        parquet(combine(r.rows(good, declared)), "ours-full")
        assert tallies.get["bad"] == 0

    def ours_parquet_variant_cast() -> None:
        # The staging job as it was before the fifth pass: every field typed by the VARIANT cast.
        from materializer.sources.documents import types as document_types

        by_text = document_types.by_text
        document_types.by_text = lambda dtype: False
        try:
            ours_parquet()
        finally:
            document_types.by_text = by_text

    staged: dict[str, Any] = {}

    def staged_parquet(codec: str) -> Callable[[], None]:
        # The staged dataset's own cost (issue #25): what the staging job writes (ours' combined
        # rows, computed and cached once, outside the figures), written with ``codec`` and read
        # back twice in full, as the MERGE's passes over its source read it (the peer stages
        # nothing, so this is what it does not pay).
        def run() -> None:
            if "rows" not in staged:
                r, parsed = reader("arrow")
                rows, verify = r.deferred(parsed)
                staged["rows"] = combine(rows).cache()
                staged["rows"].count()
                verify()
            target = out / f"staged-{codec}"
            shutil.rmtree(target, ignore_errors=True)
            staged["rows"].write.option("compression", codec).parquet(str(target))
            for _ in range(2):
                noop(spark.read.parquet(str(target)))

        return run

    def shaped(name: str, extra: str, fields: list[Any]) -> tuple[Callable[[], None], Callable[[str], Callable[[], None]]]:
        """The bare stage and ours (given the validator) over the bench's documents, each with
        ``extra`` (JSON members) added and declared as ``fields``."""
        folder = out.parent / name

        def documents() -> Path:
            if not folder.exists():
                folder.mkdir(parents=True)
                with open(path, encoding="utf-8") as src, open(folder / "a.jsonl", "w", encoding="utf-8") as dst:
                    dst.writelines(line.rstrip("\n")[:-1] + "," + extra + "}\n" for line in src if line.strip())
            return folder / "a.jsonl"

        def bare() -> None:
            schema = T.StructType([*bench.input_schema().fields, *fields])
            parquet(bench.latest_per_key(spark.read.schema(schema).json(str(documents()))), f"bare-{name}")

        def ours(validator: str) -> Callable[[], None]:
            def run() -> None:
                documents()
                schema = T.StructType([*declared.fields, *fields])
                store_shaped = open_store(str(folder))
                r = DocumentReader(spark, store_shaped, [bench.KEY], schema, None)
                r.validator = validator
                parsed = r.parsed(plan_epoch(store_shaped.list(), None, 1000, 1 << 40, store_shaped.uri, []))
                rows, verify = r.deferred(parsed)
                with session_confs(spark, ARROW_BATCHES_BY_RECORDS if validator == "arrow" else {}):
                    parquet(combine(rows), f"{name}-{validator}")
                verify()
                if validator == "arrow" and r.fast != args_documents:
                    print(f"({name}: {r.fast} of {args_documents} documents fast, the others took the VARIANT route)")

            return run

        return bare, ours

    # The bench's documents with a TIMESTAMP and a DECIMAL, as most tables have (the validator
    # types top-level ones itself: document_values.CONVERTERS) ...
    stamped_bare, stamped_parquet = shaped(
        "stamped", '"at":"2026-11-29T08:00:00Z","price":12.5',
        [T.StructField("at", T.TimestampType()), T.StructField("price", T.DecimalType(10, 2))],
    )
    # ... and inside an array of structs (from_json types them; the validator checks their form).
    items = '"items":[{"sku":"a1","price":12.5,"at":"2026-11-29T08:00:00Z"},{"sku":"b2","price":3.25,"at":"2026-11-29T08:01:00.5+01:00"}]'
    item = T.StructType([T.StructField("sku", T.StringType()), T.StructField("price", T.DecimalType(10, 2)), T.StructField("at", T.TimestampType())])
    nested_bare, nested_parquet = shaped("nested", items, [T.StructField("items", T.ArrayType(item))])
    plain = T.StructType([T.StructField("sku", T.StringType()), T.StructField("price", T.DoubleType()), T.StructField("at", T.StringType())])
    plain_bare, plain_parquet = shaped("nested", items, [T.StructField("items", T.ArrayType(plain))])

    typed = T.StructType([*declared.fields, T.StructField("_corrupt", T.StringType())])
    options = {"columnNameOfCorruptRecord": "_corrupt", "allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}
    return {
        "lines noop (spark.read.text)": lambda: noop(lines()),
        "json reader noop (spark.read.json, schema)": lambda: noop(spark.read.schema(bench.input_schema()).json(path)),
        "try_parse_json noop": lambda: noop(lines().select(F.try_parse_json("value").alias("v"))),
        "from_json noop (declared types)": lambda: noop(lines().select(F.from_json("value", typed, options).alias("j")).select("j.*")),
        "json_object_keys noop": lambda: noop(lines().select(F.json_object_keys("value").alias("k"))),
        "ours: parse + cast, no checks, noop": ours_unchecked_noop,
        "ours: parse + checks + cast, noop": ours_noop,
        "arrow: msgspec pass alone (mapInArrow), noop": arrow_only_noop,
        "no schema: the VARIANT route's check job (types inferred)": variant_inference,
        "no schema: top-level kinds folded in Python (no checks)": python_kinds,
        "arrow: validator + from_json, noop": ours_arrow_noop,
        "bare stage parquet (read.json, last per key, Parquet)": lambda: parquet(bench.latest_per_key(spark.read.schema(bench.input_schema()).json(path)), "bare"),
        "ours stage parquet (deferred checks, max_by, Parquet)": ours_parquet,
        "ours stage parquet, arrow validator (#25)": ours_arrow_parquet,
        "ours stage parquet, arrow validator, Arrow batches sized per row (before)": lambda: ours_arrow_parquet({}),
        "ours stage parquet, arrow validator, combined by max_by (before)": lambda: ours_arrow_parquet(combined=combine_max_by),
        "bare stage parquet, combined by max_by (before)": lambda: parquet(combine_max_by(_bare_rows(spark, path)), "bare-max-by"),
        "ours stage parquet, arrow validator, dead letters, none bad": ours_arrow_dead_letter_parquet,
        "ours stage parquet, dead letters' check job first (a bad one)": ours_dead_letter_checked_parquet,
        "ours stage parquet, dead letters' check job first, every document parsed (before)": lambda: ours_dead_letter_checked_parquet(False),
        "ours stage parquet, arrow validator, each document alone (before)": ours_arrow_alone_parquet,
        "ours stage parquet, arrow validator, from_json types all (before)": ours_arrow_from_json_parquet,
        "ours stage parquet, every check in the job (before lean)": ours_parquet_full_checks,
        "ours stage parquet, every field by the VARIANT cast (before typing from text)": ours_parquet_variant_cast,
        "stamped (with a TIMESTAMP and a DECIMAL): bare stage": stamped_bare,
        "stamped (with a TIMESTAMP and a DECIMAL): arrow validator, which types them (the default)": stamped_parquet("arrow"),
        "stamped (with a TIMESTAMP and a DECIMAL): VARIANT route": stamped_parquet("variant"),
        "nested (an array of structs of STRINGs and DOUBLEs): bare stage": plain_bare,
        "nested (an array of structs of STRINGs and DOUBLEs): arrow validator": plain_parquet("arrow"),
        "nested (an array of structs of STRINGs and DOUBLEs): VARIANT route": plain_parquet("variant"),
        "nested (an array of structs with a TIMESTAMP and a DECIMAL): bare stage": nested_bare,
        "nested (an array of structs with a TIMESTAMP and a DECIMAL): arrow validator": nested_parquet("arrow"),
        "nested (an array of structs with a TIMESTAMP and a DECIMAL): VARIANT route": nested_parquet("variant"),
        "staged parquet alone: written (snappy, as staged) and read twice": staged_parquet("snappy"),
        "staged parquet alone: written uncompressed and read twice": staged_parquet("none"),
        "staged parquet alone: written lz4_raw and read twice": staged_parquet("lz4_raw"),
    }


def _bare_rows(spark: Any, path: str) -> Any:
    """The bare stage's rows before its combine: the file read with the schema, ``_op`` and an
    ordering (``_seq``, as the combine reads it)."""
    from pyspark.sql import functions as F

    from materializer.tools import bench

    df = spark.read.schema(bench.input_schema()).json(path)
    op = F.when(F.col("_meta.op") == F.lit("d"), F.lit("d")).otherwise(F.lit("u"))
    return df.withColumn("_op", op).drop("_meta").withColumn("_seq", F.coalesce(F.col("updated"), F.lit(-1)))


def _fold_kinds(batches: Any) -> Any:
    """Each batch's top-level fields and the JSON kinds they hold (``name:kind|kind``)."""
    import msgspec
    import pyarrow as pa

    decode = msgspec.json.decode
    names = {dict: "object", list: "array", bool: "boolean", int: "integer", float: "double", str: "string"}
    for batch in batches:
        seen: dict[str, set[str]] = {}
        for text in batch.column(0).to_pylist():
            for key, value in decode(text).items():
                seen.setdefault(key, set()).add(names.get(type(value), "null"))
        yield pa.RecordBatch.from_arrays([pa.array([f"{k}:{'|'.join(sorted(v))}" for k, v in seen.items()], pa.string())], names=["kinds"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=300_000, help="documents in the epoch (default 300000)")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per variant, after one warm-up (default 3)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--only", action="append", default=[], metavar="TEXT",
        help="run only the variants whose name holds TEXT (repeatable; default: all)",
    )
    args = parser.parse_args(argv)

    from materializer.spark import active_session, session_for, stop_session
    from materializer.tools import bench

    work = Path(tempfile.mkdtemp(prefix="stage-profile-"))
    try:
        folder = work / "source"
        bench.generate_collection(folder, max(args.documents, 1000), args.documents, 1, (0.5, 0.4, 0.1), 7, one_row=False)
        ours = active_session() is None  # else a host's, left running
        spark = session_for(args.master, {"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}, app_name="stage-profile")
        variants = _variants(spark, folder, work / "out", args.documents)
        if args.only:
            variants = {name: run for name, run in variants.items() if any(text in name for text in args.only)}
        for run in variants.values():
            run()  # warm-up: JIT and first-use costs are nobody's
        # Round-robin: each round runs every variant once, so a slow spell of a shared machine
        # touches all of them alike.
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, run in variants.items():
                c0, t0 = bench.cpu_seconds(), time.monotonic()
                run()
                c1 = bench.cpu_seconds()
                figures[name].append((c1[1] - c0[1], c1[2] - c0[2], time.monotonic() - t0))
        print(
            f"{args.documents} documents; per run CPU s of the JVM + Spark's Python workers / wall s, "
            f"{args.repeats} rounds; medians of the total and of the workers' part"
        )
        for name, runs in figures.items():
            median = sorted(jvm + workers for jvm, workers, _ in runs)[len(runs) // 2]
            median_workers = sorted(workers for _, workers, _ in runs)[len(runs) // 2]
            print(
                f"{name:58s} " + "   ".join(f"{jvm:5.2f}+{workers:4.2f} / {wall:4.2f}" for jvm, workers, wall in runs)
                + f"   median {median:5.2f} (workers {median_workers:4.2f})"
            )
        if ours:  # and its JVM, so the process's CPU as the system counts it is all of it
            stop_session(spark)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
