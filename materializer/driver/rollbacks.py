"""A table rolled back below what the log says it holds, found at Open before anything is written
(docs: 'Sharing the table with maintenance and people', Rollbacks).

Two ways a table loses epochs the log says were applied, and each is seen its own way:

* **In the same Delta log** (``RESTORE TABLE … TO VERSION AS OF``, ``CREATE OR REPLACE``): the
  table's transaction ids are kept (Delta's RESTORE does not roll back ``txn`` actions: a table
  restored from epoch 3 to epoch 2 still records epoch 3), so a replay of the lost epoch would be
  skipped and its rows never land. Only the history says it: walking back from the latest version
  over the commits after our last one, a RESTORE jumps to its target version and a REPLACE ends the
  walk; landing below our last commit means the epochs committed in between are gone.
* **A new log in the table's place** (a ``CLONE`` of an older version, or a copy of the folder
  put there): the transaction ids are the copy's, below the epoch the log says the table records
  (none at all for a CLONE, which copies no ``txn`` action).

A binding whose table the pending epoch empties first (``backfill --truncate``) is not checked:
its rows are written again from the source whatever the table lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from materializer.config import BindingConfig
from materializer.delta import TableRef, TableWriters
from materializer.driver.table_changes import Commit, commits_after, last_own_version
from materializer.errors import TableStateError
from materializer.protocol import DriverCheckpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPLACES = frozenset({
    "CREATE OR REPLACE TABLE", "CREATE OR REPLACE TABLE AS SELECT", "REPLACE TABLE", "REPLACE TABLE AS SELECT",
})
"""Operations that give the table new contents in its own log: what was there before is gone."""


def floor(name: str, checkpoint: DriverCheckpoint | None) -> int:
    """The lowest epoch binding ``name``'s table may record at Open (0: any, or none).

    The last committed epoch may not be applied yet (Open re-applies it): where its apply commits
    to the table, the table records that epoch or the one before; an earlier epoch that wrote rows
    to it was applied (epoch N+1 commits only after N is), so it records some epoch of ours."""
    if checkpoint is None:
        return 0
    if checkpoint.commits_to(name):
        return 1 if name in checkpoint.written else 0
    return checkpoint.table_records(name)


def check(
    spark: "SparkSession", binding: BindingConfig, table: TableRef, version: int | None, txn_version: int | None,
    writers: TableWriters, pipeline: str, checkpoint: DriverCheckpoint | None,
) -> None:
    """Raise :class:`TableStateError` when the table lost epochs the log says it holds."""
    if checkpoint is not None and binding.name in checkpoint.truncate and (txn_version or 0) < checkpoint.epoch:
        return  # its pending apply deletes every row first; the source is read again
    least = floor(binding.name, checkpoint)
    if least and (txn_version is None or txn_version < least):
        recorded = f"records epoch {txn_version}" if txn_version is not None else "records no epoch"
        raise TableStateError(_message(
            binding, pipeline,
            f"its Delta log {recorded} of pipeline {pipeline!r}, but the recovery log says it holds epoch {least} "
            f"(the table was replaced by a copy or a CLONE of an older state, or its folder by another)",
            f"epochs {(txn_version or 0) + 1}-{least}" if least > (txn_version or 0) + 1 else f"epoch {least}",
            restore_to=None,
        ))
    since = last_own_version(writers, pipeline, binding)
    if since is None or version is None or version <= since:
        return  # nothing of ours, or nobody committed after us: nothing was rolled back
    if _rolled_back_to(commits_after(spark, table, since - 1), since) is None:
        return
    # Rare: the whole history, read once, so a restore by timestamp finds its version and the
    # lost epochs are those of our commits between the target and our last commit.
    history = commits_after(spark, table, -1)
    lost_at = _rolled_back_to(history, since)
    if lost_at is None:
        return
    target, how = lost_at
    ours = {binding.name, *binding.previous_names}
    lost = sorted({
        int(c.tag["epoch"]) for c in history
        if target < c.version <= since and c.tag is not None and c.tag.get("pipeline") == pipeline
        and c.tag.get("binding") in ours and str(c.tag.get("epoch", "")).isdigit()
    })
    shown = _epochs(lost) if lost else "the epochs it held"
    raise TableStateError(_message(binding, pipeline, how, shown, restore_to=since))


def _rolled_back_to(commits: list[Commit], since: int) -> tuple[int, str] | None:
    """Walk back from the latest version through the commits after ``since`` (our last, the first
    of ``commits``): where the table's contents come from. (target version, what happened) when
    that is below ``since``; None when the contents still build on our last commit."""
    by_version = {c.version: c for c in commits}
    version = max(by_version)
    while version > since:
        commit = by_version.get(version)
        if commit is None:
            return None  # a version not read (cannot be after ``since``): nothing to say
        if commit.operation in REPLACES:
            return -1, f"{commit.shown()} replaced its contents after the pipeline's last commit (version {since})"
        if commit.operation == "RESTORE":
            target = _restore_target(commit, commits)
            if target is None or target < since:
                where = f"version {target}" if target is not None else f"{commit.parameters.get('timestamp')}"
                return (target if target is not None else -1), (
                    f"{commit.shown()} restored it to {where}, before the pipeline's last commit (version {since})"
                )
            version = target
            continue
        version -= 1
    return None


def _restore_target(commit: Commit, commits: list[Commit]) -> int | None:
    """The version a RESTORE went back to: its ``version`` parameter, or, for ``TIMESTAMP AS OF``,
    the last of ``commits`` made at or before that time (None: before all of them). The timestamp
    is the statement's text, read as UTC when it names no zone (Spark reads it in the session's)."""
    value = commit.parameters.get("version")
    if value not in (None, "", "NULL") and str(value).strip('"').isdigit():
        return int(str(value).strip('"'))
    stamp = commit.parameters.get("timestamp")
    if stamp in (None, "", "NULL"):
        return None
    import datetime

    try:
        when = datetime.datetime.fromisoformat(str(stamp).strip('"').replace(" ", "T"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    millis = when.timestamp() * 1000
    before = [c.version for c in commits if c.timestamp is not None and c.timestamp <= millis and c.version < commit.version]
    return max(before) if before else None


def _epochs(epochs: list[int]) -> str:
    """``[3]`` -> ``epoch 3``; ``[2, 3, 4, 7]`` -> ``epochs 2-4, 7``."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and e == runs[-1][-1] + 1:
            runs[-1].append(e)
        else:
            runs.append([e])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return ("epochs " if len(epochs) > 1 else "epoch ") + ", ".join(parts)


def _message(binding: BindingConfig, pipeline: str, how: str, lost: str, *, restore_to: int | None) -> str:
    forward = (
        f"restore it forward (RESTORE TABLE {binding.table} TO VERSION AS OF {restore_to}, the pipeline's last "
        "commit) and run again, or "
        if restore_to is not None else "put the table it replaced back in its place and run again, or "
    )
    return (
        f"binding {binding.name!r}: table {binding.table} lost {lost} of pipeline {pipeline!r}: {how}. Going on would "
        "leave those epochs' rows out for good (Delta would skip them as already applied). To recover, "
        + forward
        + f"read the source into it again with `materializer backfill --config … --binding {binding.name} --truncate` "
        "(the table is emptied in an epoch of its own, then every row lands again). Nothing was written."
    )
