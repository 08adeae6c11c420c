"""Stores for the recovery log and the staging area, chosen by URI scheme.

A store is a flat namespace of immutable files under a root URI: a local folder
(:mod:`materializer.storage.local`) or an S3 prefix (:mod:`materializer.storage.s3`). Both publish
files atomically and both can create a file only if it does not exist yet, which is what lets two
writers never commit the same recovery-log sequence number.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Literal


@dataclass(frozen=True)
class FileInfo:
    path: str
    """Path relative to the store's root, with '/' separators."""
    size: int
    """Size in bytes."""
    modified: float | None = field(default=None, compare=False)
    """When the file was last written (Unix seconds: a local file's mtime, an S3 object's
    LastModified); None where the store does not say. Not part of equality: a listing compares
    files by name and size, as the checkpoints do."""


@dataclass(frozen=True)
class LinkInfo:
    path: str
    """Path of the symbolic link relative to the store's root, with '/' separators."""
    target: str
    """What the link says it points to (``os.readlink``), as written in it."""
    kind: Literal["file", "folder", "dangling", "other"]
    """What the target is now: a regular file, a folder, nothing (or a loop of links), anything else."""
    size: int = 0
    """The target's size in bytes, for a file."""
    modified: float | None = field(default=None, compare=False)
    """The target's modification time (Unix seconds), for a file."""

    def describe(self) -> str:
        what = {"file": "a file", "folder": "a folder", "dangling": "nothing", "other": "neither a file nor a folder"}
        return f"{self.path} -> {self.target} ({what[self.kind]})"


@dataclass(frozen=True)
class Listing:
    """What :meth:`Store.scan` found below a prefix: the files, and the symbolic links apart."""

    files: list[FileInfo]
    """Every regular file, sorted by path; never a link, never a file reached through one."""
    links: list[LinkInfo]
    """Every symbolic link met (to a file or a folder, dangling or not), sorted by path; none was
    followed. A prefix that is itself a link, or lies under one, is the one link listed."""


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
        """Every file below ``prefix`` (recursively), sorted by path; a symbolic link is never
        listed nor followed (see :meth:`scan`)."""

    def scan(self, prefix: str = "") -> Listing:
        """:meth:`list`, with the symbolic links met apart (a store without links has none)."""
        return Listing(self.list(prefix), [])

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
        check_relative(prefix, "delete", empty=True)
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


_ENCODED = re.compile(r"%(2e|2f|5c|00)", re.IGNORECASE)


def unsafe_reason(path: str, *, under: str | None = None) -> str | None:
    """Why ``path`` could name something outside a store's root (or outside its folder ``under``),
    or None if it cannot.

    One rule for every store (local folders and S3 keys alike, though S3 has no folders to leave):
    refused are an absolute path (``/x``, ``\\x``, ``C:x``), a URI (``file:///x``, ``s3://b/k``), a
    ``.`` or ``..`` segment anywhere (``a/../../x``), a backslash, a NUL, and the URL-encoded forms
    of a dot, a slash, a backslash or a NUL (``%2e%2e/x``), which a decoder on the way might turn into
    them. No path the materializer makes has any of these.
    """
    if path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        return "it is absolute"
    if _SCHEME.match(path.split("/", 1)[0]):
        return "it is a URI, not a path inside the store"
    if "\\" in path or "\0" in path:
        return "it holds a backslash or a NUL"
    if _ENCODED.search(path):
        return "it holds a URL-encoded dot, slash, backslash or NUL"
    if any(p in (".", "..") for p in path.split("/")):
        return "it holds a '.' or '..' segment"
    if under is not None and not path.startswith(under.rstrip("/") + "/"):
        return f"it is not inside the {under}/ folder"
    return None


def check_relative(path: str, doing: str, *, empty: bool = False) -> list[str]:
    """``path``'s segments, once :func:`unsafe_reason` finds nothing; else UnsafePathError.
    ``empty``: the root itself (``""``) is allowed."""
    reason = "it is empty (the store's root itself)" if path == "" and not empty else unsafe_reason(path)
    if reason is not None:
        from materializer.errors import UnsafePathError

        raise UnsafePathError(
            f"refused to {doing} {path!r}: {reason}, so it could name something outside the store's root. "
            "Nothing was deleted. Paths come from the materializer itself or from its recovery log: if the log "
            "holds this one, it was changed by hand or damaged (run `materializer recover --config F`, docs: "
            "'Recovering from damage').",
            path=path,
        )
    return [p for p in path.split("/") if p != ""]


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
