"""Canonical JSON signing (the spec's test vectors) and X-Matrix headers."""

import hashlib

import pytest
from canonicaljson import encode_canonical_json
from signedjson.key import decode_signing_key_base64, generate_signing_key, get_verify_key
from signedjson.sign import sign_json
from unpaddedbase64 import encode_base64

from homeserver.federation.errors import InvalidSignature
from homeserver.federation.signing import (
    MalformedAuthHeader,
    XMatrixAuth,
    parse_x_matrix,
    request_object,
    sign_request,
    verify_signature,
)

# Spec v1.16, Appendices, "Signing key" test vectors.
SPEC_SEED = "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"


@pytest.fixture(scope="module")
def spec_key():
    return decode_signing_key_base64("ed25519", "1", SPEC_SEED)


@pytest.mark.parametrize(
    "obj, signature",
    [
        (
            {},
            "K8280/U9SSy9IVtjBuVeLr+HpOB4BQFWbg+UZaADMtTdGYI7Geitb76LTrr5QV/7Xg4ahLwYGYZzuHGZKM5ZAQ",
        ),
        (
            {"one": 1, "two": "Two"},
            "KqmLSbO39/Bzb0QIYE82zqLwsA+PDzYIpIRA2sRQ4sL53+sN6/fpNSoqE7BP7vBZhG6kYdD13EIMJpvhJI+6Bw",
        ),
    ],
)
def test_spec_json_signing_vectors(spec_key, obj, signature):
    signed = sign_json(obj, "domain", spec_key)
    assert signed["signatures"] == {"domain": {"ed25519:1": signature}}
    verify_signature(signed, "domain", get_verify_key(spec_key))


def _content_hash(event: dict) -> str:
    stripped = {k: v for k, v in event.items() if k not in ("unsigned", "signatures", "hashes")}
    return encode_base64(hashlib.sha256(encode_canonical_json(stripped)).digest())


@pytest.mark.parametrize(
    "event, redacted_content, content_hash, signature",
    [
        (
            {
                "room_id": "!x:domain",
                "sender": "@a:domain",
                "origin": "domain",
                "origin_server_ts": 1000000,
                "signatures": {},
                "hashes": {},
                "type": "X",
                "content": {},
                "prev_events": [],
                "auth_events": [],
                "depth": 3,
                "unsigned": {"age_ts": 1000000},
            },
            {},
            "5jM4wQpv6lnBo7CLIghJuHdW+s2CMBJPUOGOC89ncos",
            "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIReFGZlHi5KLjAWbOoMszkwsQma+lYAg",
        ),
        (
            {
                "content": {"body": "Here is the message content"},
                "event_id": "$0:domain",
                "origin": "domain",
                "origin_server_ts": 1000000,
                "type": "m.room.message",
                "room_id": "!r:domain",
                "sender": "@u:domain",
                "signatures": {},
                "unsigned": {"age_ts": 1000000},
            },
            {},
            "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g",
            "Wm+VzmOUOz08Ds+0NTWb1d4CZrVsJSikkeRxh6aCcUwu6pNC78FunoD7KNWzqFn241eYHYMGCA5McEiVPdhzBA",
        ),
    ],
)
def test_spec_event_signing_vectors(spec_key, event, redacted_content, content_hash, signature):
    # The event vectors: hash the event, then sign its redacted form (for these two events
    # redaction empties the content and drops unsigned; every other key is kept).
    assert _content_hash(event) == content_hash
    hashed = dict(event, hashes={"sha256": content_hash})
    redacted = {k: v for k, v in hashed.items() if k != "unsigned"}
    redacted["content"] = redacted_content
    signed = sign_json(redacted, "domain", spec_key)
    assert signed["signatures"]["domain"]["ed25519:1"] == signature


def test_request_signature_round_trip():
    key = generate_signing_key("k1")
    uri = "/_matrix/federation/v1/query/profile?user_id=%40a%3Aweir.test&field=displayname"
    header = sign_request(key, "origin.test", "weir.test", "get", uri, {"a": [1, 2]})
    auth = parse_x_matrix(header)
    assert auth == XMatrixAuth("origin.test", "ed25519:k1", auth.sig, "weir.test")
    obj = request_object("GET", uri, "origin.test", "weir.test", {"a": [1, 2]})
    obj["signatures"] = {"origin.test": {auth.key_id: auth.sig}}
    verify_signature(obj, "origin.test", get_verify_key(key))
    # Any change to what was signed breaks it: the uri, the method, the content.
    for changed in (dict(obj, uri=uri + "x"), dict(obj, method="PUT"), dict(obj, content={})):
        with pytest.raises(InvalidSignature):
            verify_signature(changed, "origin.test", get_verify_key(key))


@pytest.mark.parametrize(
    "header",
    [
        'X-Matrix origin="o.test",destination="d.test",key="ed25519:1",sig="c2lnbmF0dXJl"',
        'X-Matrix sig="c2lnbmF0dXJl", key="ed25519:1", destination="d.test", origin="o.test"',
        "X-Matrix origin=o.test,destination=d.test,key=ed25519:1,sig=c2lnbmF0dXJl",
        'x-matrix ORIGIN="o.test" , Destination=d.test,KEY="ed25519:1",sig="c2lnbmF0dXJl"',
        'X-Matrix origin="o.\\test",destination="d.test",key="ed25519:1",sig="c2lnbmF0dXJl",new=1',
    ],
)
def test_x_matrix_parameters_in_any_form(header):
    assert parse_x_matrix(header) == XMatrixAuth("o.test", "ed25519:1", "c2lnbmF0dXJl", "d.test")


def test_x_matrix_escapes_and_missing_destination():
    auth = parse_x_matrix('X-Matrix origin="a\\"b",key="ed25519:1",sig="s"')
    assert auth.origin == 'a"b' and auth.destination is None


@pytest.mark.parametrize(
    "header",
    [
        "Bearer abc",
        'X-Matrix origin="o.test",key="ed25519:1"',  # no sig
        'X-Matrix key="ed25519:1",sig="s"',  # no origin
        'X-Matrix origin="o.test",key="ed25519:1",sig="unterminated',
        "X-Matrix garbage",
    ],
)
def test_x_matrix_malformed(header):
    with pytest.raises(MalformedAuthHeader):
        parse_x_matrix(header)
