"""The one strict JSON decoder (homeserver/core/strict_json.py)."""

from __future__ import annotations

import json

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
