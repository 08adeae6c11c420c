"""The loop of a pipeline with binding templates (:class:`TemplatedRuntime`), and which loop a pipeline runs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from materializer import templates
from materializer.config import PipelineConfig, routed_values
from materializer.errors import ConfigError
from materializer.progress import Collector
from materializer.recovery_log import RecoveryLog
from materializer.runtime.loop import Runtime
from materializer.runtime.summary import RunSummary
from materializer.sources import Source, SourceBatch
from materializer.sources.formats import open_source
from materializer.storage import open_store

if TYPE_CHECKING:
    from materializer.sources.kafka.routes import KafkaRouter
    from pyspark.sql import SparkSession


class TemplatedRuntime:
    """The transaction loop of a pipeline with binding templates (docs: 'Binding templates').

    Runs :class:`Runtime` in rounds over the bindings the templates make. A round's bindings are
    those found (topics, sub-folders) plus those the last committed epoch covered (its driver
    checkpoint's ``templated``), so the re-apply after Open covers the same set as the epoch. At
    every epoch boundary the topics and folders are looked for again; when they changed, the round
    ends there (its last epoch applied) and the next one opens with the new set: a new topic or
    folder is a new binding, read from its start (``starting``). One no longer found is made only
    for its re-apply (a round of no new epoch), then stops the run (``on_missing: fail``) or is
    left out from the next epoch on (``drop``)."""

    def __init__(self, config: PipelineConfig, spark: "SparkSession", collector: Collector | None = None) -> None:
        self.config = config
        self.spark = spark
        self.collector = collector
        self.log = RecoveryLog(open_store(config.recovery_log), config.pipeline_id)
        """Read only, to learn what the last committed epoch covered: each round's Runtime opens its own."""
        self.routers: dict[tuple[int, str], KafkaRouter] = {}
        """Per ``route_by`` template and topic it reads (one topic, many tables): the topic's shared
        position and fixed plan. Made when the topic is first listed."""
        self.routed = any(t.source.route_by is not None for t in config.templates)

    def _router(self, index: int, topic: str) -> "KafkaRouter":
        if (index, topic) not in self.routers:
            from materializer.sources.kafka.routes import KafkaRouter

            self.routers[(index, topic)] = KafkaRouter(self.config, index, open_store(self.config.staging_root), topic)
        return self.routers[(index, topic)]

    def _routed(self, state: Any, topics: dict[int, list[str]]) -> dict[int, list[str]]:
        """Per ``route_by`` template, the tables the next epoch's records name in each of its
        ``topics`` (each topic's plan fixed from its position after the last committed epoch)."""
        recorded = templates.recorded_set(state.last_commit)
        checkpoint = (state.last_commit.runtime_checkpoint if state.last_commit is not None else None) or {}
        out: dict[int, list[str]] = {}
        for index, names in sorted(topics.items()):
            template = self.config.templates[index]
            out[index] = []
            for topic in names:
                of_topic = [
                    name for name, source in recorded.items()
                    if source.startswith("route:") and templates.takes(template, text := source.removeprefix("route:"))
                    and routed_values(text)[0] == topic
                ]
                router = self._router(index, topic)
                position = router.shared_position({name: checkpoint.get(name) for name in of_topic})
                out[index] += router.fix(self.spark, state.last_epoch, position)
        return out

    def run(self, *, follow: bool = False, max_epochs: int | None = None, should_stop: Callable[[], bool] | None = None) -> RunSummary:
        """As :meth:`Runtime.run`, over the bindings the templates make, round after round."""
        total: RunSummary | None = None
        dropped: set[str] = set()
        began = time.monotonic()
        while True:
            state = self.log.read()
            listings: dict[Any, list[str]] = {}  # each brokers' topics listed once per look
            found = templates.discover(self.config, listings)
            listed = dict(found)
            topics = templates.routed_topics(self.config, listings) if self.routed else {}
            found.update(self._routed(state, topics))
            expansion = templates.expand(
                self.config, found, templates.recorded_set(state.last_commit), dropped=dropped, epoch=state.last_epoch,
                routed_topics=topics,
            )
            done = len(total.epochs) if total is not None else 0
            remaining = None if max_epochs is None else max(0, max_epochs - done)
            if expansion.missing:
                remaining = 0  # Open and the re-apply of the last epoch (which covers them) only
            changed = {"found": False}

            def stop_between(
                listed: dict[int, list[str]] = listed, made: dict[str, templates.Made] = expansion.made,
                topics: dict[int, list[str]] = topics,
            ) -> bool:
                if should_stop is not None and should_stop():
                    return True
                looked: dict[Any, list[str]] = {}
                if self.routed:
                    # A topic the pattern matches first, or gone: a round of its own from here.
                    if templates.routed_topics(self.config, looked) != topics:
                        changed["found"] = True
                        return True
                    # A table the next epoch's records name first: a binding from that epoch on.
                    covered = {m.source for m in made.values()}
                    routed = self._routed(self.log.read(), topics)
                    if any(f"route:{text}" not in covered for texts in routed.values() for text in texts):
                        changed["found"] = True
                        return True
                if templates.discover(self.config, looked) != listed:
                    changed["found"] = True  # ends this round at this epoch boundary
                    return True
                return False

            sources = None
            if expansion.missing or self.routed:
                # Gone topics or folders: a round of no new epoch reads no source. Routed tables:
                # their topic's plan, fixed by its router, shared.
                staging = open_store(expansion.config.staging_root)
                sources = {b.name: self._source(b, expansion, staging) for b in expansion.config.bindings}
            runtime = Runtime(expansion.config, self.spark, self.collector, sources=sources, covered=expansion.covered)
            summary = runtime.run(follow=follow, max_epochs=remaining, should_stop=stop_between)
            if total is None:
                total = summary
            else:
                total.epochs.extend(summary.epochs)
                total.last_epoch = summary.last_epoch
                total.orphans_deleted += summary.orphans_deleted
            if expansion.missing:
                failing = {n: m for n, m in expansion.missing.items() if self.config.templates[m.template].on_missing == "fail"}
                if failing:
                    raise templates.missing_error(
                        templates.Expansion(expansion.config, expansion.made, failing), summary.last_epoch, self.config
                    )
                dropped |= set(expansion.missing)
                continue
            if not changed["found"] or (should_stop is not None and should_stop()):
                break
            if max_epochs is not None and len(total.epochs) >= max_epochs:
                break
        total.seconds = time.monotonic() - began
        return total

    def _source(self, binding: Any, expansion: templates.Expansion, staging: Any) -> Source:
        made = expansion.made.get(binding.name)
        if binding.name in expansion.missing:
            return _Gone(binding, staging)
        if made is not None and made.source.startswith("route:"):
            text = made.source.removeprefix("route:")
            return self._router(made.template, routed_values(text)[0]).source_for(binding, staging, text)
        return open_source(binding, staging)


class _Gone(Source):
    """The source of a binding whose topic or folder is no longer found: never read (its round
    only re-applies the last committed epoch)."""

    def next_batch(self, *args: Any, **kwargs: Any) -> SourceBatch | None:
        raise AssertionError(f"binding {self.binding.name}: its source is gone and must not be read")


def open_runtime(config: PipelineConfig, spark: "SparkSession", collector: Collector | None = None) -> "Runtime | TemplatedRuntime":
    """The transaction loop for ``config``: a :class:`TemplatedRuntime` when it has templates."""
    if config.templates:
        return TemplatedRuntime(config, spark, collector)
    return Runtime(config, spark, collector)


def as_recorded(config: PipelineConfig) -> PipelineConfig:
    """The bindings of ``config`` with those its templates made for the recovery log's last
    committed epoch (``status``, ``recover``): no broker or folder is asked. A pipeline without
    templates is returned as it is."""
    if not config.templates:
        return config
    state = RecoveryLog(open_store(config.recovery_log), config.pipeline_id).read()
    recorded = templates.recorded_set(state.last_commit)
    if not recorded and not config.bindings:
        raise ConfigError(
            f"pipeline {config.pipeline_id!r} has only templates and no committed epoch that covers a binding yet: "
            "run it first"
        )
    return templates.expand(config, {}, recorded, epoch=state.last_epoch).config
