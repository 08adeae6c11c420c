"""What the soak reads each window (``materializer bench --soak``), from outside the pipeline's run:

* its processes: the driver's Python (the ``materializer run`` process) and the Spark JVM under it,
  each one's RSS, CPU seconds and open file descriptors (psutil), and the JVM's heap after a full
  GC: the bytes of the live objects ``jcmd <pid> GC.class_histogram`` counts (it runs a full GC
  first), and ``jstat -gc``'s heap used just after (eden refilled since included) and metaspace; or
  why they could not be read;
* its stores: the recovery log's entries and bytes, the staging area's files by kind (staged,
  spool, ``_tmp``), and per table its live data files (the Delta log, read by delta-rs), its data
  files on disk, its ``_delta_log`` bytes, commits and checkpoints.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from materializer.recovery_log import ENTRIES

JCMD_TIMEOUT = 60.0


class ProcessProbe:
    """The driver process ``pid`` and the JVM it starts (found among its descendants)."""

    def __init__(self, pid: int) -> None:
        from materializer.extras import require

        self._psutil = require("psutil", purpose="the soak's process probes")
        self.driver = self._psutil.Process(pid)
        self.jvm: Any = None
        self.jcmd = shutil.which("jcmd")
        self.jstat = shutil.which("jstat")

    def find_jvm(self) -> int | None:
        if self.jvm is None:
            try:
                for child in self.driver.children(recursive=True):
                    if "java" in child.name().lower():
                        self.jvm = child
                        break
            except self._psutil.Error:
                return None
        return None if self.jvm is None else int(self.jvm.pid)

    def _read(self, proc: Any) -> dict[str, Any]:
        if proc is None:
            return {"rss": None, "cpu": None, "fds": None}
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                return {"rss": proc.memory_info().rss, "cpu": times.user + times.system, "fds": proc.num_fds()}
        except self._psutil.Error:
            return {"rss": None, "cpu": None, "fds": None}

    def read(self, heap: bool = True) -> dict[str, dict[str, Any]]:
        """RSS, CPU seconds and descriptors of both; with ``heap``, the JVM's heap after a full GC."""
        self.find_jvm()
        jvm = self._read(self.jvm)
        if heap:
            jvm.update(self.heap_after_gc())
        return {"driver": self._read(self.driver), "jvm": jvm}

    def heap_probe(self) -> str:
        """How the heap is read here, or why it is not (said in the report instead of a figure)."""
        if self.jcmd is None or self.jstat is None:
            return "not measured: jcmd or jstat is not on the PATH (they ship with a JDK, not a JRE)"
        return "jcmd GC.class_histogram (live objects after its full GC); jstat -gc (heap used just after, metaspace)"

    def heap_after_gc(self) -> dict[str, Any]:
        """``heap_after_gc`` (live objects), ``heap_used`` (jstat, just after) and ``metaspace`` in
        bytes, or None with ``heap_error`` saying why."""
        out: dict[str, Any] = {"heap_after_gc": None, "heap_used": None, "metaspace": None}
        pid = self.find_jvm()
        if pid is None or self.jcmd is None or self.jstat is None:
            out["heap_error"] = "no JVM found" if pid is None else self.heap_probe()
            return out
        try:
            # A full GC in the pipeline's JVM, once a window, and the objects that survive it: what
            # the pipeline holds. jstat's used heap just after (GC.run, then jstat) was not that: a
            # busy epoch refills eden within the moment between them (206-515 MB in one soak).
            histogram = subprocess.run(
                [self.jcmd, str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=JCMD_TIMEOUT, check=True
            )
            out["heap_after_gc"] = parse_histogram_total(histogram.stdout)
            stat = subprocess.run([self.jstat, "-gc", str(pid)], capture_output=True, text=True, timeout=JCMD_TIMEOUT, check=True)
            used = parse_jstat_gc(stat.stdout)
            out["heap_used"], out["metaspace"] = used["heap_used"], used["metaspace"]
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            out["heap_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return out


def parse_histogram_total(text: str) -> int:
    """``jcmd GC.class_histogram``'s last line, ``Total <instances> <bytes>``: the live objects' bytes."""
    for line in reversed(text.strip().splitlines()):
        words = line.split()
        if words and words[0] == "Total" and len(words) >= 3:
            return int(words[2])
    raise ValueError(f"jcmd GC.class_histogram printed no Total line: {text[-200:]!r}")


def parse_jstat_gc(text: str) -> dict[str, int]:
    """``jstat -gc``'s header and values (kB) -> heap used (survivors, eden, old) and metaspace used, bytes."""
    lines = [line.split() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        raise ValueError(f"jstat -gc printed no figures: {text[:200]!r}")
    values = dict(zip(lines[0], lines[-1]))
    used = sum(float(values[k]) for k in ("S0U", "S1U", "EU", "OU") if k in values and values[k] != "-")
    return {"heap_used": int(used * 1024), "metaspace": int(float(values.get("MU", "0")) * 1024)}


# --- the stores -----------------------------------------------------------------------------------


def _files(folder: Path) -> list[Path]:
    if not folder.exists():
        return []
    out = []
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                out.append(path)
        except OSError:  # removed while walking: the pipeline's GC is running
            continue
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_store(folder: Path) -> dict[str, Any]:
    """The recovery log (a local folder): entry files, and every file's bytes."""
    files = _files(folder)
    entries = [p for p in files if p.parent.name == ENTRIES]
    return {"entries": len(entries), "files": len(files), "bytes": sum(_size(p) for p in files)}


def staging_store(folder: Path) -> dict[str, Any]:
    """The staging folder: its files, and by kind (``staged``, ``spool``, ``_tmp``, …, the first
    folder under the pipeline's area)."""
    files = _files(folder)
    by_kind: dict[str, int] = {}
    for path in files:
        parts = path.relative_to(folder).parts
        kind = parts[1] if len(parts) > 2 else parts[0]
        by_kind[kind] = by_kind.get(kind, 0) + 1
    return {"files": len(files), "bytes": sum(_size(p) for p in files), "by_kind": by_kind}


def table_store(table: Path) -> dict[str, Any]:
    """A Delta table on disk: its live files (delta-rs reads the log), data files on disk, and its log."""
    if not (table / "_delta_log").exists():
        return {"live_files": None, "disk_files": 0, "delta_log_bytes": 0, "commits": 0, "checkpoints": 0}
    log = _files(table / "_delta_log")
    data = [p for p in _files(table) if "_delta_log" not in p.parts and p.suffix == ".parquet"]
    try:
        from deltalake import DeltaTable

        live: int | None = len(DeltaTable(str(table)).file_uris())
    except Exception:  # noqa: BLE001 - a commit being written, a feature delta-rs cannot read: not a figure
        live = None
    return {
        "live_files": live,
        "disk_files": len(data),
        "delta_log_bytes": sum(_size(p) for p in log),
        "commits": sum(1 for p in log if p.suffix == ".json" and p.stem.isdigit()),
        "checkpoints": sum(1 for p in log if ".checkpoint" in p.name and p.suffix == ".parquet"),
    }
