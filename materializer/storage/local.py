"""A local folder (or a mounted volume such as ``/Volumes/…`` or ``/dbfs/…``) as a store."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from materializer.storage import FileInfo, Store

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
        base = self._path(prefix)
        if base.is_file():
            return [FileInfo(prefix, base.stat().st_size)]
        if not base.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = Path(dirpath) / name
                try:
                    size = full.stat().st_size
                except FileNotFoundError:
                    continue
                out.append(FileInfo(full.relative_to(self.root).as_posix(), size))
        return sorted(out, key=lambda f: f.path)

    def delete(self, path: str) -> None:
        try:
            self._path(path).unlink()
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> int:
        count = super().delete_prefix(prefix)
        # Spark leaves empty folders behind; remove them bottom-up so no orphan folder remains.
        self.prune_empty(prefix)
        return count

    def prune_empty(self, prefix: str) -> None:
        base = self._path(prefix)
        if base.is_dir():
            for dirpath, _dirs, _files in sorted(os.walk(base), key=lambda t: -len(t[0])):
                try:
                    os.rmdir(dirpath)  # only an empty folder: a file written meanwhile keeps it
                except OSError:
                    pass
