"""``python -m materializer_cli``: the ``materializer`` command without its console script."""

from __future__ import annotations

from .main import main

main()
