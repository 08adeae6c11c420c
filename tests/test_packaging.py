"""The wheel a cluster installs: built for real, its metadata read as pip reads it.

A Databricks cluster (and any Spark Connect client host) has its own PySpark; a wheel that required
pyspark would put a second one beside it. So the core requires neither pyspark nor delta-spark nor
the tools' libraries; the ``local`` extra brings the pinned pair, ``tools`` the bench/drill ones.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.helpers import REPO

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
        "import materializer.databricks, materializer.runtime, materializer.driver, materializer.status, cli.main\n"
        "from materializer.extras import require\n"
        "from materializer.errors import ConfigError\n"
        "try:\n"
        "    require('rich', purpose='drill')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pip install 'materializer[tools]'" in result.stdout
