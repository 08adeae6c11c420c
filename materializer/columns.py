"""The two columns every source adds to its documents and the core relies on.

A source's batch (:class:`materializer.sources.SourceBatch`) holds the documents' fields plus
``_op`` ('u' upsert, 'd' delete) and ``_seq`` (order within the batch; later wins). The sources
write them; reductions, change semantics, the driver and the MERGE read them. They live here, below
all of those, so that none of the core imports the sources to learn two names.
"""

from __future__ import annotations

OP = "_op"
"""'u' (upsert) or 'd' (delete)."""
SEQ = "_seq"
"""Order within the batch, any orderable Spark type, unique per document; later wins."""
RESERVED = (OP, SEQ)
"""Names a document's own fields cannot take."""
DELTA_INVALID = frozenset(" ,;{}()\n\t=`")
"""Characters Delta refuses in column names (without column mapping), and the backtick: a field
named with one is refused by every source before its epoch commits, never spliced into SQL."""
