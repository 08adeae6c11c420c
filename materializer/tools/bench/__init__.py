"""``materializer bench``: throughput and overhead against a bare MERGE and against Structured Streaming.

For each configuration (a table of ``table_rows`` keys, epochs of ``epoch_rows`` documents) the
benchmark generates a synthetic collection as JSON Lines files, one file per epoch, followed by
one file holding a single document (the fixed cost of a one-row epoch), and applies the same
files three ways, each to its own copy of the same seeded table:

* **ours**: the materializer end to end, in this process (``Runtime(config, spark).run()``), with
  ``source.max_files = 1`` so each file is one epoch. A collector timestamps the runtime's
  events, which splits each epoch into *read* (listing, the Spark job that checks every document),
  *stage* (Spark parse, combine, Parquet write, recovery-log commit) and *apply* (txn check,
  staged-file check, MERGE, garbage collection), and records per epoch the CPU seconds of this
  Python process (the driver) and of the Spark JVM (psutil). The spans the core emits
  (``materializer.events.Span``: prestage, StartCommit, MERGE…) say where the time went inside
  those phases, with the Spark jobs each ran (the report's ``steps``).
* **bare**: what a user without exactly-once machinery would do with the same rows: read the
  JSON file with a fixed schema, keep the last document per key, write Parquet (*stage*), then a
  plain ``MERGE`` of that Parquet (*merge*; no txn ids, no checks). The bare MERGE is the floor
  our apply phase cannot beat.
* **peer**: Spark Structured Streaming, file source on the same folder with
  ``maxFilesPerTrigger=1`` (one file per micro-batch, so batches match our epochs),
  ``Trigger.AvailableNow``, and a ``foreachBatch`` that deduplicates and MERGEs with
  ``txnAppId``/``txnVersion`` = query id/batch id, the pattern Delta's documentation recommends.

With ``--kafka BOOTSTRAP`` (issue 17), **ours from Kafka**: the same files' documents produced, in
file order and keyed by id, to a fresh topic (not timed), then the materializer reading the topic
(``format: kafka``, ``max_records`` = the epoch size, so epochs hold the same documents as the
files) into its own copy of the seeded table: records per second from topic to table beside the
same data from files.

Then, on our table: the cost of a replayed, already-applied epoch (a second run of the drained
pipeline: Open re-acknowledges the last epoch, which Delta already records); and, in
subprocesses, the recovery after a kill (``MATERIALIZER_CRASH_AT=mid-apply:1``) and the time of
the restart that recovers. A sampler thread records the peak RSS of this Python process (the
driver) and of the Spark JVM, per phase.

Per-epoch figures are medians over the big epochs (the one-row epoch excluded), because the
machine this runs on may be shared and a single slow epoch should not decide a ratio.

The package, one job a module (each imports only those listed after it):

* :mod:`~materializer.tools.bench.run`: the run: warm-up, each configuration's paths, the report;
* :mod:`~materializer.tools.bench.paths`: ours, bare, peer; the replay and the kill-and-restart;
* :mod:`~materializer.tools.bench.report`: figures and ratios, goals, ``report.json``, chart, table;
* :mod:`~materializer.tools.bench.measurement`: CPU (driver, JVM, Python workers), memory, Spark jobs;
* :mod:`~materializer.tools.bench.inputs`: the seeded table, the generated documents, the topic;
* :mod:`~materializer.tools.bench.options`: the options and the session they describe.

Beside them, ``materializer bench --soak`` (issue #68): a ``materializer run --follow`` fed small
epochs over many bindings and watched for growth, per window of epochs:

* :mod:`~materializer.tools.bench.soak`: the soak: the feeder, the run, the windows, the stop;
* :mod:`~materializer.tools.bench.soak_figures`: slopes per 1,000 epochs and their verdicts, the table, the chart;
* :mod:`~materializer.tools.bench.soak_probes`: RSS, CPU, descriptors, heap after GC; the log, staging, tables.
"""

from __future__ import annotations

from materializer.tools.bench.inputs import (
    KEY,
    SCHEMA_DDL,
    SEED_TAG,
    Collection,
    copy_table,
    generate_collection,
    input_schema,
    produce_topic,
    seed_table,
)
from materializer.tools.bench.measurement import (
    JOB_GROUPS,
    SPAN_STEPS,
    MemorySampler,
    OursCollector,
    SpanSteps,
    TimingCollector,
    WorkerCpu,
    cpu_delta,
    cpu_seconds,
    epoch_phases,
    job_names,
    next_job_id,
)
from materializer.tools.bench.options import (
    FULL_EPOCH_ROWS,
    FULL_TABLE_ROWS,
    QUICK_EPOCH_ROWS,
    QUICK_TABLE_ROWS,
    BenchOptions,
    session,
    session_conf,
)
from materializer.tools.bench.paths import (
    latest_per_key,
    pipeline_config,
    run_bare,
    run_ours,
    run_peer,
    run_recovery,
    run_replay,
)
from materializer.tools.bench.report import (
    FIXED_COSTS,
    chart,
    chart_figure,
    figures,
    fixed_costs,
    goals,
    machine,
    summary_table,
    write_json,
)
from materializer.tools.bench.run import bench_config, run_bench, warmup

__all__ = [
    "FIXED_COSTS", "FULL_EPOCH_ROWS", "FULL_TABLE_ROWS", "JOB_GROUPS", "KEY", "QUICK_EPOCH_ROWS", "QUICK_TABLE_ROWS",
    "SCHEMA_DDL", "SEED_TAG", "SPAN_STEPS", "BenchOptions", "Collection", "MemorySampler", "OursCollector", "SpanSteps",
    "TimingCollector", "WorkerCpu", "bench_config", "chart", "chart_figure", "copy_table", "cpu_delta", "cpu_seconds",
    "epoch_phases", "figures", "fixed_costs", "generate_collection", "goals", "input_schema", "job_names",
    "latest_per_key", "machine", "next_job_id", "pipeline_config", "produce_topic", "run_bare", "run_bench",
    "run_ours", "run_peer", "run_recovery", "run_replay", "seed_table", "session", "session_conf", "summary_table",
    "warmup", "write_json",
]
