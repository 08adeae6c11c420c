"""A real Apache Kafka broker for the tests: KRaft mode, from Kafka's own Maven Central jars.

No Docker: the first use resolves ``org.apache.kafka:kafka_2.13:KAFKA_VERSION`` and its runtime
dependencies with Maven (a generated pom, ``dependency:copy-dependencies``) into a cache folder that
outlives the run (``~/.cache/materializer/kafka-<version>``, or ``MATERIALIZER_KAFKA_HOME``); after
that, starting a broker costs a JVM start-up (~5-10 s on a loaded two-core machine).

``Broker.start`` formats a fresh storage folder (``kafka.tools.StorageTool format``, what
``kafka-storage.sh format`` runs), starts ``kafka.Kafka`` as a combined broker + controller on
127.0.0.1 with free ports, and waits until the broker answers metadata requests; ``stop`` kills it.
Tests talk to it with confluent-kafka (the ``dev`` extra).
"""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

KAFKA_VERSION = "3.9.1"
SCALA_VERSION = "2.13"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>materializer.tests</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_{scala}</artifactId><version>{version}</version></dependency>
    <!-- Kafka 3.9's log4j binding (the broker logs through slf4j + reload4j) -->
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""

_LOG4J = """log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaServer=INFO
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""


class BrokerUnavailable(RuntimeError):
    """Kafka's jars cannot be had here (no Maven, no network): the broker tests are skipped."""


def kafka_home() -> Path:
    default = Path.home() / ".cache" / "materializer" / f"kafka-{KAFKA_VERSION}"
    return Path(os.environ.get("MATERIALIZER_KAFKA_HOME", default))


def kafka_jars() -> Path:
    """The folder of Kafka's jars, resolved with Maven on first use."""
    home = kafka_home()
    libs = home / "libs"
    if (home / "COMPLETE").exists():
        return libs
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise BrokerUnavailable("Kafka's broker needs java and mvn on PATH to fetch its jars")
    home.mkdir(parents=True, exist_ok=True)
    # One download at a time (two pytest-xdist workers share the folder): the second waits, then uses it.
    with open(home / ".download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "COMPLETE").exists():
            return libs
        return _download(home, libs)


def _download(home: Path, libs: Path) -> Path:
    (home / "pom.xml").write_text(_POM.format(scala=SCALA_VERSION, version=KAFKA_VERSION))
    result = subprocess.run(
        ["mvn", "-q", "-B", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
         f"-DoutputDirectory={libs}", "-DincludeScope=runtime"],
        capture_output=True, text=True, timeout=900,
    )
    if result.returncode != 0:
        raise BrokerUnavailable(f"mvn could not fetch Kafka {KAFKA_VERSION}: {(result.stdout + result.stderr)[-2000:]}")
    # A marker last: a half-finished download is redone, never used.
    (home / "COMPLETE").write_text(KAFKA_VERSION)
    return libs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One KRaft broker + controller on loopback, its data under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.controller_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str) -> list[str]:
        libs = kafka_jars()
        return [
            "java", "-Xms128m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j.configuration=file:{self.folder / 'log4j.properties'}",
            "-cp", f"{libs}/*", main, *args,
        ]

    def start(self, timeout: float = 180) -> "Broker":
        self.folder.mkdir(parents=True, exist_ok=True)
        data = self.folder / "data"
        (self.folder / "log4j.properties").write_text(_LOG4J.format(log=self.folder / "broker.log"))
        properties = self.folder / "server.properties"
        properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"log.dirs={data}",
                    "auto.create.topics.enable=false",
                    "num.partitions=1",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=1",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "num.network.threads=2",
                    "num.io.threads=2",
                    "background.threads=2",
                    # The log cleaner runs (compacted topics' tests), small: only topics created
                    # with cleanup.policy=compact are ever cleaned.
                    "log.cleaner.enable=true",
                    "log.cleaner.threads=1",
                    "log.cleaner.dedupe.buffer.size=4194304",
                    "log.cleaner.io.buffer.size=65536",
                    "log.cleaner.backoff.ms=200",
                ]
            )
            + "\n"
        )
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        formatted = subprocess.run(
            # --cluster-id=…: an id starting with "-" (1 in 64 of them) is an option to argparse otherwise.
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(properties)),
            capture_output=True, text=True, timeout=300,
        )
        if formatted.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed: {formatted.stdout}{formatted.stderr}")
        out = open(self.folder / "broker.out", "wb")
        self.process = subprocess.Popen(
            self._java("kafka.Kafka", str(properties)), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait(timeout)
        return self

    def _wait(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        # log_level 0: librdkafka would print every refused connection while the broker starts.
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited ({self.process.returncode}): {self.tail()}")
            try:
                metadata = admin.list_topics(timeout=2)
                if metadata.brokers:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Kafka broker did not start within {timeout:.0f} s: {self.tail()}")

    def tail(self) -> str:
        parts = []
        for name in ("broker.out", "broker.log"):
            path = self.folder / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None
        self._admin = None

    # --- what the tests do with it (confluent-kafka) ---

    def admin(self) -> Any:
        """One client for the broker's life: a client dropped before its futures resolve fails them."""
        from confluent_kafka.admin import AdminClient

        if getattr(self, "_admin", None) is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def create_topic(self, name: str, partitions: int, **config: str) -> None:
        from confluent_kafka.admin import NewTopic

        futures = self.admin().create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])
        futures[name].result(timeout=60)
        self._wait_for(lambda md: name in md.topics and len(md.topics[name].partitions) == partitions)

    def add_partitions(self, name: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        self.admin().create_partitions([NewPartitions(name, total)])[name].result(timeout=60)
        self._wait_for(lambda md: len(md.topics[name].partitions) == total)

    def delete_topic(self, name: str) -> None:
        self.admin().delete_topics([name])[name].result(timeout=60)
        self._wait_for(lambda md: name not in md.topics)

    def delete_records(self, name: str, partition: int, before: int) -> None:
        """Remove a partition's records below offset ``before``, as retention would."""
        from confluent_kafka import TopicPartition

        futures = self.admin().delete_records([TopicPartition(name, partition, before)])
        for future in futures.values():
            future.result(timeout=60)

    def _wait_for(self, ready: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        admin = self.admin()
        while time.monotonic() < deadline:
            if ready(admin.list_topics(timeout=10)):
                return
            time.sleep(0.2)
        raise RuntimeError("the broker's metadata did not reach the expected state")

    def produce(self, topic: str, messages: list[tuple[Any, Any, int | None]], timestamp_ms: int | None = None) -> None:
        """Write ``(key, value, partition)`` messages (str/bytes/None; partition None: by key), and
        wait until every one is acknowledged (``timestamp_ms``: their CreateTime; None: now)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        failures: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        for key, value, partition in messages:
            kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": delivered}
            if timestamp_ms is not None:
                kwargs["timestamp"] = timestamp_ms
            if partition is not None:
                kwargs["partition"] = partition
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.5)
            producer.poll(0)
        remaining = producer.flush(60)
        assert remaining == 0 and not failures, f"produce failed: {remaining} unsent, {failures[:3]}"

    def transaction(self, topic: str, messages: list[tuple[Any, Any, int | None]], end: str | None, producer: Any = None) -> Any:
        """Write ``messages`` in one transaction of a transactional producer and ``end`` it
        (``commit``, ``abort``, or None: left open, the records written but not committed).
        Returns the producer (``producer.commit_transaction()`` ends an open one later)."""
        from confluent_kafka import Producer

        if producer is None:
            producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}", "linger.ms": 5})
            producer.init_transactions(60)
        producer.begin_transaction()
        for key, value, partition in messages:
            kwargs: dict[str, Any] = {"key": key, "value": value}
            if partition is not None:
                kwargs["partition"] = partition
            producer.produce(topic, **kwargs)
        assert producer.flush(60) == 0
        if end == "commit":
            producer.commit_transaction(60)
        elif end == "abort":
            producer.abort_transaction(60)
        return producer


import pytest  # noqa: E402 - the fixture below; the module above is usable without pytest


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the test session (started on first use, killed at the end)."""
    try:
        kafka_jars()
    except BrokerUnavailable as exc:
        pytest.skip(str(exc))
    started = Broker(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield started
    finally:
        started.stop()
