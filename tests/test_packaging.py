"""The package as published: name, version, licence, typing marker, the config's JSON Schema, entry
points; and the wheel a cluster installs, built for real, its metadata read as pip reads it.

A Databricks cluster (and any Spark Connect client host) has its own PySpark; a wheel that required
pyspark would put a second one beside it. So the core requires neither pyspark nor delta-spark nor
the tools' libraries; the ``local`` extra brings the pinned pair, ``tools`` the bench/drill ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import jsonschema
import pytest
import yaml

import materializer
from tests.helpers import REPO, run_cli

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_distribution_name_and_version() -> None:
    # "materializer" on the public index is another project; ours is published as delta-materializer.
    assert PROJECT["name"] == "delta-materializer" == materializer.DISTRIBUTION
    assert materializer.__version__ == PROJECT["version"]
    assert PROJECT["license"] == "Apache-2.0"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "END OF TERMS AND CONDITIONS" in (REPO / "LICENSE").read_text()


def test_py_typed_ships_with_the_package() -> None:
    assert (REPO / "materializer" / "py.typed").exists()
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["materializer"]


def test_version_flag() -> None:
    result = run_cli("--version", timeout=60, jvm=False)
    assert result.returncode == 0 and result.stdout.strip() == f"materializer {PROJECT['version']}"


@pytest.fixture(scope="module")
def schema() -> dict:
    result = run_cli("schema", timeout=60, jvm=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("path", sorted(REPO.glob("conf/*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_validate_against_the_schema(schema: dict, path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_the_schema_refuses_what_the_loader_refuses(schema: dict) -> None:
    bad = yaml.safe_load((REPO / "conf" / "orders-to-delta.yaml").read_text())
    bad["bindings"][0]["mode"] = "upsert"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = yaml.safe_load((REPO / "conf" / "orders-to-delta.yaml").read_text())
    bad["unknown_setting"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_databricks_entry_point_help_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from materializer.databricks import main; import sys; sys.argv=['materializer_job','--help']; main()"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: materializer_job" in result.stdout and "--config" in result.stdout


HEAVY = {"pyspark", "delta-spark", "psutil", "rich", "matplotlib", "py4j"}


def _name(requirement: str) -> str:
    import re

    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


@pytest.fixture(scope="module")
def metadata(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(name).decode())
        (entry,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = archive.read(entry).decode()
    return {
        "requires": message.get_all("Requires-Dist") or [],
        "extras": message.get_all("Provides-Extra") or [],
        "entry_points": entry_points.splitlines(),
    }


def test_the_core_wheel_requires_no_spark_delta_or_tool_libraries(metadata: dict[str, list[str]]) -> None:
    core = [r for r in metadata["requires"] if "extra ==" not in r]
    assert core, "no core requirements at all?"
    assert sorted(_name(r) for r in core if _name(r) in HEAVY) == []
    assert {"boto3", "pydantic", "typer", "pyyaml"} <= {_name(r) for r in core}


def test_the_local_extra_pins_the_tested_spark_delta_pair_and_tools_bring_theirs(metadata: dict[str, list[str]]) -> None:
    assert {"local", "connect", "tools", "dev"} <= set(metadata["extras"])

    def extra(name: str) -> set[str]:
        return {r.split(";")[0].replace(" ", "") for r in metadata["requires"] if f"extra == \"{name}\"" in r}

    assert {"pyspark==4.2.0", "delta-spark==4.4.0"} <= extra("local")
    assert {"psutil", "rich", "matplotlib"} <= {_name(r) for r in extra("tools")}
    assert {"grpcio", "pyarrow", "pandas", "zstandard"} <= {_name(r) for r in extra("connect")}
    assert "pyspark" not in {_name(r) for r in extra("connect")}  # the cluster's, or `local`'s


def test_the_job_entry_point_is_in_the_wheel(metadata: dict[str, list[str]]) -> None:
    assert "materializer_job = materializer.databricks:main" in metadata["entry_points"]


def test_a_run_imports_without_pyspark_or_the_tools_until_spark_is_needed() -> None:
    """What the wheel task imports before it asks for the cluster's session needs none of them."""
    script = (
        "import sys, importlib.abc\n"
        f"BLOCK = {sorted(HEAVY | {'delta', 'pandas', 'pyarrow', 'grpc'})!r}\n"
        "class Blocker(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0].replace('_', '-') in BLOCK:\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Blocker())\n"
        "import materializer.databricks, materializer.runtime, materializer.driver, materializer.tools.status, materializer_cli.main\n"
        "from materializer.extras import require\n"
        "from materializer.errors import ConfigError\n"
        "try:\n"
        "    require('rich', purpose='drill')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pip install 'delta-materializer[tools]'" in result.stdout
