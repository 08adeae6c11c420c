"""A local folder (or a mounted volume such as ``/Volumes/…`` or ``/dbfs/…``) as a store.

Symbolic links: the root may be one (or lie under one: it is the folder the configuration names),
but nothing below it is followed. :meth:`LocalStore.scan` lists links apart from files and never
walks into a linked folder; every delete opens each folder from the resolved root down with
``O_NOFOLLOW`` (a folder swapped for a link meanwhile fails to open, it is not followed) and refuses
a path that is absolute, holds ``..`` (:func:`materializer.storage.check_relative`) or meets a link
on its way or at its end: clean-up never leaves the root, and never touches what a link points to.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from materializer.errors import UnsafePathError
from materializer.storage import FileInfo, LinkInfo, Listing, Store, check_relative

TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(Store):
    def __init__(self, uri: str) -> None:
        root = uri[len("file://") :] if uri.startswith("file://") else uri
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)

    def _path(self, path: str) -> Path:
        return self.root / path

    def spark_path(self, path: str) -> str:
        return str(self._path(path))

    def put_if_absent(self, path: str, data: bytes, *, before_publish: Callable[[], None] | None = None) -> bool:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if before_publish is not None:
                before_publish()
            # link() fails if the name exists: the exclusive, atomic publish.
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            except FileNotFoundError:
                # Our temp file is gone: a newer writer's Open cleaned the folder while we were
                # in this window, so it holds the log now. Nothing was published: as if taken.
                return False
            _fsync_dir(target.parent)
            return True
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def get(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def open_read(self, path: str, offset: int = 0) -> BinaryIO:
        handle = open(self._path(path), "rb")
        if offset:
            handle.seek(offset)
        return handle

    def put_file(self, path: str, local_file: str) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(local_file, target)

    def local_temp_dir(self) -> str:
        # Same file system as the store, so put_file is a rename.
        folder = self.root / "_tmp"
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    def list(self, prefix: str = "") -> list[FileInfo]:
        return self.scan(prefix).files

    def scan(self, prefix: str = "") -> Listing:
        files: list[FileInfo] = []
        links: list[LinkInfo] = []
        parts = [p for p in prefix.split("/") if p]
        # A prefix under a link (or one itself): the link is all there is to see, never its target.
        for depth in range(1, len(parts) + 1):
            name = "/".join(parts[:depth])
            try:
                mode = os.lstat(self._path(name)).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return Listing([], [])
            if stat.S_ISLNK(mode):
                return Listing([], [self._link(name)])
        base = self._path(prefix)
        try:
            # The root itself may be a link (the configured folder): followed, as the root is resolved.
            info = os.lstat(base) if parts else os.stat(base)
        except (FileNotFoundError, NotADirectoryError):
            return Listing([], [])
        if not stat.S_ISDIR(info.st_mode):
            return Listing([FileInfo(prefix, info.st_size, info.st_mtime)], [])
        # os.walk's followlinks=False never walks into a linked folder; each entry is lstat'ed, as
        # is_file() and stat() would follow a link to a file.
        for dirpath, dirs, names in os.walk(base):
            folder = Path(dirpath)
            for name in list(dirs):
                if (folder / name).is_symlink():
                    dirs.remove(name)
                    links.append(self._link((folder / name).relative_to(self.root).as_posix()))
            for name in names:
                full = folder / name
                try:
                    info = os.lstat(full)
                except FileNotFoundError:
                    continue
                relative = full.relative_to(self.root).as_posix()
                if stat.S_ISLNK(info.st_mode):
                    links.append(self._link(relative))
                else:
                    files.append(FileInfo(relative, info.st_size, info.st_mtime))
        return Listing(sorted(files, key=lambda f: f.path), sorted(links, key=lambda f: f.path))

    def _link(self, path: str) -> LinkInfo:
        full = self._path(path)
        try:
            target = os.readlink(full)
        except OSError:
            target = "?"
        try:
            info = os.stat(full)  # follows: what the link points to now
        except OSError:  # nothing there, or a loop of links
            return LinkInfo(path, target, "dangling")
        if stat.S_ISREG(info.st_mode):
            return LinkInfo(path, target, "file", info.st_size, info.st_mtime)
        return LinkInfo(path, target, "folder" if stat.S_ISDIR(info.st_mode) else "other")

    # --- deleting: never outside the root, never through a link ---

    def _refuse_link(self, path: str, doing: str) -> UnsafePathError:
        return UnsafePathError(
            f"refused to {doing} {self.uri}/{path}: {self._link(path).describe()} is a symbolic link. Clean-up never "
            "follows a link nor deletes one it did not make, so nothing it points to was touched (and nothing "
            "below this path was deleted). Remove the link (or put the real folder in its place), then run again.",
            path=path,
        )

    def _open_folder(self, parts: list[str], path: str, doing: str) -> int | None:
        """A descriptor of the folder ``parts`` below the resolved root, each folder opened without
        following a link; None if one is missing (then there is nothing to delete)."""
        try:
            fd = os.open(os.path.realpath(self.root), os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        for depth, part in enumerate(parts, start=1):
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                os.close(fd)
                return None
            except OSError as exc:
                os.close(fd)
                if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
                    raise self._refuse_link("/".join(parts[:depth]), doing) from None
                raise
            os.close(fd)
            fd = child
        return fd

    def delete(self, path: str) -> None:
        parts = check_relative(path, "delete")
        fd = self._open_folder(parts[:-1], path, "delete")
        if fd is None:
            return
        try:
            try:
                mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return
            if stat.S_ISLNK(mode):
                raise self._refuse_link(path, "delete")
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(self._path(path)))
            try:
                # Relative to the folder opened without links: a folder swapped for a link since
                # is not followed (unlink of a name swapped for a link removes the link, never its target).
                os.unlink(parts[-1], dir_fd=fd)
            except FileNotFoundError:
                pass
        finally:
            os.close(fd)

    def delete_prefix(self, prefix: str) -> int:
        check_relative(prefix, "delete", empty=True)
        listing = self.scan(prefix)
        if listing.links:
            # Refused before anything is deleted: a half-done clean-up would be harder to read.
            raise self._refuse_link(listing.links[0].path, "delete")
        for info in listing.files:
            self.delete(info.path)
        # Spark leaves empty folders behind; remove them bottom-up so no orphan folder remains.
        self.prune_empty(prefix)
        return len(listing.files)

    def prune_empty(self, prefix: str) -> None:
        parts = check_relative(prefix, "prune the folders of", empty=True)
        if not parts:
            top = self._open_folder([], prefix, "prune the folders of")
            if top is not None:
                self._prune_below(top)
            return
        fd = self._open_folder(parts[:-1], prefix, "prune the folders of")
        if fd is None:
            return
        try:
            try:
                child = os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise self._refuse_link(prefix, "prune the folders of") from None
                raise
            self._prune_below(child)
            try:
                os.rmdir(parts[-1], dir_fd=fd)  # only an empty folder: a file written meanwhile keeps it
            except OSError:
                pass
        finally:
            os.close(fd)

    @staticmethod
    def _prune_below(fd: int) -> None:
        """Remove the empty folders below the folder ``fd`` (closed after), bottom-up; a link to a
        folder is not a folder here (fwalk does not follow it, and rmdir refuses one)."""
        try:
            for _path, dirs, _files, dirfd in os.fwalk(".", topdown=False, follow_symlinks=False, dir_fd=fd):
                for name in dirs:
                    try:
                        if stat.S_ISDIR(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                            os.rmdir(name, dir_fd=dirfd)
                    except OSError:
                        pass
        finally:
            os.close(fd)
