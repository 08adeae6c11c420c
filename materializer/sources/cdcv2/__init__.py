"""Materialize's CDC v2: statements judged (``statements``), progress kept (``progress``), rows
consolidated (``reader``), and the files source (``source``); the kafka ``cdcv2`` payload reuses the reader."""
