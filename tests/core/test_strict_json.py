"""The one strict JSON decoder (homeserver/core/strict_json.py)."""

from __future__ import annotations

import json
import sys
import tracemalloc

import pytest

from homeserver.core import strict_json


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\xed\xa0\x80"}',  # a raw UTF-8-encoded lone surrogate
        b'{"a": "\\ud800"}',  # the same, escaped
        b'{"a": "\\udc00x"}',
        json.dumps({"a": "b"}).encode("utf-16"),  # with a BOM
        json.dumps({"a": "b"}).encode("utf-16-le"),
        json.dumps({"a": "b"}).encode("utf-32"),
        json.dumps({"a": "b"}).encode("utf-32-be"),
        b'\xef\xbb\xbf{"a": "b"}',  # a UTF-8 BOM: JSON text has none
        b'{"a": NaN}',
        b'{"a": -Infinity}',
        b'{"a": 1e999}',
        b"{not json",
    ],
)
def test_not_json(raw):
    with pytest.raises(strict_json.NotJson):
        strict_json.loads(raw)


def test_pairs_and_plain_utf8_are_fine():
    assert strict_json.loads(b'{"a": "\\ud83d\\ude00 \xc3\xa9"}') == {"a": "\U0001f600 é"}


def nested(depth: int) -> bytes:
    return b'{"a": ' * (depth - 1) + b"{}" + b"}" * (depth - 1)


def test_depth_counts_objects_and_arrays():
    assert strict_json.nested_deeper_than({}, 0)
    assert not strict_json.nested_deeper_than({}, 1)
    assert not strict_json.nested_deeper_than({"a": [1, {"b": 2}]}, 3)
    assert strict_json.nested_deeper_than({"a": [1, {"b": {}}]}, 3)
    assert not strict_json.nested_deeper_than("scalar", 0)


def test_a_body_may_nest_to_its_limit_and_no_further():
    assert strict_json.loads(nested(strict_json.MAX_BODY_DEPTH))
    with pytest.raises(strict_json.TooDeep):
        strict_json.loads(nested(strict_json.MAX_BODY_DEPTH + 1))
    # Past the parser's own recursion: still TooDeep, never a RecursionError.
    with pytest.raises(strict_json.TooDeep):
        strict_json.loads(b"[" * 5000 + b"]" * 5000)


def test_whatever_is_accepted_encodes_again_on_a_deep_stack():
    value = strict_json.loads(nested(strict_json.MAX_BODY_DEPTH))

    def deep(n):
        return deep(n - 1) if n else json.dumps(value)

    assert deep(500)


# --- loads_in_pieces: the same rules, a piece at a time --------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=5), children, max_size=6)
    ),
    max_leaves=60,
)


def outcome(call):
    try:
        return ("ok", call())
    except strict_json.TooDeep:
        return ("too deep", None)
    except strict_json.NotJson:
        return ("not json", None)


def in_pieces(raw: bytes, depth: int = strict_json.MAX_BODY_DEPTH, piece: int = 8):
    pauses = []
    decoded = strict_json.loads_in_pieces(
        raw, depth, lambda: pauses.append(1), canonical=True, piece_bytes=piece
    )
    return decoded


@settings(max_examples=300, deadline=None)
@given(_json_values, st.sampled_from([0, 1, 2]), st.integers(1, 64))
def test_in_pieces_decodes_what_loads_decodes_and_encodes_it_canonically(value, indent, piece):
    from canonicaljson import encode_canonical_json

    raw = json.dumps(value, indent=indent or None, ensure_ascii=bool(indent % 2)).encode()
    decoded = strict_json.loads_in_pieces(
        raw, strict_json.MAX_BODY_DEPTH, lambda: None, canonical=True, piece_bytes=piece
    )
    assert decoded.value == strict_json.loads(raw)
    assert decoded.canonical == encode_canonical_json(strict_json.loads(raw))


@settings(max_examples=500, deadline=None)
@given(_json_values, st.data())
def test_in_pieces_refuses_what_loads_refuses(value, data):
    raw = json.dumps(value, separators=(",", ":")).encode()
    # A bit of damage somewhere: a byte dropped, doubled or replaced.
    if raw:
        at = data.draw(st.integers(0, len(raw) - 1))
        damage = data.draw(
            st.sampled_from(
                [
                    b"",
                    b"[",
                    b"]",
                    b"{",
                    b"}",
                    b'"',
                    b",",
                    b":",
                    b"\\",
                    b"x",
                    b"\\ud800",
                    b"NaN",
                    b"1e999",
                    b" ",
                ]
            )
        )
        raw = raw[:at] + damage + raw[at + data.draw(st.integers(0, 1)) :]
    depth = data.draw(st.integers(1, 6))
    piece = data.draw(st.integers(1, 40))
    whole = outcome(lambda: strict_json.loads(raw, depth))
    pieces = outcome(
        lambda: strict_json.loads_in_pieces(raw, depth, lambda: None, piece_bytes=piece).value
    )
    # Refused alike; a document both malformed and too deep may be refused for either.
    assert (pieces[0] == "ok", pieces[1]) == (whole[0] == "ok", whole[1]), raw
    if "ok" not in (pieces[0], whole[0]) and pieces[0] != whole[0]:
        assert strict_json.nested_deeper_than(_brackets_only(raw), depth)


def _brackets_only(raw: bytes):
    """The nesting of raw's brackets, as lists, whatever else it holds; a bracket inside a
    string is text, not nesting (a key "}" once made a too-deep document look shallow)."""
    root: list = []
    stack = [root]
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string = False
        elif byte == ord('"'):
            in_string = True
        elif byte in b"[{":
            stack[-1].append([])
            stack.append(stack[-1][-1])
        elif byte in b"]}" and len(stack) > 1:
            stack.pop()
    return root


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\xed\xa0\x80"}',
        b'{"a": "\\ud800"}',
        b'{"\\ud800": 1}',
        b"[1, 2",
        b"[1, 2]]",
        b'{"a" 1}',
        b'{"a": 1,}',
        b"[1,]",
        b'"unterminated',
        b"[1] [2]",
        b"\xef\xbb\xbf[1]",
    ],
)
def test_in_pieces_refuses_the_same_bad_bodies(raw):
    with pytest.raises(strict_json.NotJson):
        strict_json.loads_in_pieces(raw, 10, lambda: None, piece_bytes=1)


def test_in_pieces_refuses_a_deep_document_before_building_it():
    raw = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(strict_json.TooDeep):
        strict_json.loads_in_pieces(raw, strict_json.MAX_BODY_DEPTH, lambda: None)


def test_a_large_body_is_decoded_with_pauses_between_pieces():
    raw = json.dumps(
        {"pdus": [{"content": {"body": "x" * 500, "n": i}} for i in range(2000)]}
    ).encode()
    pauses = []
    decoded = strict_json.loads_in_pieces(
        raw, strict_json.MAX_BODY_DEPTH, lambda: pauses.append(1), piece_bytes=16 * 1024
    )
    assert decoded.value == json.loads(raw)
    assert len(pauses) >= len(raw) // (16 * 1024) - 1


@pytest.mark.parametrize("member", [b"[]", b'{"b":{}}', b"1.5", b'"ab"', b"true", b'{"x":[1,2]}'])
def test_a_large_document_of_tiny_values_is_refused_early(member):
    raw = b"[" + b",".join([member] * (10 * 1024 * 1024 // (len(member) + 1))) + b"]"
    pauses = []
    with pytest.raises(strict_json.TooManyValues):
        strict_json.loads_in_pieces(raw, 10, lambda: pauses.append(1))
    # Refused after one cheap pass over the text at most (a few hundred pauses of a piece
    # each), never after building the whole.
    assert len(pauses) < 400


def test_large_containers_of_real_sized_members_are_fine():
    event_ids = [f"${i:043d}" for i in range(20_000)]  # a /state_ids answer
    raw = json.dumps({"pdu_ids": event_ids, "auth_chain_ids": event_ids}).encode()
    decoded = strict_json.loads_in_pieces(raw, 10, lambda: None)
    assert decoded.value["pdu_ids"] == event_ids


# --- an object read as it streams (loads_streamed_object) -------------------------------


def streamed(raw: bytes, chunk: int, **caps) -> dict:
    limits = {"max_items": 1000, "item_max_chars": 10_000, "value_max_chars": 10_000} | caps
    return strict_json.loads_streamed_object(
        (raw[at : at + chunk] for at in range(0, len(raw), chunk)),
        arrays=("state", "auth_chain"),
        pause=lambda: None,
        **limits,
    )


STREAMED = {
    "origin": "x",
    "state": [{"a": [1, -2.5e3, {"b": 'c"]}\\'}], "n": None, "t": True, "é": "\u2028\U0001f600"}]
    * 4,
    "auth_chain": [],
    "event": {"k": [[], {}]},
}


@pytest.mark.parametrize("indent", [None, 2])
def test_a_streamed_object_is_what_loads_gives_however_its_bytes_are_cut(indent):
    raw = json.dumps(STREAMED, ensure_ascii=indent is None, indent=indent).encode()
    for chunk in range(1, len(raw) + 1):
        assert streamed(raw, chunk) == strict_json.loads(raw), chunk


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1,}',
        b'{"a": 1 "b": 2}',
        b'{"state": [1,]}',
        b'{"state": [1 2]}',
        b'{"state": [{"a": 1]}]}',
        b'{"a": 12x}',
        b'{"a": tru}',
        b"{1: 2}",
        b'{"a": 1',
        b'{"a": 1}x',
        b'{"a": NaN}',
        b'{"a": 1e999}',
        b'{"a": "\\ud800"}',
        b'{"a": "\xed\xa0\x80"}',
        b'{"a": "\xc3"}',
        b'{"a": "x\x01"}',
        b'{"state": [' + nested(strict_json.MAX_BODY_DEPTH - 1) + b"]}",
    ],
)
def test_a_streamed_object_refuses_what_loads_refuses(raw):
    for chunk in (1, 2, 3, 64):
        with pytest.raises(ValueError):
            streamed(raw, chunk)
        with pytest.raises(ValueError):
            strict_json.loads(raw)


def test_a_streamed_answer_must_be_an_object():
    with pytest.raises(strict_json.NotJson):
        streamed(b"[1]", 64)


def test_a_streamed_object_nests_as_deep_as_loads_allows():
    raw = b'{"state": [' + nested(strict_json.MAX_BODY_DEPTH - 2) + b"]}"
    assert streamed(raw, 7) == strict_json.loads(raw)


def test_a_streamed_object_is_capped_in_items_and_lengths():
    with pytest.raises(strict_json.TooManyValues):
        streamed(json.dumps({"state": [1] * 600, "auth_chain": [1] * 401}).encode(), 64)
    assert len(streamed(json.dumps({"state": [1] * 600, "auth_chain": [1] * 400}).encode(), 64))
    with pytest.raises(strict_json.TooManyValues):
        streamed(json.dumps({"state": ["x" * 999]}).encode(), 64, item_max_chars=1000)
    with pytest.raises(strict_json.TooManyValues):
        streamed(json.dumps({"origin": "x" * 999}).encode(), 64, value_max_chars=1000)
    assert streamed(json.dumps({"state": ["x" * 997]}).encode(), 64, item_max_chars=1000)


def test_a_streamed_object_is_never_held_whole_as_bytes_or_text():
    """30 MB of items, made as they are read: the decoder's peak is the items it keeps
    and a chunk, not the body's bytes and text beside them (loads_in_pieces holds both)."""
    item = json.dumps({"content": "x" * 1000}).encode()
    count = 30_000

    def chunks():
        yield b'{"state": ['
        for i in range(count):
            yield item + (b"," if i < count - 1 else b"]}")

    tracemalloc.start()
    try:
        found = strict_json.loads_streamed_object(
            chunks(),
            arrays=("state",),
            max_items=count,
            item_max_chars=2000,
            value_max_chars=2000,
            pause=lambda: None,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(found["state"]) == count
    kept = sum(sys.getsizeof(i["content"]) + sys.getsizeof(i) for i in found["state"])
    body = len(item) * count
    print(f"body {body / 1e6:.1f} MB, kept {kept / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB")
    assert peak < kept + body / 4
