"""Issue #29: the layering of docs/architecture.md, enforced by import-linter.

The contracts are in pyproject.toml (``[tool.importlinter]``): the package's floors, the core
never importing the tools, nothing importing the CLI, the sources independent of each other, no
import circle inside any package. ``lint-imports`` reads every import (also those inside functions
and under ``TYPE_CHECKING``) of the checkout it runs in. Unit tier: no JVM.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _lint_imports() -> str:
    beside = Path(sys.executable).parent / "lint-imports"
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[dev]' (import-linter)")
    return found


def test_lint_imports_keeps_every_contract() -> None:
    # From the checkout's root: lint-imports puts its working directory first on the path, so it
    # reads this checkout's code whatever else is installed.
    done = subprocess.run(
        [_lint_imports(), "--no-cache", "--no-logo"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    print(done.stdout, done.stderr, sep="\n")
    assert done.returncode == 0, f"lint-imports: a contract is broken (see its output above)\n{done.stdout}\n{done.stderr}"


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_core_contract_names_every_module_but_the_tools() -> None:
    # A forbidden contract checks only the modules it lists: a new module must join the list.
    package = REPO / "materializer"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in package.glob("*/__init__.py")}
    listed = {m.removeprefix("materializer.") for m in _contracts()["core-without-tools"]["source_modules"]}
    assert listed == modules - {"tools"}


def test_the_layers_contract_is_exhaustive() -> None:
    # Every module of materializer/ has a floor: lint-imports refuses a module the list lacks.
    assert _contracts()["layers"]["exhaustive"] is True


def test_the_tools_and_their_packages_have_exhaustive_floors() -> None:
    # Issue #29 item 3: the tools are small packages whose modules have floors of their own, so an
    # import against the grain of bench/ or drill/ fails like one against the package's.
    contracts = _contracts()
    for contract, container in (("tools-floors", "tools"), ("bench-floors", "tools.bench"), ("drill-floors", "tools.drill")):
        assert contracts[contract]["type"] == "layers" and contracts[contract]["exhaustive"] is True
        assert contracts[contract]["containers"] == [f"materializer.{container}"]


def test_no_file_of_the_tools_is_over_about_500_lines() -> None:
    # Issue #29 item 3: each file one job; a tool that grows splits by concern (see bench/, drill/).
    tools = REPO / "materializer" / "tools"
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in sorted(tools.rglob("*.py"))}
    assert {path: lines for path, lines in sizes.items() if lines > 500} == {}
