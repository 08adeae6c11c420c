"""The Databricks job entry point: a Python wheel task that runs one pipeline on the job's cluster.

The bundle (``conf/databricks.yml``) declares::

    python_wheel_task:
      package_name: delta_materializer       # the distribution (pyproject.toml [project] name)
      entry_point: materializer_job          # [project.scripts] in pyproject.toml
      parameters: ["--config", "/Volumes/<catalog>/<schema>/<volume>/orders.yaml"]

Databricks looks the entry point up in the wheel's metadata and calls it with the parameters in
``sys.argv[1:]``. The run uses the cluster's SparkSession as it is: Databricks already has Delta
and its own S3 access, so no jars are fetched and no master is set. Tables may be catalog names
(``catalog.schema.table``, created with ``saveAsTable`` on the first epoch) or paths; staging may be
a volume folder (``/Volumes/…``, seen by Python through the volume's FUSE mount and by Spark as the
same path) or ``s3://``; the recovery log is best on ``s3://`` (see docs: "Running as a Databricks
job").

Outside Databricks (tests, a notebook, a laptop) the same function runs with whatever session is
active, or builds a local one from the configuration like ``materializer run``.

In the job, a configuration value may read a secret scope: ``${secret:scope/key}`` is
``dbutils.secrets.get(scope, key)`` (:func:`secret_scopes`; docs: 'Secrets'); everything the job
prints has its secrets as ``***``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Sequence

from materializer import redact
from materializer.config import SecretScopes, load_config, use_secret_scopes
from materializer.errors import ConfigError, MaterializerError
from materializer.progress import JsonLinesCollector, utc_now

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from materializer.config import PipelineConfig
    from materializer.runtime import RunSummary


def _job_output() -> JsonLinesCollector:
    """Progress on the job's stdout (the run page's output): one timed JSON record per opened,
    committed, applied and orphans_deleted event, and one ``progress`` record per applied epoch
    (the same records as ``materializer run --events jsonl``)."""
    return JsonLinesCollector(sys.stdout, kinds=("opened", "committed", "applied", "orphans_deleted", "progress"))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="materializer_job", description="Run a materializer pipeline as a Databricks job task."
    )
    parser.add_argument("--config", required=True, help="Pipeline YAML, e.g. on a volume: /Volumes/c/s/v/orders.yaml")
    parser.add_argument("--max-epochs", type=int, default=None, help="Stop after this many new epochs.")
    parser.add_argument(
        "--follow", action="store_true", help="Keep polling the sources (a continuous job) instead of draining them."
    )
    from materializer import __version__

    parser.add_argument("--version", action="version", version=f"materializer {__version__}")
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exc:
        if exc.code in (0, None):
            raise  # --help / --version: printed, a success
        # argparse exits on bad parameters; say it in our terms so the run page shows why.
        raise ConfigError(f"bad task parameters {list(argv)!r}: see `materializer_job --help`") from exc


def cluster_session(config: "PipelineConfig") -> "SparkSession":
    """The job cluster's session; locally, the active session or one built from the config."""
    from materializer.spark import active_session, config_session

    # The host's session first, even when the config names a Connect server (spark.remote, for
    # `materializer run` from a laptop): the job runs on the cluster, whose session has its Delta
    # and storage settings already. config_session alone would open a Connect session instead.
    return active_session() or config_session(config)


def secret_scopes() -> "SecretScopes | None":
    """``dbutils.secrets.get`` on a Databricks runtime (which ships ``pyspark.dbutils``), for
    ``${secret:scope/key}``; None elsewhere (such a reference is then refused, naming it)."""
    try:
        from pyspark.dbutils import DBUtils  # type: ignore[import-not-found]  # only on Databricks
    except ImportError:
        return None

    def get(scope: str, key: str) -> str:
        from materializer.spark import active_session

        return DBUtils(active_session()).secrets.get(scope=scope, key=key)

    return get


def run(argv: Sequence[str]) -> "RunSummary":
    """Run the pipeline the parameters name; returns the summary (raises MaterializerError)."""
    from materializer.runtime import open_runtime

    args = parse_args(argv)
    use_secret_scopes(secret_scopes())
    config = load_config(args.config)
    spark = cluster_session(config)
    return open_runtime(config, spark, _job_output()).run(follow=args.follow, max_epochs=args.max_epochs)


def main() -> None:
    """The wheel task's entry point: parameters come in ``sys.argv[1:]``."""
    redact.install()  # every line the run page shows, with its secrets as ***
    try:
        summary = run(sys.argv[1:])
    except MaterializerError as exc:
        print(redact.text(f"error: {exc}"), file=sys.stderr, flush=True)
        # A non-zero exit fails the task; the job's retry policy reruns it, and the rerun resumes
        # from the recovery log (terminal errors, e.g. a bad config, fail again the same way).
        raise SystemExit(exc.exit_code) from None
    # The same fields as `materializer run --json` and its `finished` event (RunSummary.to_dict).
    print(redact.text(json.dumps(redact.data({"event": "finished", "at": utc_now(), **summary.to_dict()}), default=str)), flush=True)


if __name__ == "__main__":
    main()
