"""Weir's outgoing JSON (homeserver/core/json_text.py)."""

import json

from homeserver.core import json_text
from homeserver.core.json_text import encode, object_text, utf8


def test_a_lone_surrogate_kept_from_before_goes_out_as_its_escape():
    # No UTF-8 form: the answer still parses, to the same string, rather than failing.
    value = {"body": "a\ud800b", "other": "é"}
    data = utf8(encode(value))
    assert b"\\ud800" in data and "é".encode() in data
    assert json.loads(data) == value


def test_an_object_from_encoded_members_is_the_object_encoded_whole():
    members = {'a"b': [1, {"x": None}], "é": "text", "n": 1.5}
    text = object_text((name, encode(value)) for name, value in members.items())
    assert json.loads(text) == members
    assert text == encode(members)


def test_encoded_in_pieces_is_the_same_text_and_pauses_between_pieces():
    events = [
        {"type": "m.room.member", "content": {"membership": "join", "n": n}} for n in range(1234)
    ]
    answer = {
        "next_batch": "s1",
        "rooms": {"join": {"!r:x": {"state": {"events": events}, "timeline": {"events": []}}}},
        "empty": {},
        "deep": {"a": {"b": {"c": {"d": {"e": {"f": [1, "é", None]}}}}}},
    }
    pauses = []
    text = json_text.encode_in_pieces(answer, lambda: pauses.append(1))
    assert text == json_text.encode(answer)
    assert len(pauses) >= 1234 // json_text.PIECE_MEMBERS
