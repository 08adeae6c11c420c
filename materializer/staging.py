"""The staging area: where each epoch's rows wait, as Parquet, between the log commit and the apply.

One :class:`StagingArea` per pipeline (``<staging>/<pipeline_id>/``) owns its layout::

    staged/epoch-<epoch, 12 digits>/<binding>-<random>/   one Parquet dataset per binding and epoch
    spool/<writer>/epoch-<epoch>/…                        a source's files of the epoch being read
    _tmp/…                                                files on their way in
    skipped/epoch-<epoch>-<binding>-<random>/             rows set aside by ``recover --skip-epoch``

and everything done with it: staging an epoch's rows (:meth:`StagingArea.stage`), checking that a
staged dataset is whole before it is applied (:meth:`StagingArea.intact`, :meth:`StagingArea.read`),
and finding and deleting what no committed entry references (:meth:`StagingArea.open_cleans`,
:meth:`StagingArea.delete_unreferenced`). The driver, the runtime and the tools (status, recover,
drill) all ask it; none of them spells a path of its own.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable

from materializer import sqltypes
from materializer.bounds import bound_aggregates, bounds_from
from materializer.delta import quote
from materializer.errors import RecoveryLogError, StagingError, TableStateError, UnsafePathError
from materializer.protocol import DriverCheckpoint, StagedFile
from materializer.spark import is_connect
from materializer.storage import Store as FileStore
from materializer.storage import unsafe_reason


if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from materializer.config import BindingConfig, PipelineConfig

STAGED = "staged"
SPOOL = "spool"
SKIPPED = "skipped"
SCRATCH = (SPOOL, "_tmp")
"""Scratch folders of the staging store: source spools and files on their way in, per writer."""


def dataset_of(path: str) -> str:
    """The staged dataset a staged file belongs to: ``staged/epoch-<epoch>/<binding>-<random>``."""
    return "/".join(path.split("/")[:3])


def is_data_file(path: str) -> bool:
    """A Parquet dataset's data file (not ``_SUCCESS``, not a ``.crc`` or other hidden file)."""
    name = path.rsplit("/", 1)[-1]
    return not name.startswith(("_", "."))


class StagingArea:
    """A pipeline's staging area (``<staging>/<pipeline_id>/``): its layout and its datasets."""

    def __init__(self, store: FileStore, *, legacy_root: str | None = None) -> None:
        self.store = store
        """The store at the area's root; every path below is relative to it."""
        self.legacy_root = legacy_root
        """The staging folder itself, where versions before the per-pipeline areas staged (an
        entry committed by one and applied after an upgrade is read from there); None: same."""
        self._schemas: dict[str, Any] = {}
        """Dataset -> the schema this process wrote it with (:meth:`read` skips Parquet's schema
        inference, a Spark job per apply, for datasets it staged itself)."""

    @classmethod
    def of(cls, config: "PipelineConfig", store: FileStore | None = None) -> "StagingArea":
        """The area of ``config``'s pipeline (``store``: already opened at ``config.staging_root``)."""
        from materializer.storage import open_store

        return cls(
            store if store is not None else open_store(config.staging_root),
            legacy_root=config.staging if config.staging != config.staging_root else None,
        )

    @property
    def uri(self) -> str:
        return self.store.uri

    def spark_path(self, path: str) -> str:
        return self.store.spark_path(path)

    # --- layout ---

    @staticmethod
    def dataset_path(name: str, epoch: int) -> str:
        """A new, unique dataset for ``name``'s rows of ``epoch`` (a binding, or its dead letters)."""
        return f"{STAGED}/epoch-{epoch:012d}/{name}-{uuid.uuid4().hex[:12]}"

    @staticmethod
    def spool(writer: str, epoch: int | None = None) -> str:
        """A writer's spool (its sources' files of ``epoch``; None: all its epochs). Per writer: a
        zombie reading the same epoch as the newer run never shares its spool."""
        return f"{SPOOL}/{writer}" if epoch is None else f"{SPOOL}/{writer}/epoch-{epoch:012d}"

    @staticmethod
    def skipped_path(epoch: int, binding: str) -> str:
        """Where ``recover --skip-epoch`` keeps a binding's rows of a stuck epoch."""
        return f"{SKIPPED}/epoch-{epoch:012d}-{binding}-{uuid.uuid4().hex[:8]}"

    def datasets(self) -> list[str]:
        """Every staged dataset, as listed now."""
        return sorted({dataset_of(f.path) for f in self.store.list(STAGED)})

    def outside_areas(self) -> list[str]:
        """Files of the store outside every folder the area owns: nothing should put any there."""
        areas = (STAGED + "/", SKIPPED + "/") + tuple(f"{p}/" for p in SCRATCH)
        return [f.path for f in self.store.list() if not f.path.startswith(areas)]

    # --- staging an epoch ---

    def stage(self, name: str, epoch: int, df: "DataFrame", key: list[str]) -> StagedFile | None:
        """Write one binding's rows as a uniquely named Parquet dataset; None if there are none."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        path = self.dataset_path(name, epoch)
        observation = Observation(f"staged_{name}_{epoch}_{uuid.uuid4().hex[:6]}")
        df = _without_void(df)
        # The key bounds are observed on the same write (no second pass): the MERGE skips by them.
        bounds, kinds = bound_aggregates(df.schema, key)
        df.observe(observation, F.count(F.lit(1)).alias("rows"), *bounds).write.mode("error").parquet(
            self.store.spark_path(path)
        )
        observed = observation.get
        rows = int(observed["rows"])
        data = [f for f in self.store.list(path) if is_data_file(f.path)]
        if rows == 0:
            self.store.delete_prefix(path)
            return None
        self._schemas[path] = df.schema
        return StagedFile(
            uri=path, rows=rows, bytes=sum(f.size for f in data), files=len(data),
            key_bounds=bounds_from(observed, key, kinds) or None,
        )

    # --- checking a staged dataset ---

    def store_of(self, staged: StagedFile) -> FileStore:
        """The store holding ``staged``: this pipeline's area, or for an entry committed by a version
        before the per-pipeline areas (an upgrade between its log commit and its apply), the
        staging folder itself, where that version staged."""
        checked(staged)
        if self.store.list(staged.uri) or self.legacy_root is None:
            return self.store
        from materializer.storage import open_store

        legacy = open_store(self.legacy_root)
        return legacy if legacy.list(staged.uri) else self.store

    def found(self, staged: StagedFile, store: FileStore | None = None) -> tuple[int, int]:
        """The data files and bytes of ``staged`` there now (the checkpoint records what was written)."""
        files, size = 0, 0
        listing = (store or self.store).scan(checked(staged))
        if listing.links:
            # Spark would read through a link (a file of anyone's choosing): damage, never data.
            return -len(listing.links), 0
        for info in listing.files:
            if is_data_file(info.path):
                files += 1
                size += info.size
        return files, size

    def intact(self, staged: StagedFile) -> bool:
        """Is ``staged`` whole: the files and bytes its checkpoint recorded, no more, no less?"""
        return self.found(staged, self.store_of(staged)) == (staged.files, staged.bytes)

    def read(
        self, spark: "SparkSession", binding: "BindingConfig", epoch: int, staged: StagedFile, table_exists: bool = True
    ) -> "DataFrame":
        """The staged rows, once checked whole; else the error that says what to do."""
        store = self.store_of(staged)
        files, size = self.found(staged, store)
        if (files, size) != (staged.files, staged.bytes):
            found = "nothing" if files == 0 else f"{files} files, {size} bytes"
            if files < 0:
                found = f"{-files} symbolic link(s) among its files, which are never read"
            if files == 0 and not table_exists:
                # Staged files are deleted only after every table recorded the epoch: a missing
                # table with no staged file is most likely a table deleted after the apply.
                raise TableStateError(
                    f"epoch {epoch}, binding {binding.name}: table {binding.table} does not exist and epoch "
                    f"{epoch}'s staged file {self.store.uri}/{staged.uri} is gone. Either the table was deleted "
                    f"or moved after epoch {epoch} was applied to it (restore it at {binding.table}, e.g. from a "
                    "backup, then run again), or the staged file was damaged (run `materializer recover --config F`, "
                    "docs: 'Recovering from damage'). Nothing was changed."
                )
            raise StagingError(
                f"epoch {epoch}, binding {binding.name}: staged file {self.store.uri}/{staged.uri} is damaged or "
                f"missing (expected {staged.files} files, {staged.bytes} bytes; found {found}) and the table "
                f"does not record the epoch yet. Nothing of epoch {epoch} was applied to {binding.table}. "
                "Restore the staged file, or run `materializer recover --config F` to re-stage the epoch "
                "from the source (docs: 'Recovering from damage')."
            )
        reader = spark.read
        schema = self._schemas.get(staged.uri) if store is self.store else None
        if schema is not None and not is_connect(spark):
            # Written by this process with this schema (the files just checked whole): no Spark job
            # to infer it again. Not over Spark Connect, where a schema sent from the client
            # comes back with collated strings (materializer.sqltypes): the server infers it there.
            reader = reader.schema(schema)
        return reader.parquet(store.spark_path(staged.uri))

    # --- deleting ---

    def discard(self, files: Iterable[StagedFile | None]) -> None:
        """Delete datasets this writer staged for a transaction no committed entry references."""
        for staged in files:
            if staged is not None:
                self._schemas.pop(staged.uri, None)
                self.store.delete_prefix(checked(staged))

    def delete_applied(self, staged: StagedFile) -> None:
        """Delete an applied epoch's dataset (wherever it was staged: see :meth:`store_of`)."""
        self._schemas.pop(staged.uri, None)
        self.store_of(staged).delete_prefix(checked(staged))

    def delete_spool(self, writer: str, epoch: int | None = None) -> None:
        self.store.delete_prefix(self.spool(writer, epoch))

    def open_cleans(self, checkpoint: DriverCheckpoint | None) -> tuple[list[str], list[str]]:
        """What an Open deletes (files of staged datasets the last committed entry does not reference,
        every scratch file) and what it keeps (the rest), as listed now. The drill checks with this."""
        keep = set() if checkpoint is None else {f.uri for f in checkpoint.staged.values() if f is not None}
        keep |= set() if checkpoint is None else {f.uri for f in checkpoint.dead_letters.values()}
        deleted, kept = [], []
        self._refuse_links()
        for info in self.store.list(STAGED):
            (kept if dataset_of(info.path) in keep else deleted).append(info.path)
        deleted += [f.path for prefix in SCRATCH for f in self.store.list(prefix)]
        return deleted, kept

    def _refuse_links(self) -> None:
        """Stop if the area holds a symbolic link anywhere: staged files and spools are written and
        deleted through its folders, so a linked ``spool/`` (or ``staged/``, an epoch's folder, a
        dataset's file) would have them written, read or deleted wherever it points."""
        links = self.store.scan().links
        if links:
            shown = "; ".join(link.describe() for link in links[:3]) + (f"; and {len(links) - 3} more" if len(links) > 3 else "")
            raise UnsafePathError(
                f"staging area {self.store.uri} holds symbolic links ({shown}). The materializer never follows a link "
                "in its staging area nor deletes one it did not make: nothing was deleted, and nothing a link points to "
                "was touched. Remove the links (to put staging on another disk, point `staging` at it instead), then run "
                "again.",
                path=links[0].path,
            )

    def delete_unreferenced(self, checkpoint: DriverCheckpoint | None, fence_check: Callable[[], None]) -> tuple[int, int]:
        """Delete what :meth:`open_cleans` lists (Flink's abort of the in-doubt); the number of files
        and of staged datasets deleted.

        Safe on a stale view by construction: everything to delete is listed first, then the fence
        is checked (``fence_check`` raises FencedError if a newer writer holds the log), then only
        the listed files are deleted. A newer writer that opened before the check has published its
        fence (so this writer stops here); one that opens after it writes its files after the
        listing, so none of them is on the list.
        """
        orphans, _kept = self.open_cleans(checkpoint)
        if orphans:
            fence_check()
        for path in orphans:
            self.store.delete(path)
        datasets = sorted({dataset_of(p) for p in orphans if p.startswith(STAGED + "/")})
        for folder in datasets + list(SCRATCH):
            self.store.prune_empty(folder)  # not delete_prefix: files listed after the check stay
        return len(orphans), len(datasets)


def checked(staged: StagedFile) -> str:
    """``staged``'s path, once it is known to be a dataset inside the area's ``staged/`` folder (what
    :meth:`StagingArea.dataset_path` makes); else RecoveryLogError: the log is where it came from."""
    reason = unsafe_reason(staged.uri, under=STAGED)
    if reason is not None:
        raise RecoveryLogError(
            f"a committed recovery log entry names the staged file {staged.uri!r}, and {reason}: no version of the "
            "materializer writes that, so the entry was changed by hand or damaged. Nothing was deleted or applied. "
            "Stop the pipeline and run `materializer recover --config F` (docs: 'Recovering from damage')."
        )
    return staged.uri


def _void_as_string(dtype: Any) -> Any:
    """``dtype`` with every VOID (NullType) inside it made STRING; None if it holds no VOID."""
    from pyspark.sql.types import ArrayType, MapType, NullType, StringType, StructField, StructType

    if isinstance(dtype, NullType):
        return StringType()
    if isinstance(dtype, StructType):
        fields = [_void_as_string(f.dataType) for f in dtype.fields]
        if all(f is None for f in fields):
            return None
        return StructType(
            [StructField(f.name, new or f.dataType, f.nullable) for f, new in zip(dtype.fields, fields)]
        )
    if isinstance(dtype, ArrayType):
        element = _void_as_string(dtype.elementType)
        return None if element is None else ArrayType(element, dtype.containsNull)
    if isinstance(dtype, MapType):
        value = _void_as_string(dtype.valueType)
        return None if value is None else MapType(dtype.keyType, value, dtype.valueContainsNull)
    return None


def _without_void(df: "DataFrame") -> "DataFrame":
    """Parquet cannot hold a VOID column (a field NULL in the whole epoch, inside a struct): stage
    it as a STRING column of NULLs, which the MERGE's alignment casts to the table's type."""
    from pyspark.sql import functions as F

    changed = {f.name: _void_as_string(f.dataType) for f in df.schema.fields}
    if all(t is None for t in changed.values()):
        return df
    return df.select(
        *[F.col(quote(name)).cast(sqltypes.plain(t)).alias(name) if t is not None else F.col(quote(name)) for name, t in changed.items()]
    )
