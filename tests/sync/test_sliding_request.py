"""A sliding sync body is parsed once (sync/sliding_request.py `ParsedRequests`): the long-polls
that send the same bytes, or bytes that differ only in their to-device `since`, share one
parse, which nothing changes; others are parsed afresh, a refused body is never kept, and
the kept ones are bounded."""

import json

import pytest

from homeserver.core.errors import MatrixError
from homeserver.sync import sliding_request
from homeserver.sync.sliding_request import PARSED_MAX_BYTES, ParsedRequests, parse_request

real_parse = parse_request

BODY = {
    "conn_id": "main",
    "lists": {"all": {"ranges": [[0, 19]], "timeline_limit": 1}},
    "room_subscriptions": {"!a:weir.test": {"timeline_limit": 5}},
}


def encoded(body: dict) -> bytes:
    return json.dumps(body).encode()


class Decoder:
    """json.loads, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, raw: bytes) -> dict:
        self.calls += 1
        return json.loads(raw)


def test_the_same_bytes_share_one_parse_that_cannot_be_changed():
    parsed, decode = ParsedRequests(), Decoder()
    first = parsed.parse(encoded(BODY), decode)
    again = parsed.parse(encoded(BODY), decode)  # equal bytes, another object
    assert decode.calls == 1
    assert again[1] is first[1]
    assert first[1].lists[0].ranges == ((0, 19),)
    with pytest.raises(TypeError):
        first[1].subscriptions["!b:weir.test"] = first[1].subscriptions["!a:weir.test"]


def test_other_bodies_are_parsed_and_refused_ones_never_kept():
    parsed, decode = ParsedRequests(), Decoder()
    parsed.parse(encoded(BODY), decode)
    other = parsed.parse(encoded({**BODY, "conn_id": "other"}), decode)
    assert decode.calls == 2 and other[1].conn_id == "other"
    bad = encoded({"conn_id": "main", "lists": {"all": {"ranges": [[5, 1]]}}})
    for _ in range(2):
        with pytest.raises(MatrixError) as refused:
            parsed.parse(bad, decode)
        assert refused.value.errcode == "M_INVALID_PARAM"
    assert decode.calls == 4


def test_kept_bodies_are_bounded_oldest_use_out():
    parsed, decode = ParsedRequests(kept=2), Decoder()
    bodies = [encoded({**BODY, "conn_id": name}) for name in ("a", "b", "c")]
    for raw in bodies[:2]:
        parsed.parse(raw, decode)
    parsed.parse(bodies[0], decode)  # a used again: b is the oldest
    parsed.parse(bodies[2], decode)
    parsed.parse(bodies[0], decode)
    assert decode.calls == 3
    parsed.parse(bodies[1], decode)
    assert decode.calls == 4


def test_a_large_body_is_parsed_each_time():
    parsed, decode = ParsedRequests(), Decoder()
    large = encoded({**BODY, "padding": "x" * PARSED_MAX_BYTES})
    parsed.parse(large, decode)
    parsed.parse(large, decode)
    assert decode.calls == 2


def test_bodies_differing_in_their_to_device_since_share_one_parse(monkeypatch):
    """Element X sends its to-device `since` in the body, a new one after each answer."""
    made = []
    monkeypatch.setattr(
        sliding_request, "parse_request", lambda body: made.append(body) or real_parse(body)
    )
    parsed, decode = ParsedRequests(), Decoder()

    def with_since(since) -> bytes:
        to_device = {"enabled": True, **({"since": since} if since is not None else {})}
        return encoded({**BODY, "extensions": {"to_device": to_device, "e2ee": {"enabled": True}}})

    first = parsed.parse(with_since("5"), decode)[1]
    second = parsed.parse(with_since("9"), decode)[1]
    assert len(made) == 1 and decode.calls == 1  # found by its bytes, the since's digits aside
    assert (first.extensions.to_device_since, second.extensions.to_device_since) == (5, 9)
    assert second.lists is first.lists and second.extensions.e2ee
    assert parsed.parse(with_since("9"), decode)[1] is second  # the connections woken together
    without = parsed.parse(with_since(None), decode)[1]
    assert without.extensions.to_device_since is None and without.lists == first.lists
    for bad in ("5x", 5, ""):
        with pytest.raises(MatrixError) as refused:
            parsed.parse(with_since(bad), decode)
        assert refused.value.errcode == "M_INVALID_PARAM"


def test_a_since_elsewhere_than_to_device_is_not_taken_for_it():
    parsed, decode = ParsedRequests(), Decoder()
    raw = encoded({**BODY, "extensions": {"to_device": {"enabled": True}, "e2ee": {"since": "7"}}})
    for _ in range(2):
        request = parsed.parse(raw, decode)[1]
        assert request.extensions.to_device and request.extensions.to_device_since is None
    assert decode.calls == 2  # not kept: its since is not the one taken out
