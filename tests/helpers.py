"""Shared test helpers: pipeline configs in a temp folder, the CLI as a subprocess, the oracle, in-process crashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

REPO = Path(__file__).resolve().parent.parent

current_tiers: set[str] | None = None
"""The running test's tier markers (tests/conftest.py sets it); None outside a test."""


def write_config(folder: Path, bindings: list[dict[str, Any]], **settings: Any) -> Path:
    """A pipeline config whose state lives under ``folder``; returns its path."""
    data = {
        "pipeline_id": settings.pop("pipeline_id", "test-pipeline"),
        "recovery_log": str(folder / "log"),
        "staging": str(folder / "staging"),
        "transaction": {"max_documents": settings.pop("max_documents", 1000)},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        "bindings": bindings,
    }
    data.update(settings)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def binding(name: str, source: Path, table: Path, key: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    source_options = {k: extra.pop(k) for k in ("max_files", "max_bytes", "schema") if k in extra}
    return {
        "name": name,
        "source": {"format": extra.pop("format", "documents"), "path": str(source), **source_options},
        "table": str(table),
        "key": key or ["id"],
        **extra,
    }


def write_jsonl(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def require_subprocess_tier(what: str) -> None:
    """Fail the running test unless it is in the ``subprocess`` tier (tests/conftest.py)."""
    if current_tiers is not None and "subprocess" not in current_tiers:
        import pytest

        pytest.fail(f"{what}: mark the test `subprocess` (or `crash`)")


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600, jvm: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``materializer ARGS`` in a fresh process (its own JVM).

    A test that starts a JVM this way belongs to the ``subprocess`` tier (mark it ``subprocess``, or
    ``crash`` if it kills it). ``jvm=False`` says the command stops before Spark (``--version``,
    ``schema``, a configuration error, no Java): allowed in any tier, and held to it by a
    ``JAVA_HOME`` that has no Java unless the test sets its own.
    """
    if jvm:
        require_subprocess_tier("run_cli starts the CLI and its JVM (or pass jvm=False)")
    return subprocess.run(
        [sys.executable, "-m", "materializer_cli", *args],
        cwd=cwd or REPO,
        env=cli_env(env, jvm=jvm),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_env(env: dict[str, str] | None = None, *, jvm: bool = True) -> dict[str, str]:
    """The environment of a CLI run the tests start: this one (without a crash point), ``env`` over it.

    In the ``subprocess`` tier this environment carries the CLI runs' test-only JVM options
    (``SPARK_SUBMIT_OPTS``: tests/conftest.py). ``jvm=False``: a ``JAVA_HOME`` that has no Java.
    """
    full_env = dict(os.environ)
    full_env.pop("MATERIALIZER_CRASH_AT", None)
    if not jvm:
        full_env["JAVA_HOME"] = str(REPO / "no-jvm-in-this-tier")
    full_env.update(env or {})
    return full_env


# What SPARK_SUBMIT_OPTS was before the tests set the CLI runs' options (tests/conftest.py).
OWN_SUBMIT_OPTS = os.environ.get("SPARK_SUBMIT_OPTS")
# The long-lived JVMs' own test-only option: the throughput collector. G1's concurrent threads and
# write barriers cost the shared session's JVM 13% of its CPU over a full run (docs/tests.md).
LONG_LIVED_JVM_OPTIONS = os.environ.get("MATERIALIZER_TEST_LONG_JVM_OPTIONS", "-XX:+UseParallelGC")


def long_lived_jvm_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a JVM that lives the whole run (the shared session, the Connect server): the
    developer's own SPARK_SUBMIT_OPTS if any, else :data:`LONG_LIVED_JVM_OPTIONS` (not the CLI
    runs' C1-only options)."""
    env = dict(env)
    options = OWN_SUBMIT_OPTS if OWN_SUBMIT_OPTS is not None else LONG_LIVED_JVM_OPTIONS
    if options:
        env["SPARK_SUBMIT_OPTS"] = options
    else:
        env.pop("SPARK_SUBMIT_OPTS", None)
    return env


def table_rows(spark: Any, table: Path | str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The Delta table as {key: row}, dropping NULL fields (absent in the source documents)."""
    rows = spark.read.format("delta").load(str(table)).collect()
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        data = {k: v for k, v in row.asDict(recursive=True).items() if v is not None}
        k = tuple(data[f] for f in key)
        assert k not in out, f"key {k} appears twice in {table}"
        out[k] = data
    return out


# --- the oracle: materializer's own ------------------------------------------------------------


def assert_tables_equal_oracle(
    spark: Any, config: Any, *, bindings: list[str] | None = None, tables: dict[str, Path] | None = None
) -> None:
    """Every binding's table equals what ``materializer.tools.oracle`` computes from the sources alone.

    ``config``: a PipelineConfig or the path of its YAML; ``bindings``: only these; ``tables``: read
    these bindings' tables from another place (a local copy of an S3 table). The drill's
    oracle, unit-tested in tests/test_oracle.py: one definition of the documented semantics
    (reductions, deletes, epochs of whole files) for every test.
    """
    from materializer.tools import oracle
    from materializer.config import load_config

    if isinstance(config, (str, Path)):
        config = load_config(Path(config))
    for name, expected in oracle.expected_all(config).items():
        if bindings is not None and name not in bindings:
            continue
        binding_config = config.binding(name)
        assert expected.verified, f"{name}: {expected.reason}"
        table = str((tables or {}).get(name, binding_config.table))
        is_path = "/" in table or ":" in table
        frame = spark.read.format("delta").load(table) if is_path else spark.table(table)
        rows = [r.asDict(recursive=True) for r in frame.collect()]
        result = oracle.compare(expected, rows, binding_config.key)
        assert result.ok, f"{name}: lost {result.lost}, duplicated {result.duplicated}, wrong {result.wrong}"
        if is_path and "://" not in table:
            # Every reader opens our tables (DESIGN invariant 12): delta-rs reads the same rows.
            result = oracle.compare(expected, delta_rs_list(table), binding_config.key)
            assert result.ok, f"{name} read by delta-rs: lost {result.lost}, duplicated {result.duplicated}, wrong {result.wrong}"


def delta_rs_list(table: Path | str) -> list[dict[str, Any]]:
    """A Delta table's rows as delta-rs reads them (its QueryBuilder applies deletion vectors), in
    the Python types Spark's ``collect`` gives (naive local times, bytearrays)."""
    import datetime

    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    def like_spark(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: like_spark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [like_spark(v) for v in value]
        if isinstance(value, datetime.datetime) and value.tzinfo is not None:
            return value.astimezone().replace(tzinfo=None)
        if isinstance(value, bytes):
            return bytearray(value)
        return value

    reader = QueryBuilder().register("t", DeltaTable(str(table))).execute("SELECT * FROM t")
    return [like_spark(row) for row in pa.table(reader.read_all()).to_pylist()]


# --- a crash in this process --------------------------------------------------------------------


class Killed(BaseException):
    """Unwinds a thread :class:`InProcessCrash` froze, once the test is done with it."""


def kill_before_dead_letters(runtime: Any, epoch: int | None = None) -> None:
    """``runtime`` dies (:class:`Killed`) between a table's commit and its dead letters' append:
    of ``epoch`` only (the Open's re-apply of an earlier one goes through), or of any epoch."""
    append = runtime.driver.writer.append_dead_letters

    def killed(table: str, bindings: Any, at: int, staged: Any) -> Any:
        if epoch is None or at == epoch:
            raise Killed("killed between the table's commit and its dead letters'")
        return append(table, bindings, at, staged)

    runtime.driver.writer.append_dead_letters = killed


class InProcessCrash:
    """``MATERIALIZER_CRASH_AT`` without killing the test process: the thread reaching the point freezes.

    A frozen thread does nothing more, as after a power cut (no ``finally``, no clean-up), while the
    test reads the state on disk, runs the recovery in another Runtime and checks the end state.
    ``mid-apply``/``mid-load`` interrupt their Spark operation by its tag (what the JVM's death does to
    it) and freeze before the caller sees the error. :meth:`thaw` then raises :class:`Killed` in the
    frozen thread so it unwinds; call it last (its ``finally`` blocks run then). What only a real
    SIGKILL shows (a JVM dying inside a job, a Connect server outliving its client) stays with the
    ``crash`` tests.
    """

    def __init__(self, monkeypatch: Any, spec: str) -> None:
        import threading

        from materializer import crash

        self.fired = threading.Event()
        self._thaw = threading.Event()
        self.where = ""
        monkeypatch.setenv(crash.ENV, spec)
        monkeypatch.setattr(crash, "kill_now", self.freeze)
        monkeypatch.setattr(crash, "crash_during_spark_job", self._during_spark_job)

    def freeze(self) -> None:
        import threading

        self.where = threading.current_thread().name
        self.fired.set()
        self._thaw.wait()
        raise Killed(self.where)

    def disarm(self) -> None:
        """The next run (the recovery) runs to its end."""
        from materializer import crash

        os.environ.pop(crash.ENV, None)

    def thaw(self) -> None:
        self._thaw.set()

    def _during_spark_job(self, point: str, epoch: int, spark: Any, tag: str, *, watch: str | None = None) -> Any:
        import threading
        import time
        from contextlib import contextmanager

        from materializer import crash

        @contextmanager
        def block() -> Iterator[None]:
            if not crash.armed(point, epoch):
                yield
                return
            stop = threading.Event()
            before = crash.data_files(watch) if watch else set()
            started = time.monotonic()

            def watcher() -> None:
                # As crash.crash_during_spark_job: fire once the MERGE writes its first data file, or
                # once the operation has run IN_FLIGHT_SECONDS.
                while not stop.is_set():
                    if (watch is not None and crash.data_files(watch) - before) or (
                        watch is None and time.monotonic() - started >= crash.IN_FLIGHT_SECONDS
                    ):
                        spark.interruptTag(tag)
                        return
                    time.sleep(0.005)

            threading.Thread(target=watcher, name=f"crash-{point}", daemon=True).start()
            try:
                yield
            except Exception:  # noqa: BLE001 - the interrupted operation: the process is dead by now
                stop.set()
                self.freeze()
            stop.set()
            self.freeze()  # the operation finished before the watcher fired: die before anything else

        return block()

    def run(self, target: Callable[[], Any], *, timeout: float = 600) -> Any:
        """Run ``target`` in a thread until the crash point freezes it; returns the thread."""
        import threading

        errors: list[BaseException] = []

        def body() -> None:
            try:
                target()
            except Killed:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
                errors.append(exc)

        thread = threading.Thread(target=body, name="crashing-run", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not self.fired.is_set() and thread.is_alive() and time.monotonic() < deadline:
            self.fired.wait(0.05)
        if errors:
            raise errors[0]
        assert self.fired.is_set(), "the run ended without reaching the crash point"
        return thread


def delta_rs_rows(table: Path | str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The Delta table read by delta-rs (no Spark) as {key: row}, NULL fields dropped as in
    :func:`table_rows`: the second reader every checked table must open (DESIGN invariant 12).
    Read through delta-rs' QueryBuilder, which applies deletion vectors."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in delta_rs_list(table):
        data = {k: v for k, v in row.items() if v is not None}
        k = tuple(data[f] for f in key)
        assert k not in out, f"key {k} appears twice in {table}"
        out[k] = data
    return out


def record_document_paths(monkeypatch: Any) -> list[str]:
    """The documents reader's path per epoch, in order: ``"staging job"`` (its checks ride along with
    the staging job: ``DocumentReader.deferred``) or ``"check job"`` (a job of their own first:
    ``DocumentReader.check``), for files and Kafka alike."""
    from materializer.sources.documents.reader import DocumentReader

    paths: list[str] = []
    deferred, check = DocumentReader.deferred, DocumentReader.check
    monkeypatch.setattr(DocumentReader, "deferred", lambda reader, parsed: (paths.append("staging job"), deferred(reader, parsed))[1])
    monkeypatch.setattr(DocumentReader, "check", lambda reader, parsed: (paths.append("check job"), check(reader, parsed))[1])
    return paths


def record_set_asides(monkeypatch: Any) -> list[bool]:
    """Per dead-letter epoch the arrow validator judged (``document_route.set_aside``), in order:
    whether it set any document aside (files and Kafka alike)."""
    from materializer.sources.documents import route as document_route

    set_aside, asides = document_route.set_aside, []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        found = set_aside(*args, **kwargs)
        asides.append(found.others is not None)
        return found

    monkeypatch.setattr(document_route, "set_aside", recorded)
    return asides


class FakeConf:
    """``SparkSession.conf`` for tests without a JVM: ``get``/``set``/``unset`` over a dict."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values: dict[str, str] = dict(values or {})

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)
