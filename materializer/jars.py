"""The jars a local session needs beside pyspark's own: resolved once, then started from a manifest.

Spark's ``spark.jars.packages`` re-resolves on every start (seconds, and a 90-line Ivy report), reads
the user's ``~/.m2`` (a pom there without its jar fails the resolution), and adds second copies of
libraries pyspark already ships (Hadoop 3.4.2 and Parquet 1.16 beside pyspark's 3.5.0 and 1.17).
So we resolve ourselves, once per set of coordinates, with the Ivy that pyspark ships:

* from Maven Central only (or the mirror ``MATERIALIZER_MAVEN_REPO`` names): a generated
  ``ivysettings.xml`` with one resolver, no local Maven or Ivy repositories;
* excluding every module pyspark has a jar of (its copy wins, as it would on the classpath anyway);
* the report goes to ``<cache>/resolve.log``; the resulting jar paths to a manifest
  ``<cache>/manifest-<key>.json`` keyed by the coordinates, the exclusions and the repository.

Later sessions read the manifest and pass the paths as ``spark.jars``: no resolution at all.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence
from xml.sax.saxutils import quoteattr

from materializer.errors import StartupError

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MANIFEST_FORMAT = 1
RESOLVE_TIMEOUT_SECONDS = 1800  # the AWS SDK bundle of hadoop-aws is ~690 MB


def maven_repo() -> str:
    """The one repository jars come from: Maven Central unless ``MATERIALIZER_MAVEN_REPO`` names a mirror."""
    return os.environ.get("MATERIALIZER_MAVEN_REPO", "").strip().rstrip("/") or MAVEN_CENTRAL


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


_VERSION_START = re.compile(r"-(?=\d)")


def shipped_modules(jars_dir: Path | None = None) -> set[str]:
    """Module (artifact) names pyspark ships a jar of, read from its jar file names.

    A name like ``log4j-1.2-api-2.25.4.jar`` does not say where the artifact id ends, so every
    prefix before a ``-<digit>`` is taken (``log4j`` and ``log4j-1.2-api``): excluding a module
    pyspark does not ship under that exact name only keeps a second copy of a library off the
    classpath, and the session test (a Delta MERGE) shows nothing Delta needs goes missing.
    """
    folder = jars_dir or pyspark_jars_dir()
    names: set[str] = set()
    for jar in folder.glob("*.jar"):
        stem = jar.name[: -len(".jar")]
        for match in _VERSION_START.finditer(stem):
            names.add(stem[: match.start()])
    return names


@dataclass(frozen=True)
class Resolution:
    jars: list[str]
    """Absolute paths of the jars to put on the classpath (``spark.jars``)."""
    fetched: bool
    """True when this call resolved (first run); False when the manifest was used."""
    seconds: float


def manifest_key(packages: Sequence[str], excludes: Sequence[str], repo: str) -> str:
    text = json.dumps({"format": MANIFEST_FORMAT, "packages": sorted(packages), "excludes": sorted(excludes), "repo": repo})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ivy_settings(cache: Path, repo: str) -> str:
    # One resolver, nothing else: Ivy's default chain would also read ~/.m2 and ~/.ivy2/local.
    return f"""<ivysettings>
  <settings defaultResolver="materializer-repo"/>
  <caches defaultCacheDir={quoteattr(str(cache / "cache"))} useOrigin="false"/>
  <resolvers>
    <ibiblio name="materializer-repo" m2compatible="true" usepoms="true" root={quoteattr(repo + "/")}/>
  </resolvers>
</ivysettings>
"""


def _ivy_module(packages: Sequence[str], excludes: Sequence[str], transitive: bool = True, spark_modules: bool = False) -> str:
    lines = ['<ivy-module version="2.0">', '  <info organisation="materializer" module="materializer-session-jars"/>']
    lines.append('  <configurations><conf name="default"/></configurations>')
    lines.append("  <dependencies>")
    flag = "" if transitive else ' transitive="false"'
    for package in packages:
        org, name, rev = package.split(":")
        lines.append(
            f"    <dependency org={quoteattr(org)} name={quoteattr(name)} rev={quoteattr(rev)} conf=\"default->default(runtime)\"{flag}/>"
        )
    if transitive and not spark_modules:
        # Spark's own modules are on the classpath already (spark-submit excludes them the same
        # way). Ivy applies this to direct dependencies too, so packages that are Spark modules
        # themselves (the Kafka connector) are resolved with ``spark_modules``: only the modules
        # pyspark ships (and the given excludes) are left out then.
        lines.append('    <exclude org="org.apache.spark" module="*"/>')
    for module in sorted(excludes):
        lines.append(f'    <exclude org="*" module={quoteattr(module)}/>')
    lines.append("  </dependencies>")
    lines.append("</ivy-module>")
    return "\n".join(lines) + "\n"


def read_manifest(path: Path) -> list[str] | None:
    """The jar paths a manifest lists, or None if it is missing, unreadable, or a jar is gone."""
    try:
        data = json.loads(path.read_text())
        jars = [str(j) for j in data["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return jars


def resolve(
    packages: Sequence[str],
    cache: Path,
    *,
    java: str = "java",
    repo: str | None = None,
    verbose: bool = False,
    report: Callable[[str], None] | None = None,
    excludes: Sequence[str] | None = None,
    transitive: bool = True,
    spark_modules: bool = False,
) -> Resolution:
    """The jars of ``packages`` and their dependencies, minus what pyspark ships.

    ``report`` receives one line when a resolution starts and progress while it runs (the CLI
    prints them; nothing is printed when the manifest is used). ``verbose`` also copies Ivy's own
    output to stderr.
    """
    started = time.monotonic()
    repo = repo or maven_repo()
    excluded = sorted(shipped_modules() if excludes is None else excludes)
    markers = ([] if transitive else ["(intransitive)"]) + (["(spark modules)"] if spark_modules else [])
    key = manifest_key(list(packages) + markers, excluded, repo)
    manifest = cache / f"manifest-{key}.json"
    jars = read_manifest(manifest)
    if jars is not None:
        return Resolution(jars, False, time.monotonic() - started)

    cache.mkdir(parents=True, exist_ok=True)
    # Two first runs at once (tests, a cron and a shell) must not both write Ivy's cache: the
    # second waits for the first, then finds its manifest.
    with open(cache / ".resolve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        jars = read_manifest(manifest)
        if jars is not None:
            return Resolution(jars, False, time.monotonic() - started)
        return _resolve_locked(
            packages, cache, manifest, key, excluded, started,
            java=java, repo=repo, verbose=verbose, report=report, transitive=transitive, spark_modules=spark_modules,
        )


def _resolve_locked(
    packages: Sequence[str],
    cache: Path,
    manifest: Path,
    key: str,
    excluded: Sequence[str],
    started: float,
    *,
    java: str,
    repo: str,
    verbose: bool,
    report: Callable[[str], None] | None,
    transitive: bool = True,
    spark_modules: bool = False,
) -> Resolution:
    work = cache / f"resolve-{key}"
    work.mkdir(exist_ok=True)
    (work / "ivysettings.xml").write_text(_ivy_settings(cache, repo))
    (work / "ivy.xml").write_text(_ivy_module(packages, excluded, transitive, spark_modules))
    classpath = work / "classpath.txt"
    classpath.unlink(missing_ok=True)
    log_path = cache / "resolve.log"
    ivy_jar = next(iter(sorted(pyspark_jars_dir().glob("ivy-*.jar"))), None)
    if ivy_jar is None:  # pragma: no cover - pyspark ships Ivy for spark.jars.packages
        raise StartupError(f"pyspark ships no Ivy jar in {pyspark_jars_dir()}: reinstall pyspark.")
    command = [
        java,
        "-cp",
        str(ivy_jar),
        "org.apache.ivy.Main",
        "-settings",
        str(work / "ivysettings.xml"),
        "-ivy",
        str(work / "ivy.xml"),
        "-confs",
        "default",
        "-cachepath",
        str(classpath),
    ]
    say = report or (lambda _line: None)
    say(f"fetching jars ({', '.join(packages)}) from {repo}, once; log: {log_path}")
    downloaded, last = 0, 0.0
    with open(log_path, "a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {' '.join(command)}\n")
        log.flush()
        try:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except FileNotFoundError as exc:
            raise StartupError(java_missing_message(java)) from exc
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if verbose:
                os.write(2, line.encode())
            if "[SUCCESSFUL ]" in line and ".jar" in line:
                downloaded += 1
                now = time.monotonic()
                if now - last > 1.0:
                    last = now
                    say(f"  {downloaded} jars downloaded ({now - started:.0f} s)")
        try:
            rc = process.wait(timeout=RESOLVE_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            rc = -1
    if rc != 0 or not classpath.is_file():
        raise StartupError(unreachable_message(packages, repo, log_path, _last_problem(log_path)))
    jars = [p for p in classpath.read_text().strip().split(os.pathsep) if p]
    missing = [j for j in jars if not Path(j).is_file()]
    if not jars or missing:
        raise StartupError(unreachable_message(packages, repo, log_path, f"missing after resolution: {missing[:3]}"))
    tmp = manifest.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": MANIFEST_FORMAT, "packages": list(packages), "repo": repo, "jars": jars}, indent=1))
    os.replace(tmp, manifest)
    shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    size = sum(Path(j).stat().st_size for j in jars)
    say(f"  fetched {len(jars)} jars ({size / 1e6:.1f} MB) in {seconds:.0f} s; later runs start from the cache")
    return Resolution(jars, True, seconds)


def _last_problem(log_path: Path) -> str:
    """The lines of Ivy's report that say what failed (unresolved dependencies, server errors)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    start = max((i for i, line in enumerate(lines) if line.startswith("=== ")), default=0)
    tail = [line.strip() for line in lines[start:]]
    # The server's answer says most (connection refused, 401, unknown host); then what was missing.
    for marker in ("Server access error", "SERVER ERROR", "module not found", "download failed", "Exception"):
        found = [line for line in tail if marker in line]
        if found:
            return found[0]
    return ""


def java_missing_message(java: str) -> str:
    return (
        f"Java was not found (looked for {java!r}): Spark runs on a Java virtual machine. Install a Java 17 or "
        "21 runtime (e.g. `apt-get install openjdk-17-jre-headless`, or from adoptium.net) and put its `java` "
        "on PATH or set JAVA_HOME to its folder; then run again. Nothing was started."
    )


def unreachable_message(packages: Sequence[str], repo: str, log_path: Path, detail: str) -> str:
    return (
        f"the jars Spark needs for Delta ({', '.join(packages)}) could not be fetched from {repo}"
        f"{': ' + detail if detail else ''}. This happens on the first run on a machine (later runs use the cache) "
        "when there is no network or a proxy or firewall blocks it. Connect to the network (a proxy: set "
        "JAVA_TOOL_OPTIONS='-Dhttps.proxyHost=… -Dhttps.proxyPort=…'), or point MATERIALIZER_MAVEN_REPO at a Maven "
        f"mirror you can reach, then run again; Ivy's full report is in {log_path}. Nothing was started."
    )
