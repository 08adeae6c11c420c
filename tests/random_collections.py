"""Random document collections for tests (named so as not to shadow the standard library's ``collections``).

Tables are checked against materializer's own oracle (``tests.helpers.assert_tables_equal_oracle``);
``standard_state`` only gives the state after a prefix of the documents, for runs stopped half-way."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any


def generate(folder: Path, *, seed: int, documents: int, keys: int, files: int, delete_ratio: float = 0.15) -> list[dict[str, Any]]:
    """Write ``documents`` docs over ``files`` JSONL files (names sort in order); return them in order."""
    rng = random.Random(seed)
    docs: list[dict[str, Any]] = []
    for n in range(documents):
        key = rng.randrange(keys)
        if rng.random() < delete_ratio:
            docs.append({"_meta": {"op": "d"}, "id": key})
            continue
        doc: dict[str, Any] = {"id": key, "name": f"item-{key}-{rng.randrange(1000)}", "qty": rng.randrange(-50, 500)}
        if rng.random() < 0.7:
            doc["price"] = round(rng.uniform(0, 100), 2) + 0.001  # always a float in JSON
        if rng.random() < 0.2:
            doc["note"] = rng.choice(["gift", "rush", "fragile"])
        doc["seq"] = n
        docs.append(doc)
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-documents // files)
    for index in range(files):
        chunk = docs[index * per_file : (index + 1) * per_file]
        (folder / f"part-{index:04d}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in chunk))
    return docs


def standard_state(docs: list[dict[str, Any]], key: str = "id") -> dict[tuple[Any, ...], dict[str, Any]]:
    """lastWriteWins with deletes: the row per key after ``docs`` (a prefix of a collection)."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for doc in docs:
        k = (doc[key],)
        if doc.get("_meta", {}).get("op") == "d":
            state.pop(k, None)
        else:
            state[k] = {f: v for f, v in doc.items() if f != "_meta"}
    return state
