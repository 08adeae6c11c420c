"""conf/databricks.yml against Databricks' published bundle schema.

The schema is the Databricks CLI's own (``bundle/schema/jsonschema.json`` of databricks/cli at
v1.13.0-4-g7bbe285, 2026-08-21), kept in ``conf/schema/`` so the test runs offline; ``databricks
bundle schema`` prints the current one. It allows ``${var.…}`` references wherever a value goes.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.helpers import REPO

SCHEMA = REPO / "conf" / "schema" / "databricks-bundle-schema.json"


def _python_patterns(node: Any) -> Any:
    """The schema's patterns use ``\\p{L}``/``\\p{N}`` (Go's RE2); Python's ``re`` spells them otherwise."""
    if isinstance(node, dict):
        return {k: (_python_re(v) if k == "pattern" and isinstance(v, str) else _python_patterns(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_python_patterns(v) for v in node]
    return node


def _python_re(pattern: str) -> str:
    return pattern.replace("\\p{L}", "[^\\W\\d_]").replace("\\p{N}", "\\d")


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _python_patterns(json.loads(SCHEMA.read_text()))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def bundle() -> dict[str, Any]:
    return yaml.safe_load((REPO / "conf" / "databricks.yml").read_text())


def test_the_bundle_validates_against_the_published_schema(validator: Any) -> None:
    errors = sorted(validator.iter_errors(bundle()), key=lambda e: list(e.absolute_path))
    assert [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errors] == []


def test_the_schema_catches_a_mistake(validator: Any) -> None:
    """The check has teeth: a misspelt task field and a wrong type are both refused."""
    broken = bundle()
    task = broken["resources"]["jobs"]["materializer_orders"]["tasks"][0]
    task["python_wheel_tsak"] = task.pop("python_wheel_task")
    assert list(validator.iter_errors(broken))
    broken = bundle()
    broken["resources"]["jobs"]["materializer_orders"]["max_concurrent_runs"] = {"one": 1}
    assert list(validator.iter_errors(broken))


def test_a_classic_job_cluster_job_and_a_serverless_job_run_the_same_wheel_task() -> None:
    jobs = bundle()["resources"]["jobs"]
    classic, serverless = jobs["materializer_orders"], jobs["materializer_orders_serverless"]
    (cluster,) = classic["job_clusters"]
    # A supported runtime (docs/deployment.md: Supported versions): 17.3 LTS is Spark 4.0.
    assert re.fullmatch(r"17\.3\.x-scala2\.13", cluster["new_cluster"]["spark_version"])
    (ctask,) = classic["tasks"]
    (stask,) = serverless["tasks"]
    assert ctask["job_cluster_key"] == cluster["job_cluster_key"]
    assert "job_cluster_key" not in stask and "new_cluster" not in stask and "existing_cluster_id" not in stask
    (env,) = serverless["environments"]
    assert stask["environment_key"] == env["environment_key"]
    assert any(dep.endswith(".whl") for dep in env["spec"]["dependencies"])
    assert ctask["python_wheel_task"] == stask["python_wheel_task"]
