"""Stores for the recovery log and the staging area, chosen by URI scheme.

A store is a flat namespace of immutable files under a root URI: a local folder
(:mod:`materializer.storage.local`) or an S3 prefix (:mod:`materializer.storage.s3`). Both publish
files atomically and both can create a file only if it does not exist yet, which is what lets two
writers never commit the same recovery-log sequence number.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import BinaryIO, Callable


@dataclass(frozen=True)
class FileInfo:
    path: str
    """Path relative to the store's root, with '/' separators."""
    size: int
    """Size in bytes."""


class Store(ABC):
    """A folder of immutable files, local or on S3."""

    uri: str

    @abstractmethod
    def spark_path(self, path: str) -> str:
        """The URI Spark uses for ``path`` (a local path, or ``s3a://`` for S3)."""

    @abstractmethod
    def put_if_absent(self, path: str, data: bytes, *, before_publish: Callable[[], None] | None = None) -> bool:
        """Publish ``data`` atomically at ``path`` unless a file is there; False if one is.

        ``before_publish`` runs once the bytes are durable but not yet visible (a crash window).
        """

    @abstractmethod
    def get(self, path: str) -> bytes:
        """The file's bytes; FileNotFoundError if there is none."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[FileInfo]:
        """Every file below ``prefix`` (recursively), sorted by path."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete one file; no error if it is already gone."""

    @abstractmethod
    def open_read(self, path: str, offset: int = 0) -> BinaryIO:
        """A binary stream of the file from byte ``offset``; FileNotFoundError if there is none."""

    @abstractmethod
    def put_file(self, path: str, local_file: str) -> None:
        """Publish a local file at ``path`` (replacing any), then remove the local file."""

    def local_temp_dir(self) -> str:
        """A local folder for files on their way to :meth:`put_file`."""
        import tempfile

        return tempfile.gettempdir()

    def delete_prefix(self, prefix: str) -> int:
        """Delete every file below ``prefix``; returns how many were deleted."""
        files = self.list(prefix)
        for info in files:
            self.delete(info.path)
        return len(files)

    def prune_empty(self, prefix: str) -> None:  # noqa: B027 - stores without folders have nothing to do
        """Remove the empty folders below ``prefix`` (and ``prefix`` itself if empty); no file is touched."""

    def size(self, prefix: str) -> tuple[int, int]:
        """(number of files, total bytes) below ``prefix``."""
        files = self.list(prefix)
        return len(files), sum(f.size for f in files)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def is_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_VOLUME_URI = "dbfs:/Volumes/"


def local_path(uri: str) -> str | None:
    """The local (or FUSE-mounted) path ``uri`` names, or None if it is not a local one.

    Local: a plain path (absolute, relative, ``~``), ``file:///abs`` or ``file:/abs``, and
    Databricks volumes as ``/Volumes/…`` or ``dbfs:/Volumes/…`` (the same folder, which Python sees
    through the volume's FUSE mount and Spark by the same path).
    """
    if uri.startswith(_VOLUME_URI):
        return uri[len("dbfs:") :]
    if uri.startswith("file:"):
        rest = uri[len("file:") :]
        if rest.startswith("///") or (rest.startswith("/") and not rest.startswith("//")):
            return "/" + rest.lstrip("/")
        return None  # file://host/… or file:relative: not a path on this machine
    if _SCHEME.match(uri) and not re.match(r"^[A-Za-z]:[\\/]", uri):
        return None
    return uri


def check_uri(uri: str, what: str) -> None:
    """Refuse a store URI whose scheme has no store yet, before anything runs.

    Without this, ``abfss://c@a/log`` would be taken as a relative local folder named after the
    URI, and a recovery log "on Azure" would live on the driver's disk (and die with it).
    """
    if is_s3(uri) or local_path(uri) is not None:
        return
    from materializer.errors import ConfigError

    scheme = _SCHEME.match(uri)
    if uri.startswith("dbfs:"):
        hint = "the DBFS root is not supported: use a volume (/Volumes/<catalog>/<schema>/<volume>/…) or s3://"
    elif uri.startswith("file:"):
        hint = "a file: URI must name an absolute path on this machine (file:///abs/path)"
    else:
        hint = f"{scheme.group(1) if scheme else uri}:// stores are not supported yet: use a local folder, a volume (/Volumes/…) or s3://"
    raise ConfigError(f"{what} {uri!r}: {hint}")


def open_store(uri: str) -> Store:
    """The store for ``uri``: ``s3://bucket/prefix`` (or ``s3a://``), or a local (volume) folder.

    Any other scheme is refused (:func:`check_uri`), never taken for a local folder's name.
    """
    check_uri(uri, "store")
    if is_s3(uri):
        from materializer.storage.s3 import S3Store

        return S3Store(uri)
    from materializer.storage.local import LocalStore

    return LocalStore(local_path(uri) or uri)
