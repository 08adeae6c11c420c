"""The operator's and the tester's tools, apart from the core: ``status``, ``recover`` (and
``skip``), the ``oracle`` that tables are checked against, the kill ``drill`` and the ``bench``.

They import the core (runtime, driver, recovery log, sources); the core never imports them.
"""
