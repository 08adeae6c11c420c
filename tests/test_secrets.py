"""Secrets are never printed or written (issue #66 item 5; docs: 'Secrets').

A distinctive secret is planted in every secret-bearing option (Kafka ``options`` and
``client_options``, inline and through ``${env:…}``, a Connect URL's token, an S3 endpoint's
userinfo, the AWS keys), and every stream and every file of the runs is searched for it, on paths
that succeed and paths that fail. Unit tests for the resolver and the redactor first.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from materializer import redact
from materializer.config import parse_config, resolve_references, unresolve, use_secret_scopes
from materializer.config.load import load_config
from materializer.errors import ConfigError
from tests.helpers import REPO, cli_env, run_cli

SECRET = f"s3cr3t-PLANTED-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    redact.forget_all()
    yield
    redact.forget_all()
    use_secret_scopes(None)


def _documents_config(root: Path, **extra: object) -> dict:
    (root / "in").mkdir(exist_ok=True)
    (root / "in" / "part-0001.jsonl").write_text('{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}\n')
    return {
        "pipeline_id": "secrets",
        "recovery_log": str(root / "log"),
        "staging": str(root / "staging"),
        "bindings": [{"name": "docs", "table": str(root / "table"), "key": ["id"], "source": {"format": "documents", "path": str(root / "in")}}],
        **extra,
    }


def _kafka_binding(options: dict[str, str], client_options: dict[str, str]) -> dict:
    return {
        "name": "events", "table": "/tmp/never-written", "key": ["id"],
        "source": {"format": "kafka", "bootstrap_servers": "127.0.0.1:1", "topic": "t",
                   "options": options, "client_options": client_options},
    }


def _grep(folder: Path) -> list[str]:
    """Every file under ``folder`` that holds the secret."""
    return [str(p) for p in folder.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


# --- the resolver ---------------------------------------------------------------------------


def test_env_file_escape_and_nesting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANTED", SECRET)
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET + "-file\n\n")  # one trailing newline taken off, no more
    data = {
        "a": "${env:PLANTED}",
        "b": ['x="${env:PLANTED}";', {"c": "${file:" + str(secret_file) + "}"}],
        "d": "$${env:PLANTED} and $${",
        "e": 3,
    }
    out = resolve_references(data, "f.yaml")
    assert out == {"a": SECRET, "b": [f'x="{SECRET}";', {"c": SECRET + "-file\n"}], "d": "${env:PLANTED} and ${", "e": 3}
    assert redact.text(f"it is {SECRET}") == "it is ***"
    # Written back (the drill's scratch config): the references, never the values, and the escapes kept.
    back = unresolve(out)
    assert back == {"a": "${env:PLANTED}", "b": ['x="${env:PLANTED}";', {"c": "${file:" + str(secret_file) + "}"}],
                    "d": "$${env:PLANTED} and $${", "e": 3}
    assert resolve_references(back, "again") == out


@pytest.mark.parametrize(
    "value, message",
    [
        ("${env:NOT_SET_ANYWHERE_42}", r"f\.yaml: bindings\[0\]\.source\.options\.k: environment variable NOT_SET_ANYWHERE_42 is not set"),
        ("${file:/no/such/secret}", r"bindings\[0\]\.source\.options\.k: secret file /no/such/secret not found"),
        ("${secret:scope/key}", r"only the Databricks job"),
        ("${evn:PLANTED}", r"\$\{evn:…\} is not a reference"),
        ("${PLANTED}", r"starts no reference"),
        ("${env:A B}", r"does not name an environment variable"),
    ],
)
def test_unresolvable_references_say_where(value: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANTED", SECRET)
    with pytest.raises(ConfigError, match=message) as caught:
        resolve_references({"bindings": [{"source": {"options": {"k": value}}}]}, "f.yaml")
    assert SECRET not in str(caught.value)


def test_secret_scopes_read_in_the_databricks_job() -> None:
    use_secret_scopes(lambda scope, key: f"{SECRET}-{scope}-{key}")
    assert resolve_references("${secret:kafka/password}", "f.yaml") == f"{SECRET}-kafka-password"
    assert redact.text(f"{SECRET}-kafka-password") == "***"

    def refuse(scope: str, key: str) -> str:
        raise PermissionError(SECRET)

    use_secret_scopes(refuse)
    with pytest.raises(ConfigError, match="Databricks secret kafka/other cannot be read") as caught:
        resolve_references("${secret:kafka/other}", "f.yaml")
    assert SECRET not in str(caught.value)


def test_databricks_job_outside_databricks_has_no_scopes() -> None:
    from materializer.databricks import secret_scopes

    assert secret_scopes() is None  # no pyspark.dbutils here: ${secret:} is refused, naming it


# --- the redactor ---------------------------------------------------------------------------


def test_one_rule_for_every_kind_of_secret() -> None:
    redact.remember_options({"kafka.sasl.jaas.config": "x", "sasl.password": SECRET + "-b", "kafka.security.protocol": "SASL_SSL",
                             "ssl.key.password": "tiny"})
    assert redact.text(f"pw {SECRET}-b.") == "pw ***."
    assert redact.text("SASL_SSL") == "SASL_SSL"  # not a secret key: kept
    assert redact.text("tiny") == "***" and redact.text("a tiny word") == "a tiny word"  # short: as a whole value only
    assert redact.text(f"http://user:{SECRET}@host:9000/b") == "http://user:***@host:9000/b"
    assert redact.text(f"sc://h:15002/;token={SECRET};use_ssl=true") == "sc://h:15002/;token=***;use_ssl=true"
    assert redact.text(f'PlainLoginModule required username="u" password="{SECRET}";') == (
        'PlainLoginModule required username="u" password=***;'
    )
    assert redact.data({"k": [f"a {SECRET}-b", 1, None], f"{SECRET}-b": True}) == {"k": ["a ***", 1, None], "***": True}
    redact.remember_in(f"sc://h:1/;token={SECRET}-t")
    assert redact.text(f"the token {SECRET}-t alone") == "the token *** alone"


def test_logging_and_tracebacks_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    redact.remember(SECRET)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(redact.LogFilter())
    logger = logging.getLogger("materializer.test_secrets")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"boom {SECRET}")
        except RuntimeError:
            logger.exception("failed with %s", SECRET)
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "failed with ***" in err and "RuntimeError: boom ***" in err and SECRET not in err


def test_a_yaml_error_never_quotes_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f'pipeline_id: p\nbindings:\n  - source:\n      options:\n        kafka.sasl.jaas.config: x password="{SECRET}": y\n')
    with pytest.raises(ConfigError, match="line 5") as caught:
        load_config(path)
    assert SECRET not in str(caught.value) and "kafka.sasl.jaas.config" in str(caught.value)


def test_an_invalid_config_names_no_secret(tmp_path: Path) -> None:
    data = _documents_config(tmp_path, spark={"remote": f"http://h:1/;token={SECRET}"})
    with pytest.raises(ConfigError, match="is not a Spark Connect URL") as caught:
        parse_config(data, "p.yaml")
    assert SECRET not in str(caught.value)


def test_a_connect_url_token_is_not_in_its_errors() -> None:
    pytest.importorskip("pyspark.sql.connect.session")
    from materializer.spark.connect import remote_session

    with pytest.raises(ConfigError, match="cannot be set from a Spark Connect client") as caught:
        remote_session(f"sc://127.0.0.1:1/;token={SECRET}", {"spark.executor.memory": "1g"})
    assert SECRET not in str(caught.value) and ";token=***" in str(caught.value)


def test_an_s3_error_hides_the_endpoint_userinfo() -> None:
    from materializer.storage.s3 import S3Store

    store = S3Store("s3://bucket/prefix", client=object())  # type: ignore[arg-type]
    error = store._error("GET of", "x", RuntimeError(f'Could not connect to "http://user:{SECRET}@127.0.0.1:1/bucket"'))
    assert SECRET not in str(error) and "user:***@" in str(error)


def test_a_recorded_apply_failure_is_written_redacted(tmp_path: Path) -> None:
    """The log's failures/ file outlives the run (``status`` reads it): the exception text Spark
    gave is redacted where it is written, both a registered secret and one only a pattern shows."""
    from materializer.recovery_log import FAILURES, RecoveryLog
    from materializer.storage.local import LocalStore

    redact.remember(SECRET + "-registered")
    log = RecoveryLog(LocalStore(str(tmp_path / "log")), "p1")
    log.record_failure(3, "events", f"MERGE failed: option {SECRET}-registered; "
                                    f"jaas password=\"{SECRET}-jaas\"; s3a://u:{SECRET}-url@bucket/t")
    written = log.failures()[(3, "events")]
    assert SECRET not in written and written.count("***") == 3, written
    assert "MERGE failed" in written  # the reason itself is kept
    assert _grep(tmp_path / "log" / FAILURES) == [] and list((tmp_path / "log" / FAILURES).iterdir())


def test_rotating_a_kafka_password_changes_no_recorded_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from materializer.option_changes import table_options

    tables = []
    for password in (SECRET, SECRET + "-rotated"):
        monkeypatch.setenv("KAFKA_PASSWORD", password)
        path = tmp_path / "p.yaml"
        data = _documents_config(tmp_path)
        data["bindings"] = [_kafka_binding({"kafka.sasl.jaas.config": 'x password="${env:KAFKA_PASSWORD}";'}, {"sasl.password": "${env:KAFKA_PASSWORD}"})]
        path.write_text(yaml.safe_dump(data))
        recorded = table_options(load_config(path).bindings[0])
        assert password not in json.dumps(recorded)
        tables.append(recorded)
    assert tables[0] == tables[1]


# --- the CLI, every stream and file ----------------------------------------------------------


def _kafka_config(tmp_path: Path) -> Path:
    """Secrets everywhere a configuration holds one: Kafka options inline and by reference, client
    options, a Connect URL's token."""
    data = _documents_config(tmp_path, spark={"remote": f"sc://127.0.0.1:1/;token={SECRET}-connect"})
    data["bindings"].append(_kafka_binding(
        {"kafka.sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{SECRET}-inline";',
         "kafka.ssl.truststore.password": "${env:PLANTED}"},
        {"sasl.username": "u", "sasl.password": "${env:PLANTED}"},
    ))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_and_failing_commands_print_no_secret(tmp_path: Path) -> None:
    env = {"PLANTED": SECRET}
    path = _kafka_config(tmp_path)
    outputs = []
    for args in (("validate", "-c", str(path)), ("validate", "--json", "-c", str(path))):
        done = run_cli(*args, env=env, jvm=False)
        assert done.returncode == 0, done.stderr
        outputs.append(done)
    # Failing: a missing variable; bad YAML on the line of a password; an S3 endpoint with
    # credentials it does not take (nothing listens).
    outputs.append(run_cli("validate", "-c", str(path), env={}, jvm=False))
    assert outputs[-1].returncode == 2 and "environment variable PLANTED is not set" in outputs[-1].stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace(f'password="{SECRET}-inline";', f'password="{SECRET}-inline": x'))
    outputs.append(run_cli("validate", "-c", str(bad), env=env, jvm=False))
    assert outputs[-1].returncode == 2 and "not valid YAML" in outputs[-1].stderr
    s3 = tmp_path / "s3.yaml"
    data = _documents_config(tmp_path)
    data.update(recovery_log="s3://bucket/log", staging="s3://bucket/staging")
    s3.write_text(yaml.safe_dump(data))
    s3_env = {"AWS_ENDPOINT_URL": f"http://user:{SECRET}-endpoint@127.0.0.1:1", "AWS_ACCESS_KEY_ID": "AKIDPLANTED",
              "AWS_SECRET_ACCESS_KEY": f"{SECRET}-aws", "AWS_MAX_ATTEMPTS": "1", "AWS_REGION": "us-east-1"}
    for args in (("status", "-c", str(s3)), ("status", "--json", "-c", str(s3))):
        outputs.append(run_cli(*args, env=s3_env, jvm=False))
        assert outputs[-1].returncode != 0 and "127.0.0.1:1" in outputs[-1].stderr, outputs[-1].stderr
    for done in outputs:
        assert SECRET not in done.stdout + done.stderr, done.args
    assert sorted(_grep(tmp_path)) == sorted([str(path), str(bad)])  # the files the test wrote, nothing else


@pytest.mark.spark
@pytest.mark.subprocess
def test_a_run_on_s3_writes_and_shows_no_secret(tmp_path: Path, s3_server) -> None:  # type: ignore[no-untyped-def]
    """A documents run whose staging is on S3 (moto), with the AWS keys and an env-referenced
    secret in Spark settings: it succeeds, and no stream, file, event, metric or JVM command line
    holds a secret."""
    bucket = s3_server.create_bucket()
    data = _documents_config(tmp_path, spark={"conf": {
        "spark.sql.materializer.planted.password": "${env:PLANTED}",
        "spark.hadoop.fs.s3a.planted.token": "${env:PLANTED}",
    }})
    data["staging"] = f"s3://{bucket}/staging"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    env = cli_env({**s3_server.env, "PLANTED": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET + "-aws",
                   "AWS_ACCESS_KEY_ID": "AKIDPLANTED"})
    events, metrics = tmp_path / "out" / "events.jsonl", tmp_path / "out" / "metrics.prom"
    events.parent.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "materializer_cli", "run", "-c", str(path), "--json", "--events", "jsonl", "--all-events",
         "--events-file", str(events), "--metrics-file", str(metrics)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    jvms, leaked = set(), []
    while proc.poll() is None:  # every process's command line, while the run lasts
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"SparkSubmit" in cmdline:
                jvms.add(entry.name)
            if SECRET.encode() in cmdline and entry.name != str(proc.pid):
                leaked.append(cmdline.replace(b"\0", b" ").decode()[:300])
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert jvms, "no JVM seen: the command-line check checked nothing"
    assert leaked == []
    assert SECRET not in out + err
    assert events.stat().st_size > 0 and metrics.stat().st_size > 0
    assert _grep(tmp_path) == [], "a file the run wrote holds the secret"
    # The s3a keys worked: the epoch was staged on S3 by Spark and read back into the table.
    log = list((tmp_path / "table" / "_delta_log").glob("*.json"))
    assert any('"numOutputRows":"2"' in p.read_text() for p in log), "the table did not get the epoch's rows"
    import boto3

    client = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):  # what is left of the staging
        assert SECRET.encode() not in client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    for done in (run_cli("status", "--json", "-c", str(path), env=env, jvm=False),):
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout + done.stderr


def _failing_run(tmp_path: Path, config: Path, env: dict[str, str], *, jvm: bool) -> tuple[subprocess.CompletedProcess[str], float]:
    """``materializer run`` with every output it has (--json, events and metrics files), timed."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    began = time.monotonic()
    done = run_cli("run", "-c", str(config), "--json", "--events", "jsonl", "--all-events",
                   "--events-file", str(out / f"{config.stem}.events.jsonl"), "--metrics-file", str(out / f"{config.stem}.prom"),
                   env=env, jvm=jvm, timeout=120)
    return done, time.monotonic() - began


# Waits the product keeps for a server that may be starting, cut in the test's CLI only (a
# sitecustomize on its PYTHONPATH, as test_cluster.py installs one) so an unreachable one fails in
# seconds: the Connect client retries for at least 10 minutes (pyspark's DefaultPolicy: a Databricks
# cluster may be starting); the Kafka source asks the brokers for 30 s.
FAIL_FAST = """import os
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # as remote_session sets it, before gRPC loads
from pyspark.sql.connect.client import retries
_defaults = retries.DefaultPolicy.__init__.__defaults__
retries.DefaultPolicy.__init__.__defaults__ = (0,) + _defaults[1:]
from materializer.sources.kafka.offsets import Offsets
for _name in ("watermarks", "compacted", "at_timestamp"):
    getattr(Offsets, _name).__defaults__ = (3,)
"""


def _fail_fast_env(factory: pytest.TempPathFactory) -> dict[str, str]:
    hook = factory.mktemp("fail-fast")  # outside the test's tmp_path: only the run's own files are searched
    (hook / "sitecustomize.py").write_text(FAIL_FAST)
    return {"PYTHONPATH": os.pathsep.join([str(hook), str(REPO)])}


@pytest.mark.subprocess
def test_a_failing_kafka_run_writes_and_shows_no_secret(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A run whose Kafka binding carries secrets in options (a JAAS password, inline and by
    reference) and client_options, against a broker that is not there: it fails, and no stream
    or file (the log's failures/ included) holds a secret."""
    data = _documents_config(tmp_path)
    data["bindings"] = [_kafka_binding(
        {"kafka.sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{SECRET}-inline";',
         "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN", "kafka.ssl.truststore.password": "${env:PLANTED}"},
        {"sasl.username": "u", "sasl.password": "${env:PLANTED}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN"},
    ) | {"table": str(tmp_path / "table")}]
    path = tmp_path / "kafka.yaml"
    path.write_text(yaml.safe_dump(data))
    done, seconds = _failing_run(tmp_path, path, {"PLANTED": SECRET, **_fail_fast_env(tmp_path_factory)}, jvm=True)
    assert done.returncode != 0 and "the brokers did not answer" in done.stdout + done.stderr, done.stderr[-2000:]
    assert SECRET not in done.stdout + done.stderr
    assert seconds < 30, f"{seconds:.0f} s: the fail-fast hook did not take"
    assert (tmp_path / "log" / "entries").is_dir(), "the run stopped before the log: the log was not searched"
    assert _grep(tmp_path) == [str(path)], "a file the run wrote holds the secret"


@pytest.mark.subprocess
def test_a_connect_run_that_cannot_connect_shows_no_token(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A run whose Spark Connect URL carries a token, to a server that is not there."""
    pytest.importorskip("pyspark.sql.connect.session")
    path = tmp_path / "connect.yaml"
    path.write_text(yaml.safe_dump(_documents_config(tmp_path, spark={"remote": f"sc://127.0.0.1:1/;token={SECRET}"})))
    done, seconds = _failing_run(tmp_path, path, _fail_fast_env(tmp_path_factory), jvm=False)
    # said once, as a start-up error naming the server: no gRPC traceback
    assert done.returncode == 10 and "sc://127.0.0.1:1" in done.stderr and "did not answer" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-2000:]
    assert SECRET not in done.stdout + done.stderr
    assert seconds < 30, f"{seconds:.0f} s: the fail-fast hook did not take"
    assert _grep(tmp_path) == [str(path)], "a file the run wrote holds the token"
