"""Issue #14: the CLI is one module per command, without an import cycle, over one output helper;
the core imports neither the CLI nor the tools; a run's summary is built once (RunSummary.to_dict).

Unit tier: no JVM. The imports are read with ``ast`` (every import, also those inside functions)
and checked once more by importing each CLI module alone in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers import binding, write_config, write_jsonl

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "cli"
CLI_MODULES = sorted(p.stem for p in CLI.glob("*.py") if p.stem not in ("__init__", "__main__"))
# Every file of the core, its packages' included (spark/, delta/, merge/ …): all but the tools.
CORE_FILES = sorted(p for p in REPO.glob("materializer/**/*.py") if p.relative_to(REPO).parts[1] != "tools")


def imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved against ``package``);
    ``from X import y`` yields both ``X`` and ``X.y`` (y may be a submodule)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_walk_sees_relative_absolute_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("from .common import fail\nfrom . import main\n\ndef f():\n    import materializer.tools.drill\n")
    names = imported_modules(source, "materializer_cli")
    assert {"materializer_cli.common", "materializer_cli.main", "materializer.tools.drill"} <= names


def test_there_is_a_module_per_command() -> None:
    from materializer_cli.main import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}  # type: ignore[union-attr]
    assert commands == {"run", "status", "validate", "schema", "bench", "drill", "recover", "backfill"}
    for command in app.registered_commands:
        module = command.callback.__module__  # type: ignore[union-attr]
        assert module == f"materializer_cli.{command.callback.__name__}", module  # type: ignore[union-attr]


@pytest.mark.parametrize("module", CLI_MODULES)
def test_no_cli_module_imports_main_or_another_command(module: str) -> None:
    imports = {n for n in imported_modules(CLI / f"{module}.py", "materializer_cli") if n.startswith("materializer_cli.")}
    if module == "main":
        return  # the app: it imports every command
    assert "materializer_cli.main" not in imports
    # A command module shares code through common.py only (names imported from it are fine).
    others = {n for n in imports if not n.startswith("materializer_cli.common")}
    assert not others, f"cli/{module}.py imports {sorted(others)}: put what they share in cli/common.py"


@pytest.mark.parametrize("module", CLI_MODULES)
def test_each_cli_module_imports_alone_without_spark_or_the_app(module: str) -> None:
    # A fresh interpreter: an import cycle fails here whatever was imported before; Spark and the
    # tools are imported inside the commands (so `--help` is instant), and nothing pulls in the app.
    check = (
        f"import sys, materializer_cli.{module}\n"
        "loaded = [m for m in ('pyspark', 'materializer.tools', 'materializer_cli.main') if m in sys.modules]\n"
        f"loaded = [m for m in loaded if m != 'materializer_cli.{module}']\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_core_never_imports_the_cli_or_the_tools(path: Path) -> None:
    package = ".".join(path.relative_to(REPO).parts[:-1])  # the file's package (also for an __init__.py)
    upward = {n for n in imported_modules(path, package) if n.split(".")[0] == "materializer_cli" or n.startswith("materializer.tools")}
    assert not upward, f"{path.relative_to(REPO)} imports {sorted(upward)}: the tools and the CLI import the core, never the reverse"


def test_output_prints_json_or_the_text_lines_built_only_then(capsys: pytest.CaptureFixture[str]) -> None:
    from materializer_cli.common import output

    built: list[str] = []

    def text() -> Iterator[str]:
        built.append("text")
        yield "line 1"
        yield "line 2"

    output(True, {"a": 1, "at": Path("/x")}, text, indent=None)
    assert capsys.readouterr().out == '{"a": 1, "at": "/x"}\n' and not built
    output(False, {"a": 1}, text)
    assert capsys.readouterr().out == "line 1\nline 2\n" and built == ["text"]
    output(False, {"a": 1}, lambda: None)  # the text printed itself (bench's rich table)
    assert capsys.readouterr().out == ""


# --- the run's summary, built once ---------------------------------------------------------------


def a_summary() -> Any:
    from materializer.protocol import Acknowledged, ApplyResult
    from materializer.runtime import EpochSummary, RunSummary

    reapplied = Acknowledged(epoch=3, results=[ApplyResult(binding="orders", table="/t/orders", status="skipped", delta_version=4)])
    epochs = [
        EpochSummary(epoch=4, documents={"orders": 5, "items": 2}, description={}),
        EpochSummary(epoch=5, documents={"orders": 1, "items": 0}, description={}),
    ]
    return RunSummary(pipeline_id="p", opened_at_epoch=3, last_epoch=5, reapplied=reapplied, epochs=epochs, seconds=1.23456)


def test_the_summary_fields() -> None:
    fields = a_summary().to_dict()
    assert fields == {
        "pipeline_id": "p",
        "opened_at_epoch": 3,
        "last_epoch": 5,
        "epochs": 2,
        "documents": 8,
        "reapplied": {
            "epoch": 3,
            "results": [{
                "binding": "orders", "table": "/t/orders", "status": "skipped", "rows": 0, "delta_version": 4, "metrics": {},
                "conflicts_retried": 0,
            }],
        },
        "seconds": 1.235,
    }
    assert json.loads(json.dumps(fields)) == fields


@pytest.fixture
def cli_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``materializer run`` in process on a fake Runtime that returns :func:`a_summary` (no Spark):
    what the command does with the summary, not the run itself (the subprocess tier runs that)."""
    from typer.testing import CliRunner

    import materializer.runtime.templated
    from materializer_cli import run as run_module
    from materializer_cli.main import app

    class FakeRuntime:
        def __init__(self, *_args: Any) -> None:
            pass

        def run(self, **_kwargs: Any) -> Any:
            return a_summary()

    monkeypatch.setattr(materializer.runtime.templated, "Runtime", FakeRuntime)  # where open_runtime looks it up
    monkeypatch.setattr(run_module, "_session", lambda *_args: object())
    monkeypatch.setattr(run_module, "_stop", lambda _spark: None)
    monkeypatch.setattr(signal, "signal", lambda *_args: None)  # the test process keeps its own SIGTERM
    log = logging.getLogger("materializer")
    saved = (list(log.handlers), log.propagate, log.level)  # the command points the logger at its stderr
    source = write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": 1}])
    config = write_config(tmp_path, [binding("orders", source.parent, tmp_path / "orders", key=["id"])])

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(app, ["run", "--config", str(config), *args], catch_exceptions=False)

    yield invoke
    log.handlers[:], log.propagate = saved[0], saved[1]
    log.setLevel(saved[2])


def test_run_json_and_its_finished_event_carry_the_summary_fields(cli_run: Any) -> None:
    done = cli_run("--json")
    assert done.exit_code == 0
    assert json.loads(done.stdout) == a_summary().to_dict()
    assert len(done.stdout.splitlines()) == 1  # one line (indent=None), as before

    done = cli_run("--events", "jsonl")
    finished = json.loads(done.stdout.splitlines()[-1])
    assert finished.pop("event") == "finished" and finished.pop("at")
    assert finished == a_summary().to_dict()


def test_run_text_output_is_unchanged(cli_run: Any, tmp_path: Path) -> None:
    done = cli_run()
    assert done.exit_code == 0
    assert done.stdout.splitlines() == [
        "re-applied epoch 3 after open: orders skipped",
        "pipeline p: committed and applied epochs 4-5 (8 documents) in 1.2s",
        f"  orders: {tmp_path / 'orders'}",
    ]


def test_the_databricks_finished_line_is_the_same_summary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # It lacked `documents` and `reapplied` while it built its own dict.
    import materializer.databricks as job

    monkeypatch.setattr(job, "run", lambda _argv: a_summary())
    job.main()
    finished = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert finished.pop("event") == "finished" and finished.pop("at")
    assert finished == a_summary().to_dict()


# --- one session builder ---------------------------------------------------------------------------


def test_every_session_goes_through_session_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """config_session (the CLI, the drill, the job outside Databricks) and the bench both call
    spark.session_for, with what the config or the bench options say."""
    import materializer.spark as spark_module
    from materializer.config import load_config
    from materializer.tools.bench import BenchOptions
    from materializer.tools.bench import session as bench_session

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(spark_module, "session_for", lambda *a, **k: calls.append((a, k)) or "session")
    source = write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": 1}])
    config = load_config(write_config(tmp_path, [binding("orders", source.parent, "s3://bucket/orders", key=["id"])]))

    assert spark_module.config_session(config, app_name="materializer-drill") == "session"
    assert bench_session(BenchOptions.quick(master="local[1]")) == "session"
    (config_args, config_kwargs), (bench_args, bench_kwargs) = calls
    assert config_args == ("local[2]", {"spark.sql.shuffle.partitions": "2"})
    assert config_kwargs["s3"] is True and config_kwargs["kafka"] is False and config_kwargs["remote"] is None
    assert config_kwargs["app_name"] == "materializer-drill"
    assert bench_args[0] == "local[1]" and bench_kwargs["app_name"] == "materializer-bench"


def test_the_job_takes_the_hosts_session_before_the_configs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import materializer.spark as spark_module
    from materializer.config import load_config
    from materializer.databricks import cluster_session

    source = write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": 1}])
    config = load_config(write_config(tmp_path, [binding("orders", source.parent, tmp_path / "orders", key=["id"])]))
    host = object()
    monkeypatch.setattr(spark_module, "active_session", lambda: host)
    monkeypatch.setattr(spark_module, "session_for", lambda *_a, **_k: pytest.fail("built a session beside the host's"))
    assert cluster_session(config) is host
    monkeypatch.setattr(spark_module, "active_session", lambda: None)
    monkeypatch.setattr(spark_module, "session_for", lambda *_a, **_k: "built from the config")
    assert cluster_session(config) == "built from the config"


# --- the other commands' text, as it was before the split ------------------------------------------


def test_status_recover_and_backfill_text_is_unchanged() -> None:
    from materializer.backfill import BackfillSummary
    from materializer.tools.recover import RecoverySummary
    from materializer.tools.status import PipelineStatus, TableStatus
    from materializer_cli import backfill, recover, status

    st = PipelineStatus(
        pipeline_id="p", last_epoch=7, last_seq=9, log_entries=3, orphaned=["a", "b"],
        tables=[
            TableStatus("orders", "/t/o", True, 4, 7, [], True, "in step"),
            TableStatus("items", "/t/i", False, None, None, ["epoch-8/items"], False, "gone"),
        ],
    )
    assert list(status._text(st)) == [
        "pipeline p: last committed epoch 7 (log sequence 9, 3 entries kept)",
        "  [ok ] orders -> /t/o: records epoch 7 (Delta version 4); in step",
        "  [MISMATCH] items -> /t/i: no table; gone; staged pending: epoch-8/items",
        "  orphaned staged files (deleted at the next run): a, b",
    ]
    assert list(recover._text(RecoverySummary("p", ["re-staged epoch 3"], 3), Path("c.yaml"))) == [
        "- re-staged epoch 3",
        "pipeline p: epoch 3 re-committed; now run `materializer run --config c.yaml`",
    ]
    assert list(recover._text(RecoverySummary("p"), Path("c.yaml"))) == ["pipeline p: nothing had to be re-staged"]
    assert list(backfill._text(BackfillSummary("orders", 5, {"file": "b.jsonl"}, True, 7, [6, 7]))) == [
        'binding orders: source set back from {"file": "b.jsonl"} in epoch 5 (table truncated); '
        "read again in epochs [6, 7]; the log is at epoch 7"
    ]
    assert list(backfill._text(BackfillSummary("orders", 5, None, False, 5))) == [
        "binding orders: source set back from the start in epoch 5; read again in epochs none yet; the log is at epoch 5"
    ]
