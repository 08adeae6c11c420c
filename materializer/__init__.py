"""materializer: keep Delta Lake tables equal to change streams, exactly once, on Spark.

The distribution is published as ``delta-materializer`` (the name ``materializer`` on the public
index belongs to an unrelated project); the import package and the command are ``materializer``.
"""

from __future__ import annotations

DISTRIBUTION = "delta-materializer"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    # A source checkout run with PYTHONPATH (not installed): the version pyproject.toml declares.
    import tomllib
    from pathlib import Path

    try:
        project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
        if project.get("name") == DISTRIBUTION:
            return str(project["version"])
    except (OSError, KeyError, ValueError):
        pass
    return "0+unknown"


__version__ = _version()
