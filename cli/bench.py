"""``materializer bench``: the benchmark command (issue #7). The work is in :mod:`materializer.tools.bench`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .common import output


def bench(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (epochs of 10k into a 100k-row table): a few minutes."),
    table_rows: Optional[List[int]] = typer.Option(
        None, "--table-rows", help="Seeded table size; repeat for several (full default: 1M and 10M)."
    ),
    epoch_rows: Optional[List[int]] = typer.Option(
        None, "--epoch-rows", help="Documents per epoch; repeat for several (full default: 10k, 100k, 1M)."
    ),
    epochs: int = typer.Option(3, "--epochs", min=1, help="Big epochs per configuration (a one-row epoch follows them)."),
    insert_ratio: float = typer.Option(0.5, "--insert-ratio", help="Share of inserts in an epoch."),
    update_ratio: float = typer.Option(0.4, "--update-ratio", help="Share of updates in an epoch."),
    delete_ratio: float = typer.Option(0.1, "--delete-ratio", help="Share of deletes in an epoch."),
    out: Path = typer.Option(Path(".bench"), "--out", help="Folder for the run's report.json and bench.png."),
    peer: bool = typer.Option(True, "--peer/--no-peer", help="Measure Structured Streaming foreachBatch."),
    recovery: bool = typer.Option(True, "--recovery/--no-recovery", help="Measure kill-and-restart (subprocesses)."),
    replay: bool = typer.Option(True, "--replay/--no-replay", help="Measure a replayed, already-applied epoch."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="Run every path once on a tiny table first (JIT)."),
    one_row: bool = typer.Option(True, "--one-row/--no-one-row", help="Add a one-document epoch after the big ones."),
    master: str = typer.Option("local[*]", "--master", help="Spark master."),
    driver_memory: str = typer.Option("2g", "--driver-memory", help="spark.driver.memory (the local JVM's heap)."),
    shuffle_partitions: Optional[int] = typer.Option(None, "--shuffle-partitions", help="spark.sql.shuffle.partitions."),
    conf: Optional[List[str]] = typer.Option(None, "--conf", help="Extra Spark setting KEY=VALUE; repeatable."),
    seed: int = typer.Option(7, "--seed", help="Random seed of the generator."),
    keep_data: bool = typer.Option(False, "--keep-data", help="Keep generated inputs and tables."),
    deletion_vectors: bool = typer.Option(
        True, "--deletion-vectors/--no-deletion-vectors", help="Seed the table with deletion vectors (as ours creates tables)."
    ),
    infer_schema: bool = typer.Option(
        False, "--infer-schema", help="Ours infers each epoch's types instead of using the declared source.schema."
    ),
    interleave: bool = typer.Option(
        True, "--interleave/--path-by-path",
        help="Epoch by epoch, every path in turn (ours unpipelined); --path-by-path: each path runs all its epochs in turn.",
    ),
    pipelined: bool = typer.Option(True, "--pipelined/--serial", help="With --path-by-path: ours applies epoch N while reading N+1."),
    kafka: Optional[str] = typer.Option(
        None, "--kafka", help="Bootstrap servers of a Kafka broker: also measure ours reading the same documents from a topic."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    bindings: Optional[List[int]] = typer.Option(
        None, "--bindings", min=1,
        help="Instead: the epoch's cost with N small bindings, side by side and one after another; repeat for several (e.g. 1, 16, 64).",
    ),
    binding_rows: int = typer.Option(100, "--binding-rows", min=1, help="With --bindings: documents per binding per epoch."),
    parallel_bindings: Optional[int] = typer.Option(
        None, "--parallel-bindings", min=1, help="With --bindings: transaction.parallel_bindings of the side-by-side runs (default: auto, half the cores)."
    ),
    sequential: bool = typer.Option(True, "--sequential/--no-sequential", help="With --bindings: also run one binding at a time."),
    bindings_peer: bool = typer.Option(
        False, "--bindings-peer", help="With --bindings: also time one hand-written MERGE per table (the floor)."
    ),
    freshness: Optional[int] = typer.Option(
        None, "--freshness", min=1,
        help="Instead: follow mode's freshness over N one-document changes (file written to rows applied; p50, p90).",
    ),
    poll_interval: Optional[float] = typer.Option(
        None, "--poll-interval", min=0.01,
        help="With --freshness: transaction.poll_interval_seconds (default: the configuration's); with --soak: 0.5 s.",
    ),
    soak: bool = typer.Option(
        False, "--soak",
        help="Instead: follow mode over many small epochs and bindings (a `materializer run --follow` fed and watched): "
        "memory, descriptors, epoch time, the stores, per window, with their slopes.",
    ),
    soak_epochs: int = typer.Option(5000, "--soak-epochs", min=1, help="With --soak: epochs (rounds of one file per binding)."),
    soak_bindings: int = typer.Option(8, "--soak-bindings", min=1, help="With --soak: bindings (tables)."),
    soak_sample_every: int = typer.Option(250, "--soak-sample-every", min=1, help="With --soak: epochs per window (the probes run at each window's end)."),
    soak_minutes: Optional[float] = typer.Option(
        None, "--soak-minutes", min=0.1, help="With --soak: stop feeding after this many minutes whatever the epochs."
    ),
    soak_rows: int = typer.Option(20, "--soak-rows", min=1, help="With --soak: documents per binding per epoch."),
    soak_warmup_windows: int = typer.Option(1, "--soak-warmup-windows", min=0, help="With --soak: first windows left out of the slopes."),
) -> None:
    """Benchmark throughput and overhead against a bare MERGE and Spark Structured Streaming."""
    if soak:
        from materializer.tools.bench.soak import SoakOptions, run_soak
        from materializer.tools.bench.soak_figures import summary_lines as soak_lines

        try:
            soak_options = SoakOptions(
                epochs=soak_epochs, bindings=soak_bindings, sample_every=soak_sample_every, minutes=soak_minutes, rows=soak_rows,
                warmup_windows=soak_warmup_windows, poll=poll_interval or 0.5, master=master,
                driver_memory=driver_memory, seed=seed, out=out, keep_data=keep_data,
                conf=dict(item.split("=", 1) for item in (conf or []) if "=" in item),
            )
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        soak_report = run_soak(soak_options, say=lambda message: typer.echo(message, err=True))
        output(json_out, soak_report, lambda: soak_lines(soak_report), indent=1)
        return
    if freshness:
        from materializer.tools.bench_freshness import FreshnessOptions, run_bench_freshness
        from materializer.tools.bench_freshness import summary_lines as freshness_lines

        freshness_report = run_bench_freshness(
            FreshnessOptions(
                changes=freshness, poll=poll_interval, seed=seed, out=out, master=master, keep_data=keep_data,
                conf=dict(item.split("=", 1) for item in (conf or []) if "=" in item),
            ),
            say=lambda message: typer.echo(message, err=True),
        )
        output(json_out, freshness_report, lambda: freshness_lines(freshness_report), indent=1)
        return
    if bindings:
        from materializer.tools.bench_bindings import BindingsOptions, run_bench_bindings, summary_lines

        report = run_bench_bindings(
            BindingsOptions(
                bindings=list(bindings), rows=binding_rows, epochs=epochs, parallel=parallel_bindings, sequential=sequential,
                peer=bindings_peer,
                pipelined=pipelined, out=out, master=master, keep_data=keep_data,
                conf=dict(item.split("=", 1) for item in (conf or []) if "=" in item),
            ),
            say=lambda message: typer.echo(message, err=True),
        )
        output(json_out, report, lambda: summary_lines(report), indent=1)
        return
    from materializer.tools.bench import BenchOptions, summary_table

    overrides = dict(
        epochs=epochs,
        insert_ratio=insert_ratio,
        update_ratio=update_ratio,
        delete_ratio=delete_ratio,
        out=out,
        peer=peer,
        recovery=recovery,
        replay=replay,
        warmup=warmup,
        one_row_epoch=one_row,
        master=master,
        driver_memory=driver_memory,
        shuffle_partitions=shuffle_partitions,
        seed=seed,
        keep_data=keep_data,
        declared_schema=not infer_schema,
        deletion_vectors=deletion_vectors,
        interleave=interleave,
        pipelined=pipelined,
        kafka=kafka,
        spark_conf=dict(item.split("=", 1) for item in (conf or []) if "=" in item),
    )
    if table_rows:
        overrides["table_rows"] = list(table_rows)
    if epoch_rows:
        overrides["epoch_rows"] = list(epoch_rows)
    try:
        options = BenchOptions.quick(**overrides) if quick else BenchOptions.full(**overrides)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if table_rows or epoch_rows:
        options.mode += "+custom-sizes"

    from materializer.tools.bench import run_bench

    def say(message: str) -> None:
        typer.echo(message, err=True)

    say(
        f"bench ({options.mode}): tables {options.table_rows} x epochs {options.epoch_rows}, "
        f"{options.epochs} epochs each, output under {options.out}/"
    )
    report = run_bench(options, say=say)
    output(json_out, report, lambda: _print(report, summary_table), indent=1)


def _print(report: dict, summary_table) -> None:  # type: ignore[no-untyped-def,type-arg]
    header, rows = summary_table(report)
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="materializer bench: medians per epoch (seconds unless stated)")
        for column in header:
            table.add_column(column, justify="left" if column == "figure" else "right")
        for row in rows:
            table.add_row(*row)
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)  # a log file: do not fold the columns to 80
        console.print(table)
    except ImportError:  # plain text when rich is absent
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        typer.echo("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        for row in rows:
            typer.echo("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    for goal in report.get("goals", []):
        mark = {True: "met", False: "MISSED", None: "n/a"}[goal["met"]]
        value = goal["value"]
        shown = "-" if value is None else f"{value:.3f}"
        typer.echo(f"goal [{mark}] {goal['goal']} — {goal['config']}: {shown}")
    agree = all(c.get("tables_agree") for c in report["configs"])
    typer.echo(f"tables agree with the generator's expected row counts: {agree}")
    typer.echo(f"report: {report['paths']['json']}  chart: {report['paths']['chart']}  ({report['seconds']:.0f}s)")
