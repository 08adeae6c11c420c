"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link, anchor or missing
page fails), the README stays short and keeps CI's blocks, every pipeline YAML in the docs loads
with the configuration models, every ``materializer`` command line in the docs names a command and
options that exist, and the generated configuration reference lists every key of the schema.

Unit tier: no JVM. A block preceded by ``<!-- not run -->`` is left out of the example checks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO

DOCS = REPO / "docs"
NOT_RUN = "<!-- not run -->"
# Filled in when a YAML example shows only part of a pipeline (its bindings, one binding, a source).
BASE = {"pipeline_id": "docs-example", "recovery_log": "/tmp/docs-example/log", "staging": "/tmp/docs-example/staging"}
FRAGMENT_BINDING = {"name": "docs_example", "table": "/tmp/docs-example/table", "key": ["id"]}


@dataclass(frozen=True)
class Block:
    file: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_run: bool

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(REPO)}:{self.line}"


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md")) + [REPO / "README.md"]


def _expand_snippets(text: str) -> str:
    """pymdownx.snippets' ``--8<-- "path"`` lines, as the site build expands them (base: the repo)."""

    def include(m: re.Match[str]) -> str:
        return (REPO / m.group(1)).read_text()

    return re.sub(r'^--8<-- "([^"]+)"$', include, text, flags=re.M)


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        text = "\n".join(line[len(indent):] for line in lines[i + 1 : j])
        found.append(Block(path, i + 1, lang, _expand_snippets(text), before == NOT_RUN))
        i = j + 1
    return found


def all_blocks(*langs: str) -> list[Block]:
    return [b for page in _pages() for b in blocks(page) if b.lang in langs and not b.not_run]


def test_the_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the dev extra brings mkdocs-material and mkdocstrings")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    for page in ("index.html", "reference/configuration/index.html", "reference/api/index.html", "troubleshooting/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    for name in ("materializer.config.PipelineConfig", "materializer.runtime.Runtime", "materializer.protocol.Open",
                 "materializer.events.Applied", "materializer.errors.TxnNotRecordedError"):
        assert f'id="{name}"' in api, name


def test_the_readme_is_short_and_keeps_the_ci_blocks() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300, "README.md: at most 300 lines; move detail into docs/"
    for marker in ("<!-- ci:setup -->", "<!-- ci:test -->"):
        after = text.split(marker + "\n", 1)[1]
        assert after.startswith("```bash\n"), marker
    assert not re.search(r"#\d{2,}\b", text), "no issue numbers in the README"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "no dated measurements in the README"


def _as_pipeline(data: Any) -> dict[str, Any] | None:
    """The pipeline an example stands for, or None when it is not a pipeline config."""
    if isinstance(data, list) and data and all(isinstance(b, dict) and "source" in b for b in data):
        data = {"bindings": data}
    if not isinstance(data, dict):
        return None
    if set(data) == {"source"}:
        data = {"bindings": [{**FRAGMENT_BINDING, **data}]}
    if "bindings" not in data and "pipeline_id" not in data:
        return None
    return {**BASE, **data}


def test_every_yaml_example_is_a_valid_pipeline() -> None:
    from materializer.config import parse_config

    checked = 0
    for block in all_blocks("yaml", "yml"):
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError as exc:
            pytest.fail(f"{block.where}: not YAML ({exc}); mark it {NOT_RUN} if it is not meant to be")
        pipeline = _as_pipeline(data)
        if pipeline is None:
            continue
        parse_config(pipeline, block.where)  # raises ConfigError naming the block and the field
        checked += 1
    assert checked >= 8  # the sources' complete examples, the configuration page, the semantics page…


def test_a_broken_yaml_example_fails() -> None:
    from materializer.config import parse_config
    from materializer.errors import ConfigError

    bad = _as_pipeline(yaml.safe_load("bindings:\n  - name: x\n    source: {format: documents, path: p}\n    table: t\n    key: [id]\n    mode: upsert\n"))
    with pytest.raises(ConfigError, match="mode"):
        parse_config(bad, "example")


def _cli_options() -> dict[str, set[str]]:
    import typer

    from materializer_cli.main import app

    group = typer.main.get_command(app)
    commands = {name: {opt for p in cmd.params for opt in p.opts + p.secondary_opts} for name, cmd in group.commands.items()}  # type: ignore[attr-defined]
    commands[""] = {opt for p in group.params for opt in p.opts + p.secondary_opts}
    return commands


def test_every_materializer_command_line_in_the_docs_exists() -> None:
    commands = _cli_options()
    checked = 0
    for block in all_blocks("bash", "sh"):
        text = block.text.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            m = re.search(r"(?:^|[\s/])materializer\s+(.*)$", line)
            if not m or line.startswith("#"):
                continue
            words = shlex.split(m.group(1).split("|")[0].split(">")[0])
            while words and words[0] in commands[""]:
                words.pop(0)
            if not words:
                continue
            name = words[0]
            assert name in commands, f"{block.where}: `materializer {name}` is not a command"
            for word in words[1:]:
                if word.startswith("--"):
                    option = word.split("=", 1)[0]
                    assert option in commands[name], f"{block.where}: `materializer {name}` has no option {option}"
            checked += 1
    assert checked >= 10


def test_the_configuration_reference_lists_every_key() -> None:
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import config_reference
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    from materializer_cli.schema import config_schema

    schema = config_schema()
    page = config_reference.render(schema)
    for prefix, model in (("", schema), *(
        (p, schema["$defs"][n]) for n, p, _ in config_reference.SECTIONS if n != "PipelineConfig"
    )):
        for key, prop in model["properties"].items():
            assert f"| `{prefix}{key}` |" in page, key
            assert prop.get("description"), f"{prefix}{key} has no docstring (use_attribute_docstrings)"


def test_troubleshooting_names_every_exit_code_and_error_class() -> None:
    import materializer.errors as errors

    page = (DOCS / "troubleshooting.md").read_text()
    for code in range(1, 13):
        assert re.search(rf"^\| {code} \|", page, re.M), f"exit code {code}"
    for name, cls in vars(errors).items():
        if isinstance(cls, type) and issubclass(cls, errors.MaterializerError):
            assert f"`{name}`" in page, name
            assert re.search(rf"^\| {cls.exit_code} \| [^\n]*`{name}`", page, re.M), f"{name} under exit {cls.exit_code}"
