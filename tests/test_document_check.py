"""The arrow validator's function in plain Python (no JVM): a batch judged whole gives exactly the
batch that judging each document alone gives (issue #25)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from msgspec import UNSET
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from materializer.sources.documents.check import OK, _compile, check_batches, python_typed
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


def _rows(lines: list[str], whole: bool, keep_text: bool, schema: str = SCHEMA) -> list[dict[str, Any]]:
    typed = [name for name, _kind in python_typed(json.loads(schema), ())]
    run = check_batches(schema, ["id"], [], typed=typed, keep_text=keep_text, whole_batches=whole)
    batch = pa.RecordBatch.from_arrays([pa.array(lines, pa.string())], names=["value"])
    return [row for out in run(iter([batch])) for row in out.to_pylist()]


def _checked(lines: list[str], whole: bool, keep_text: bool, schema: str = SCHEMA) -> str:
    return repr(_rows(lines, whole, keep_text, schema))  # repr: a -0.0 that became 0.0 would differ


def _whole_as_alone(corpus: list[str], keep_text: bool, schema: str = SCHEMA) -> None:
    """A batch judged whole is the batch judged document by document; so is the batch of its fast
    documents, which the whole-batch path answers for itself."""
    assert _checked(corpus, True, keep_text, schema) == _checked(corpus, False, keep_text, schema)
    fast = [line for line, row in zip(corpus, _rows(corpus, False, keep_text, schema)) if row[OK]]
    event(f"fast documents: {'none' if not fast else 'some'}")
    if fast:
        # Fast documents are judged whole, unless a text holds a line break (a topic's record may;
        # a file's line cannot): it is then two lines of the joined batch, and judged alone.
        if not any("\n" in line for line in fast):
            assert _compile(schema, ("id",), ())[3](pa.array(fast, pa.string())) is not None
        assert _checked(fast, True, keep_text, schema) == _checked(fast, False, keep_text, schema)


def test_a_batch_of_fast_documents_is_judged_whole_and_as_each_alone() -> None:
    lines = [
        '{"id": 1, "i": 2, "s": -3, "t": 4, "d": 1.5, "b": true, "note": "a:b:c"}',
        '{"id": 2}',
        '{"id": 3, "note": null, "d": 1e-300, "_meta": {"op": "d"}}',
        '{"_meta": {"op": "u:x"}, "id": 4, "d": 0.0}',
        '{"id": 5, "_meta": {}}',
    ]
    whole = _compile(SCHEMA, ("id",), ())[3]
    assert whole is not None and whole(pa.array(lines, pa.string())) is not None  # the whole-batch path is taken
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


def _one_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def test_texts_that_could_be_read_across_each_other_are_judged_document_by_document() -> None:
    """The whole-batch path decodes a batch's texts joined by line breaks in one call: a text of
    two objects, a text broken over lines, an empty or blank one or a NULL must not let one
    text's values pass for another's. Each such batch is judged as each text alone judges it."""
    whole = _compile(SCHEMA, ("id",), ())[3]
    good = '{"id": 9, "note": "x"}'
    for odd in [
        ['{"id": 1} {"id": 2}', good],
        ['{"id": 1}\n{"id": 2}', good],
        ['{"id": 1},{"id": 2}', good],
        ['{"id":\n1}', good],
        ['{"id": 1}\n', '{"id": 2}'],
        ['{"id": 1} {"id": 2}', ""],
        ['{"id": 1} {"id": 2}', "  "],
        ['{"id": 1}\n{"id": 2}', "\t"],
        ['{"id": 1, "note": "', '"}'],
        ['{"id": 1} x', good],
    ]:
        assert whole(pa.array(odd, pa.string())) is None, odd
        judged = _checked(odd, True, False)
        assert judged == _checked(odd, False, False), odd
        assert judged.count(f"'{OK}': True") == sum(map(_one_object, odd)), (odd, judged)
    assert whole(pa.array([good, None], pa.string())) is None
    assert whole(pa.array([" " + good + "\t\r ", good], pa.string())) is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(FLAT_FIELDS), min_size=1, max_size=30), keep_text=st.booleans())
def test_generated_batches_are_judged_the_same_whole_and_alone(corpus: list[str], keep_text: bool) -> None:
    _whole_as_alone(corpus, keep_text)


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
    from materializer.sources.documents.check import _colons

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
    ("timestamp_ntz", '"2026-11-29T08:00:00"'), ("float", "1.5"),
    ({"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}, '{"a": 1}'), ("binary", '"AQI="'), ("variant", "1"),
]
"""Types whose values make no document fast, at any depth."""
ANY_DEPTH = [("timestamp", '"2026-11-29T08:00:00Z"'), ("date", '"2026-11-29"'), ("decimal(10,2)", "12.5")]
"""Types the validator types at the top level and checks at any depth (from_json types them there)."""


def test_the_validator_is_chosen_for_the_schemas_whose_documents_it_can_find_fast() -> None:
    """fast_schema (the default validator's choice) agrees with the validator itself: a document
    holding a value of a type it rejects is never fast (the arrow route would be a pass for
    nothing), and one of a schema it accepts, at any depth, is."""
    from materializer.sources.documents.route import fast_schema

    nested = {"type": "struct", "fields": [{"name": "n", "type": "integer", "nullable": True, "metadata": {}}]}
    array = {"type": "array", "elementType": nested, "containsNull": True}
    fits = _schema([("id", "long"), ("note", "string"), ("d", "double"), ("b", "boolean"), ("at", nested), ("xs", array), ("t", "timestamp"), ("day", "date"), ("p", "decimal(10,2)")])
    assert fast_schema(fits)
    fast, _suspect, _columns, _whole = _compile(json.dumps(fits), ("id",), ())
    text = b'{"id": 1, "note": "x", "d": 1.5, "b": true, "at": {"n": 2}, "xs": [{"n": 3}], "t": "2026-11-29T08:00:00Z", "day": "2026-11-29", "p": 1.5}'
    assert fast(text, text.count(b":")) is not None
    for kind, value in NEVER_FAST + ANY_DEPTH:
        for where in ("top", "nested", "array"):
            inner = {"type": "struct", "fields": [{"name": "v", "type": kind, "nullable": True, "metadata": {}}]}
            field = {"top": kind, "nested": inner, "array": {"type": "array", "elementType": inner, "containsNull": True}}[where]
            schema = _schema([("id", "long"), ("v", field)])
            expected = (kind, value) in ANY_DEPTH
            assert fast_schema(schema) == expected, (kind, where)
            doc = {"top": value, "nested": '{"v": %s}' % value, "array": '[{"v": %s}]' % value}[where]
            text = ('{"id": 1, "v": %s}' % doc).encode()
            fast, _suspect, _columns, whole = _compile(json.dumps(schema), ("id",), ())
            assert (fast(text, text.count(b":")) is not None) == expected, (kind, where)
            assert whole is not None and (whole(pa.array([text.decode()], pa.string())) is not None) == expected, (kind, where)
            # Null or absent, such a field does not keep a document from being fast.
            assert fast(b'{"id": 1, "v": null}', 2) is not None and fast(b'{"id": 1}', 1) is not None


NEVER_FAST_DEEP = [
    ("timestamp", '"2026-11-31T08:00:00Z"'), ("timestamp", '"2026-11-29 08:00:00Z"'), ("timestamp", '"2026-11-29T08:00:00"'),
    ("timestamp", '"0001-01-01T00:00:00+01:00"'), ("timestamp", "1700000000"), ("date", '"2024-02-30"'), ("date", '"2024-2-3"'),
    ("decimal(10,2)", "1.005"), ("decimal(10,2)", "123456789.5"), ("decimal(10,2)", "1e1"), ("decimal(10,2)", '"12.5"'),
    ("decimal(10,2)", '{"a:b": 1}'),
]
"""Values of the types in ANY_DEPTH that are not in the one form the validator passes."""


@pytest.mark.parametrize(("kind", "value"), NEVER_FAST_DEEP)
def test_a_nested_timestamp_date_or_decimal_in_another_form_is_never_fast(kind: str, value: str) -> None:
    """Inside a struct, an array, or an array of structs, a value not in the form the top level
    types (RFC 3339 with its zone, an ISO date, a plain number that fits) is not fast, whole
    batch or alone, whatever documents share its batch."""
    inner = _schema([("v", kind)])
    schema = json.dumps(_schema([("id", "long"), ("s", inner), ("a", _array(kind)), ("xs", _array(inner))]))
    good = '{"id": 0, "s": {"v": %s}}' % dict(ANY_DEPTH)[kind]
    for doc in ('{"id": 1, "s": {"v": %s}}', '{"id": 1, "a": [null, %s]}', '{"id": 1, "xs": [{"v": null}, {"v": %s}]}'):
        lines = [good, doc % value]
        for whole in (True, False):
            rows = _rows(lines, whole, True, schema)
            assert [row[OK] for row in rows] == [True, False], (doc % value, whole)


STAMPED = json.dumps(_schema([("id", "long"), ("at", "timestamp"), ("day", "date"), ("price", "decimal(10,2)"), ("note", "string")]))


@pytest.mark.parametrize(
    ("value", "typed"),
    [
        ('"at": "2026-11-29T08:00:00Z"', 1795939200000000),
        ('"at": "2026-11-29T08:00:00.5+01:00"', 1795935600500000),
        ('"at": "1969-12-31T23:59:59.999999-00:30"', 1799999999),
        ('"at": "0001-01-01T00:00:00Z"', -62135596800000000),
        ('"at": "0001-01-01T00:00:00+01:00"', None),  # before Spark's range
        ('"at": "9999-12-31T23:59:59.999999-01:00"', None),  # after it
        ('"at": "2026-11-29T08:00:00+19:00"', None),  # beyond Spark's offsets
        ('"at": "2026-11-29 08:00:00Z"', None),  # a space for the T: the VARIANT route decides
        ('"at": "2026-11-29T08:00:00"', None),  # no zone: the session's decides
        ('"at": "2026-11-29T08:00:00.1234567Z"', None),  # nanoseconds
        ('"at": "2026-11-31T08:00:00Z"', None),
        ('"at": "2026-11-29T24:00:00Z"', None),
        ('"at": 1700000000', None),
        ('"day": "2026-11-29"', 20786),
        ('"day": "1969-12-31"', -1),
        ('"day": "2024-02-30"', None),
        ('"day": "2024-2-3"', None),
        ('"price": 12.5', "12.5"),
        ('"price": -0.00', "-0.00"),
        ('"price": 99999999.99', "99999999.99"),
        ('"price": 0.01', "0.01"),
        ('"price": 7', "7"),
        ('"price": 123456789.5', None),  # nine digits before the point: beyond DECIMAL(10,2)
        ('"price": 1.005', None),  # would round: the VARIANT route decides
        ('"price": 1e1', None),
        ('"price": "12.5"', None),
        ('"price": [1]', None),
        ('"at": null, "day": null, "price": null', "nulls"),
    ],
)
def test_timestamps_dates_and_decimals_are_typed_exactly_or_left_to_the_variant_route(value: str, typed: Any) -> None:
    fast, _suspect, _columns, _whole = _compile(STAMPED, ("id",), ())
    text = ("{" + '"id": 1, ' + value + "}").encode()
    values = fast(text, text.count(b":"))
    if typed is None:
        assert values is None
        return
    assert values is not None
    got = [v for v in values[1:4] if v is not UNSET]
    if typed == "nulls":
        assert got == [None, None, None]
    else:
        assert [str(v) for v in got] == [str(typed)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(["id", "note", "at", "day", "price"]), min_size=1, max_size=30), keep_text=st.booleans())
def test_generated_batches_with_timestamps_dates_and_decimals_are_judged_the_same_whole_and_alone(corpus: list[str], keep_text: bool) -> None:
    _whole_as_alone(corpus, keep_text, STAMPED)


def _array(element: Any) -> dict[str, Any]:
    return {"type": "array", "elementType": element, "containsNull": True}


NESTED = json.dumps(_schema([
    ("id", "long"), ("i", "integer"), ("s", "short"), ("t", "byte"), ("d", "double"), ("b", "boolean"), ("note", "string"),
    ("tags", _array("long")), ("address", _schema([("city", "string"), ("n", "integer"), ("deep", _schema([("x", "double"), ("day", "date")]))])),
    ("items", _array(_schema([("k", "string"), ("v", "long"), ("at", "timestamp"), ("p", "decimal(10,2)")]))), ("at", "timestamp"), ("day", "date"), ("price", "decimal(10,2)"),
    ("f", "float"),
]))
"""tests/test_documents_arrow.py's DIFF_SCHEMA, as Spark writes it in JSON: nested values too."""


def test_a_batch_of_nested_documents_is_judged_whole_unless_a_key_was_dropped_at_any_depth() -> None:
    """With nested values the whole-batch path counts the ":" of the documents encoded again: a
    key twice inside a struct, in an array's struct, or an unknown ``_meta`` field is a ":" the
    encoded documents lack, and the batch is judged document by document."""
    good = [
        '{"id": 1, "address": {"city": "a:b", "deep": {"x": 1.5}}, "items": [{"k": "x:y", "v": 2}, null], "tags": [1, 2]}',
        '{"id": 2, "items": [], "address": {}, "at": "2026-11-29T08:00:00Z", "_meta": {"op": "d"}}',
        '{"id": 3, "_meta": {}}',
    ]
    whole = _compile(NESTED, ("id",), ())[3]
    assert whole is not None
    found = whole(pa.array(good, pa.string()))
    assert found is not None and found[1] == sum(line.count(":") for line in good)  # every ":" accounted for
    for keep_text in (True, False):
        judged = _checked(good, True, keep_text, NESTED)
        assert judged == _checked(good, False, keep_text, NESTED) and judged.count(f"'{OK}': True") == len(good)
    for odd in [
        '{"id": 4, "address": {"city": "x", "city": "y"}}',
        '{"id": 5, "items": [{"k": "a", "v": 1, "v": 2}]}',
        '{"id": 6, "address": {"deep": {"x": 1.0, "x": 2.0}}}',
        '{"id": 7, "_meta": {"op": "d", "x": 1}}',
    ]:
        lines = [*good, odd]
        judged = _checked(lines, True, False, NESTED)
        assert judged == _checked(lines, False, False, NESTED)
        assert judged.count(f"'{OK}': True") == len(good), (odd, judged)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(corpus=st.lists(documents(), min_size=1, max_size=30), keep_text=st.booleans())
def test_generated_batches_with_nested_values_are_judged_the_same_whole_and_alone(corpus: list[str], keep_text: bool) -> None:
    _whole_as_alone(corpus, keep_text, NESTED)


def test_the_set_aside_pass_keeps_exactly_the_documents_not_fast_as_they_came() -> None:
    """not_fast_only (document_route.set_aside's function) yields, per batch, the rows whose
    document the validator does not find fast, every column as it came (the judged text first,
    left out when ``skip`` says so), and nothing for a batch of fast ones or an empty one."""
    from materializer.sources.documents.route import not_fast_only

    good, bad = ['{"id": 1, "note": "a"}', '{"id": 2}'], ['{"id": 3}', '{"id": "three"}', '{"id": 4, "id": 5}']

    def batch(texts: list[str], judged: bool) -> Any:
        columns = [pa.array(texts, pa.string()), pa.array(range(len(texts)), pa.int64())]
        names = ["value", "row"]
        if judged:  # (Kafka's: the judged text first, the record's text after it)
            columns, names = [pa.array([t.upper() if t == '{"id": 3}' else t for t in texts], pa.string()), *columns], ["__judged", *names]
        return pa.RecordBatch.from_arrays(columns, names=names)

    run = not_fast_only(SCHEMA, ["id"], [])
    out = [b.to_pylist() for b in run(iter([batch(good, False), batch(good + bad, False), batch([], False)]))]
    assert out == [[{"value": '{"id": "three"}', "row": 3}, {"value": '{"id": 4, "id": 5}', "row": 4}]]
    # Judged by the first column ('{"ID": 3}' has no key, so it is not fast), kept as the rest has it.
    out = [b.to_pylist() for b in not_fast_only(SCHEMA, ["id"], [], 1)(iter([batch(good + bad, True)]))]
    assert out == [[{"value": '{"id": 3}', "row": 2}, {"value": '{"id": "three"}', "row": 3}, {"value": '{"id": 4, "id": 5}', "row": 4}]]
