"""Optional libraries: the tools' (bench, drill) come with an extra, not with the core wheel.

The wheel a Databricks job installs carries only what a pipeline run needs; ``materializer bench``
and ``materializer drill`` also need psutil, rich and matplotlib (``pip install
'delta-materializer[tools]'``). They are imported when a tool runs, and a missing one says so.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from materializer.errors import ConfigError

TOOLS_EXTRA = "tools"


def require(module: str, *, extra: str = TOOLS_EXTRA, purpose: str = "this command") -> ModuleType:
    """Import ``module``, or say which extra to install for ``purpose``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise ConfigError(
            f"{purpose} needs the {package!r} package, which the core install leaves out: "
            f"install it with `pip install 'delta-materializer[{extra}]'`"
        ) from None
