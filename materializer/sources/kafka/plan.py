"""A Kafka epoch's offsets in plain Python: each partition's range, lost records, compaction, byte cuts.

No broker, no Spark: unit-tested without either. Shared by the kafka source, its ``route_by``
router and the kafka ``cdcv2`` payload. The checkpoint a kafka binding commits is
:meth:`Plan.checkpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from materializer.errors import SourceError

Partition = tuple[str, int]
"""(topic, partition)."""


@dataclass
class Plan:
    """One epoch's offsets."""

    ranges: dict[Partition, tuple[int, int]]
    """Per partition with records to read, ``[from, to)``."""
    positions: dict[Partition, int]
    """Every partition's next offset after the epoch."""
    lost: dict[Partition, tuple[int, int]] = field(default_factory=dict)
    """Records skipped under ``on_data_loss: skip``: ``[from, to)``."""
    lag: int = 0
    """Records left after the epoch."""
    compaction: dict[Partition, int] = field(default_factory=dict)
    """Compacted partitions read past their delete.retention.ms under ``on_data_loss: skip``: the
    first unread record's offset (deletes from there on may be lost)."""

    @property
    def empty(self) -> bool:
        return not self.ranges

    @property
    def records(self) -> int:
        return sum(to - start for start, to in self.ranges.values())

    def checkpoint(self) -> dict[str, Any]:
        out: dict[str, Any] = {"offsets": nested(self.positions), "range": nested({p: list(r) for p, r in self.ranges.items()})}
        if self.lost:
            out["lost"] = nested({p: list(r) for p, r in self.lost.items()})
        return out

    def description(self) -> str:
        parts = [f"{t}/{p}:{a}-{b - 1}" for (t, p), (a, b) in sorted(self.ranges.items())]
        text = ", ".join(parts) if len(parts) <= 4 else f"{', '.join(parts[:3])} … ({len(parts)} partitions)"
        return f"{text} ({self.records} offsets)"


def nested(flat: dict[Partition, Any]) -> dict[str, dict[str, Any]]:
    """``flat`` as a checkpoint keeps it: ``{topic: {"partition": value}}``, sorted."""
    out: dict[str, dict[str, Any]] = {}
    for (topic, partition), value in sorted(flat.items()):
        out.setdefault(topic, {})[str(partition)] = value
    return out


def positions_of(checkpoint: dict[str, Any] | None) -> dict[Partition, int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, offsets in ((checkpoint or {}).get("offsets") or {}).items()
        for partition, offset in offsets.items()
    }


def share(backlog: dict[Partition, int], limit: int) -> dict[Partition, int]:
    """How many records each partition gives to an epoch of at most ``limit``: all when the backlog
    fits, else in proportion to each partition's backlog (what rounding leaves goes to the largest
    fractions, ties by partition), so partitions move together and none starves."""
    total = sum(backlog.values())
    if total <= limit:
        return dict(backlog)
    taken = {p: limit * n // total for p, n in backlog.items()}
    left = limit - sum(taken.values())
    for p in sorted(backlog, key=lambda p: (-(limit * backlog[p] % total), p)):
        if left <= 0:
            break
        if taken[p] < backlog[p]:
            taken[p] += 1
            left -= 1
    return taken


def plan_epoch(
    watermarks: dict[Partition, tuple[int, int]],
    topics: list[str],
    checkpoint: dict[str, Any] | None,
    start: dict[Partition, int] | None,
    limit: int,
    on_data_loss: str,
    where: str,
) -> Plan:
    """The next epoch after ``checkpoint``.

    ``watermarks``: each partition's (earliest, latest) offsets now, for every partition of
    ``topics``. ``start``: a new pipeline's positions (``starting`` resolved; only used without a
    checkpoint). Raises SourceError for a missing topic or partition, offsets that went backwards,
    and lost records unless ``on_data_loss`` is ``skip``.
    """
    known = positions_of(checkpoint)
    present = {t for t, _ in watermarks}
    hint = "nothing from this transaction was applied"
    for topic in topics:
        if topic not in present:
            if any(t == topic for t, _ in known):
                raise SourceError(
                    f"{where}: topic {topic!r} is gone (deleted?); the pipeline had read it up to "
                    f"{offsets_text({p: o for p, o in known.items() if p[0] == topic})}. Its unread records, if any, "
                    f"are lost: restore the topic, or start a new pipeline (new pipeline_id and tables); {hint}."
                )
            raise SourceError(f"{where}: topic {topic!r} does not exist. Check source.topic(s) and bootstrap_servers; {hint}.")
    for partition, offset in known.items():
        if partition[0] in topics and partition not in watermarks:
            raise SourceError(
                f"{where}: partition {partition[0]}/{partition[1]} is gone (the pipeline had read it up to offset "
                f"{offset}): the topic was deleted and recreated with fewer partitions. Restore it, or start a new "
                f"pipeline; {hint}."
            )
    positions: dict[Partition, int] = {}
    lost: dict[Partition, tuple[int, int]] = {}
    for partition, (low, high) in sorted(watermarks.items()):
        if partition in known:
            position = known[partition]
        elif checkpoint is not None:
            # A partition added since the checkpoint: everything in it is new to the pipeline.
            position = 0
        else:
            position = (start or {}).get(partition, low)
        if position > high:
            raise SourceError(
                f"{where}: partition {partition[0]}/{partition[1]} ends at offset {high} but the pipeline has read "
                f"up to {position}: its offsets went backwards (the topic was deleted and recreated?). Records the "
                f"new topic holds would be skipped or read twice: start a new pipeline for it; {hint}."
            )
        if position < low:
            if on_data_loss != "skip":
                raise SourceError(
                    f"{where}: partition {partition[0]}/{partition[1]}: offsets {position} to {low - 1} "
                    f"({low - position} records) are gone from the broker (retention or deleted records) before the "
                    f"pipeline read them. They are lost to this table: restore them to the topic if you can, or set "
                    f"source.on_data_loss: skip to go on from offset {low} (the loss is logged); {hint}."
                )
            lost[partition] = (position, low)
            position = low
        positions[partition] = position
    backlog = {p: watermarks[p][1] - positions[p] for p in positions if watermarks[p][1] > positions[p]}
    taken = share(backlog, limit)
    ranges = {p: (positions[p], positions[p] + n) for p, n in taken.items() if n > 0}
    after = {p: ranges[p][1] if p in ranges else positions[p] for p in positions}
    return Plan(ranges=ranges, positions=after, lost=lost, lag=sum(backlog.values()) - sum(taken.values()))


def compaction_risks(
    known: dict[Partition, int], watermarks: dict[Partition, tuple[int, int]], compacted: dict[str, int],
    recent: dict[Partition, int],
) -> dict[Partition, int]:
    """Partitions of compacted topics whose first unread record is older than the topic's
    ``delete.retention.ms``, with that record's offset (the checkpoint's position).

    ``known``: the checkpoint's positions (a new pipeline, or a partition it has not read, holds no
    key a lost delete could leave behind: what a tombstone deleted was compacted away with it);
    ``compacted``: the compacted topics' ``delete.retention.ms``; ``recent``: per partition, the
    first offset whose timestamp is within that window (-1: none is)."""
    out: dict[Partition, int] = {}
    for partition, position in sorted(known.items()):
        if partition[0] not in compacted or partition not in watermarks or position >= watermarks[partition][1]:
            continue
        first_recent = recent.get(partition, -1)
        if first_recent < 0 or first_recent > position:
            out[partition] = position
    return out


@dataclass(frozen=True)
class CompactionLag:
    """How old a compacted partition's first unread record is, beside the topic's
    ``delete.retention.ms``: past the window, deletes the pipeline has not read may be gone."""

    topic: str
    partition: int
    offset: int
    """The first unread record (the position the pipeline reads next)."""
    oldest_unread_ms: int
    """Its age when looked at."""
    delete_retention_ms: int

    @property
    def margin_ms(self) -> int:
        """Time left before the window passes (negative: already past)."""
        return self.delete_retention_ms - self.oldest_unread_ms

    def describe(self) -> str:
        state = "PAST" if self.margin_ms < 0 else f"{100 * self.oldest_unread_ms // max(self.delete_retention_ms, 1)}% of"
        return (
            f"compacted {self.topic}/{self.partition}: oldest unread record (offset {self.offset}) is "
            f"{_age(self.oldest_unread_ms)} old, {state} delete.retention.ms {duration(self.delete_retention_ms)}"
        )


def compaction_lags(
    positions: dict[Partition, int], watermarks: dict[Partition, tuple[int, int]], compacted: dict[str, int],
    timestamps: dict[Partition, int], now_ms: int,
) -> list[CompactionLag]:
    """Per partition of a compacted topic with records still to read, how old the first of them is
    beside the window, the nearest to its window first (a caught-up partition has no lag)."""
    out = []
    for partition, position in sorted(positions.items()):
        window = compacted.get(partition[0])
        if window is None or partition not in watermarks or position >= watermarks[partition][1] or partition not in timestamps:
            continue
        out.append(CompactionLag(partition[0], partition[1], position, max(now_ms - timestamps[partition], 0), window))
    return sorted(out, key=lambda lag: (lag.margin_ms, lag.topic, lag.partition))


def _age(ms: int) -> str:
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:.1f} h"
    if ms >= 60_000:
        return f"{ms // 60_000} min"
    return f"{ms / 1000:.0f} s" if ms >= 1000 else f"{ms} ms"


def duration(ms: int) -> str:
    """A window in ms as messages name it: ``604800000 ms (168 h)``."""
    if ms % 3_600_000 == 0:
        return f"{ms} ms ({ms // 3_600_000} h)"
    return f"{ms} ms ({ms / 1000:g} s)"


def byte_budgets(plan: Plan, max_bytes: int) -> dict[Partition, int]:
    """Each partition's share of ``max_bytes``, in proportion to the records the plan takes from it
    (as ``max_records`` is shared), so partitions move together."""
    total = plan.records
    return {p: max_bytes * (b - a) // total for p, (a, b) in plan.ranges.items()} if total else {}


def cut_by_bytes(plan: Plan, fits: dict[Partition, int]) -> Plan:
    """``plan`` cut to ``fits``: per partition, how many of its first records fit its byte budget.
    At least one record: when none fits anywhere (one record larger than its share), the first
    record of the first partition is taken, so the pipeline always progresses."""
    taken = {p: min(max(fits.get(p, 0), 0), b - a) for p, (a, b) in plan.ranges.items()}
    if plan.ranges and not any(taken.values()):
        taken[min(plan.ranges)] = 1
    ranges = {p: (a, a + taken[p]) for p, (a, _) in plan.ranges.items() if taken[p] > 0}
    positions = dict(plan.positions)
    for p, (a, _) in plan.ranges.items():
        positions[p] = a + taken[p]
    left = plan.records - sum(taken.values())
    return Plan(ranges=ranges, positions=positions, lost=plan.lost, lag=plan.lag + left, compaction=plan.compaction)


def offsets_text(offsets: dict[Partition, int]) -> str:
    """``topic/partition@offset, …`` for messages (``nothing`` when empty)."""
    return ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(offsets.items())) or "nothing"

