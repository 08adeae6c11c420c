"""JSON documents: read, checked, typed and refused (``source``: the files source; ``reader``: the
``DocumentReader`` the files source and the kafka source's document payloads share)."""
