"""The Databricks job, run the way its bundle runs it: the wheel task's entry point and parameters.

The test reads ``conf/databricks.yml``, finds the Python wheel task, resolves its entry point in the
package's metadata (as Databricks does), sets ``sys.argv`` to the task's parameters (with the config
path pointed at a tmp folder instead of the volume) and calls it. The shared SparkSession is already
active, as the cluster's would be: the run must use it, build none, and write a catalog table.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from materializer import databricks
from materializer.errors import ConfigError
from tests.helpers import REPO, assert_tables_equal_oracle, write_config, write_jsonl

pytestmark = pytest.mark.spark


def wheel_task() -> dict[str, Any]:
    bundle = yaml.safe_load((REPO / "conf" / "databricks.yml").read_text())
    variables = {name: spec.get("default") for name, spec in bundle.get("variables", {}).items()}
    tasks = [task for job in bundle["resources"]["jobs"].values() for task in job["tasks"] if "python_wheel_task" in task]
    # One task per job (classic job cluster, serverless): the same wheel task in both.
    assert tasks and all(t["python_wheel_task"] == tasks[0]["python_wheel_task"] for t in tasks)
    task = dict(tasks[0]["python_wheel_task"])
    # ${var.x} as the bundle resolves it at deploy time (the defaults: no target overrides them)
    task["parameters"] = [re.sub(r"\$\{var\.(\w+)\}", lambda m: str(variables[m.group(1)]), p) for p in task["parameters"]]
    return task


def entry_point(package: str, name: str) -> Callable[[], None]:
    """What Databricks runs: the named entry point in the package's metadata."""
    try:
        found = [ep for ep in metadata.distribution(package).entry_points if ep.name == name]
    except metadata.PackageNotFoundError:  # not installed under this name (a checkout on PYTHONPATH)
        found = []
    if not found:  # an install older than pyproject.toml: read the declaration itself
        import tomllib

        scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
        assert name in scripts, f"entry point {name!r} is declared neither in the metadata nor in pyproject.toml"
        return metadata.EntryPoint(name, scripts[name], "console_scripts").load()  # type: ignore[no-any-return]
    return found[0].load()  # type: ignore[no-any-return]


def test_bundle_declares_a_wheel_task_with_a_config_on_a_volume() -> None:
    task = wheel_task()
    assert task["package_name"] == "delta_materializer"
    assert entry_point(task["package_name"], task["entry_point"]) is databricks.main
    params = task["parameters"]
    assert params[params.index("--config") + 1].startswith("/Volumes/")


def test_the_bundles_task_runs_on_the_active_session_into_a_catalog_table(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    from materializer import spark as spark_module

    table = f"spark_catalog.default.orders_{tmp_path.name[-12:].replace('-', '_').lower()}"
    source = tmp_path / "volume" / "input"
    write_jsonl(source / "orders-001.jsonl", [
        {"order_id": 1, "status": "new"},
        {"order_id": 2, "status": "new"},
        {"order_id": 1, "status": "paid"},
    ])
    write_jsonl(source / "orders-002.jsonl", [
        {"order_id": 3, "status": "new"},
        {"order_id": 2, "_meta": {"op": "d"}},
    ])
    config = write_config(
        tmp_path,
        [{"name": "orders", "source": {"format": "documents", "path": str(source), "max_files": 1}, "table": table, "key": ["order_id"]}],
        pipeline_id="orders-job",
        # stand-ins for /Volumes/... folders
        recovery_log=str(tmp_path / "volume" / "state" / "log"),
        staging=str(tmp_path / "volume" / "state" / "staging"),
    )
    task = wheel_task()
    params = list(task["parameters"])
    params[params.index("--config") + 1] = str(config)  # the volume path, pointed at tmp_path
    main = entry_point(task["package_name"], task["entry_point"])

    def no_new_session(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the job must use the cluster's session, not build one")

    monkeypatch.setattr(spark_module, "build_session", no_new_session)
    assert SparkSession.getActiveSession() is not None  # the "cluster's" session
    try:
        monkeypatch.setattr(sys, "argv", [task["entry_point"], *params])
        main()
        assert SparkSession.getActiveSession() is spark
        assert_tables_equal_oracle(spark, config)
        versions = spark.sql(f"DESCRIBE HISTORY {table}").select("version").collect()
        assert len(versions) == 2  # 2 files, one per epoch: one commit per epoch

        # A rerun of the task (a job retry) finds nothing new and adds no Delta version.
        main()
        assert len(spark.sql(f"DESCRIBE HISTORY {table}").collect()) == 2
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {table}")


@pytest.mark.slow
def test_bad_task_parameters_fail_the_task_with_the_config_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["materializer_job", "--no-such-flag"])
    with pytest.raises(SystemExit) as info:
        databricks.main()
    assert info.value.code == ConfigError.exit_code
    assert "bad task parameters" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["materializer_job", "--config", "/Volumes/nowhere/pipeline.yaml"])
    with pytest.raises(SystemExit) as info:
        databricks.main()
    assert info.value.code == ConfigError.exit_code
