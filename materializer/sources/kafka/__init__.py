"""Kafka topics: offsets planned (``plan``, ``offsets``), read by Spark (``transport``), checked as
documents or Debezium events (``reader``), routed (``routes``), the source (``source``) and CDC v2
statements from a topic (``cdcv2``). The package imports the documents and CDC v2 packages, never the reverse."""
