"""The arrow validator's function in plain Python (no JVM): a batch judged whole gives exactly the
batch that judging each document alone gives (issue #25)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from materializer.sources.document_check import OK, _compile, check_batches, python_typed
from tests.test_documents_arrow import FLAT_FIELDS, documents

SCHEMA = json.dumps({
    "type": "struct",
    "fields": [
        {"name": name, "type": kind, "nullable": True, "metadata": {}}
        for name, kind in [
            ("id", "long"), ("i", "integer"), ("s", "short"), ("t", "byte"), ("d", "double"), ("b", "boolean"), ("note", "string"),
        ]
    ],
})
"""tests/test_documents_arrow.py's FLAT_SCHEMA, as Spark writes it in JSON."""
TYPED = [name for name, _kind in python_typed(json.loads(SCHEMA), ())]


def _rows(lines: list[str], whole: bool, keep_text: bool) -> list[dict[str, Any]]:
    run = check_batches(SCHEMA, ["id"], [], typed=TYPED, keep_text=keep_text, whole_batches=whole)
    batch = pa.RecordBatch.from_arrays([pa.array(lines, pa.string())], names=["value"])
    return [row for out in run(iter([batch])) for row in out.to_pylist()]


def _checked(lines: list[str], whole: bool, keep_text: bool) -> str:
    return repr(_rows(lines, whole, keep_text))  # repr: a -0.0 that became 0.0 would differ


def test_a_batch_of_fast_documents_is_judged_whole_and_as_each_alone() -> None:
    lines = [
        '{"id": 1, "i": 2, "s": -3, "t": 4, "d": 1.5, "b": true, "note": "a:b:c"}',
        '{"id": 2}',
        '{"id": 3, "note": null, "d": 1e-300, "_meta": {"op": "d"}}',
        '{"_meta": {"op": "u:x"}, "id": 4, "d": 0.0}',
        '{"id": 5, "_meta": {}}',
    ]
    whole = _compile(SCHEMA, ("id",), ())[3]
    assert whole is not None and whole(lines) is not None  # the whole-batch path is taken
    for keep_text in (True, False):
        judged = _checked(lines, True, keep_text)
        assert judged == _checked(lines, False, keep_text)
        assert "'d'" in judged and judged.count(f"'{OK}': True") == len(lines)


def test_a_batch_with_a_negative_zero_or_a_dropped_key_is_judged_document_by_document() -> None:
    for odd in ['{"id": 6, "d": -1e-400}', '{"id": 7, "note": "x", "note": "y:z"}', '{"id": 8, "i": 1, "i": 2}']:
        lines = ['{"id": 1, "note": "a"}', odd]
        judged = _checked(lines, True, False)
        assert judged == _checked(lines, False, False)
        assert judged.count(f"'{OK}': True") == 1, (odd, judged)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(FLAT_FIELDS), min_size=1, max_size=30), keep_text=st.booleans())
def test_generated_batches_are_judged_the_same_whole_and_alone(corpus: list[str], keep_text: bool) -> None:
    alone = _checked(corpus, False, keep_text)
    assert _checked(corpus, True, keep_text) == alone
    # The fast ones alone make a batch the whole-batch path answers for.
    fast = [line for line, row in zip(corpus, _rows(corpus, False, keep_text)) if row[OK]]
    event(f"fast documents: {'none' if not fast else 'some'}")
    if fast:
        assert _checked(fast, True, keep_text) == _checked(fast, False, keep_text)


def test_the_function_still_pickles_after_it_ran_in_this_process() -> None:
    """mapInArrow pickles the function by value: after a run in the driver filled the compiled
    cache, the function must not carry that cache (msgspec's decoders do not pickle)."""
    from pyspark import cloudpickle

    _rows(['{"id": 1}'], True, False)
    run = check_batches(SCHEMA, ["id"], [], typed=TYPED, keep_text=False)
    assert cloudpickle.loads(cloudpickle.dumps(run)) is not None


def test_the_colons_of_a_batch_are_counted_over_the_bytes_its_texts_span() -> None:
    """The whole-batch path compares one ":" count over the batch's bytes with what the decoded
    documents account for: it must count only this batch's texts, wherever the array starts in
    its buffers (a slice of a larger array, as Arrow hands batches over) and for either offset
    width."""
    from materializer.sources.document_check import _colons

    texts = ['{"id":1}', '{"id":2,"note":"a:b"}', "", '{"id":3,"d":1.5}', '{"x::":":"}']
    for kind in (pa.string(), pa.large_string()):
        whole = pa.array(texts, kind)
        for start in range(len(texts)):
            for stop in range(start, len(texts) + 1):
                part = whole.slice(start, stop - start)
                assert _colons(part, pa) == sum(t.count(":") for t in texts[start:stop]), (kind, start, stop)


def _schema(fields: list[tuple[str, Any]]) -> dict[str, Any]:
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]}


NEVER_FAST = [
    ("timestamp", '"2026-11-29T08:00:00Z"'), ("timestamp_ntz", '"2026-11-29T08:00:00"'), ("date", '"2026-11-29"'),
    ("decimal(10,2)", "12.5"), ("float", "1.5"), ({"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}, '{"a": 1}'),
    ("binary", '"AQI="'), ("variant", "1"),
]


def test_the_validator_is_chosen_for_the_schemas_whose_documents_it_can_find_fast() -> None:
    """fast_schema (the default validator's choice) agrees with the validator itself: a document
    holding a value of a type it rejects is never fast (the arrow route would be a pass for
    nothing), and one of a schema it accepts, at any depth, is."""
    from materializer.sources.document_route import fast_schema

    nested = {"type": "struct", "fields": [{"name": "n", "type": "integer", "nullable": True, "metadata": {}}]}
    array = {"type": "array", "elementType": nested, "containsNull": True}
    fits = _schema([("id", "long"), ("note", "string"), ("d", "double"), ("b", "boolean"), ("at", nested), ("xs", array)])
    assert fast_schema(fits)
    fast, _suspect, _columns, _whole = _compile(json.dumps(fits), ("id",), ())
    text = b'{"id": 1, "note": "x", "d": 1.5, "b": true, "at": {"n": 2}, "xs": [{"n": 3}]}'
    assert fast(text, text.count(b":")) is not None
    for kind, value in NEVER_FAST:
        for where in ("top", "nested", "array"):
            inner = {"type": "struct", "fields": [{"name": "v", "type": kind, "nullable": True, "metadata": {}}]}
            field = {"top": kind, "nested": inner, "array": {"type": "array", "elementType": inner, "containsNull": True}}[where]
            schema = _schema([("id", "long"), ("v", field)])
            assert not fast_schema(schema), (kind, where)
            doc = {"top": value, "nested": '{"v": %s}' % value, "array": '[{"v": %s}]' % value}[where]
            text = ('{"id": 1, "v": %s}' % doc).encode()
            fast, _suspect, _columns, _whole = _compile(json.dumps(schema), ("id",), ())
            assert fast(text, text.count(b":")) is None, (kind, where)
            # Null or absent, such a field does not keep a document from being fast.
            assert fast(b'{"id": 1, "v": null}', 2) is not None and fast(b'{"id": 1}', 1) is not None
