"""PDU hashing, signing, IDs and redaction, checked against the spec's test vectors and an
independent recomputation."""

import copy
import hashlib
import json

import pytest
from signedjson.key import decode_signing_key_base64, get_verify_key
from signedjson.sign import verify_signed_json
from unpaddedbase64 import decode_base64, encode_base64

from homeserver.rooms.events import (
    MAX_PDU_BYTES,
    InvalidEvent,
    add_hashes_and_signatures,
    build_event,
    check_canonical_values,
    event_id_for,
    redact,
)
from homeserver.rooms.versions import ROOM_V10, ROOM_V11

# Appendices, "Cryptographic Test Vectors".
SPEC_KEY = decode_signing_key_base64("ed25519", "1", "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1")


def canonical(obj) -> bytes:
    # Written out here rather than imported, so the test does not trust the code under test.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


def test_spec_vector_minimal_event():
    pdu = {
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
    }
    add_hashes_and_signatures(ROOM_V10, pdu, "domain", SPEC_KEY)
    assert pdu["hashes"] == {"sha256": "5jM4wQpv6lnBo7CLIghJuHdW+s2CMBJPUOGOC89ncos"}
    assert pdu["signatures"] == {
        "domain": {
            "ed25519:1": (
                "KxwGjPSDEtvnFgU00fwFz+l6d2pJM6XBIaMEn81SXPTRl16AqLAYqfIReFGZlHi5KLjAWbOoMszkwsQma+lYAg"
            )
        }
    }


def test_spec_vector_event_with_redactable_content():
    pdu = {
        "content": {"body": "Here is the message content"},
        "event_id": "$0:domain",
        "origin": "domain",
        "origin_server_ts": 1000000,
        "type": "m.room.message",
        "room_id": "!r:domain",
        "sender": "@u:domain",
        "signatures": {},
        "unsigned": {"age_ts": 1000000},
    }
    add_hashes_and_signatures(ROOM_V10, pdu, "domain", SPEC_KEY)
    assert pdu["hashes"] == {"sha256": "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g"}
    assert pdu["signatures"]["domain"]["ed25519:1"] == (
        "Wm+VzmOUOz08Ds+0NTWb1d4CZrVsJSikkeRxh6aCcUwu6pNC78FunoD7KNWzqFn241eYHYMGCA5McEiVPdhzBA"
    )


@pytest.mark.parametrize("version", [ROOM_V10, ROOM_V11])
def test_built_event_verifies_independently(version):
    create = build_event(
        version,
        room_id="!r:domain",
        sender="@u:domain",
        event_type="m.room.create",
        content={"room_version": version.identifier, "creator": "@u:domain"},
        state_key="",
        prev_events=[],
        auth_events=[],
        origin_server_ts=1234,
        server_name="domain",
        signing_key=SPEC_KEY,
    )
    msg = build_event(
        version,
        room_id="!r:domain",
        sender="@u:domain",
        event_type="m.room.message",
        content={"body": "hi", "n": [1, {"x": None}]},
        state_key=None,
        prev_events=[create],
        auth_events=[create],
        origin_server_ts=1235,
        server_name="domain",
        signing_key=SPEC_KEY,
    )
    assert msg.depth == create.depth + 1 == 2
    assert msg.prev_event_ids == [create.event_id]
    assert "event_id" not in msg.pdu  # v4+ PDUs carry no event_id

    for event in (create, msg):
        pdu = event.pdu
        # Content hash: the full event minus unsigned, signatures and hashes.
        body = {k: v for k, v in pdu.items() if k not in ("unsigned", "signatures", "hashes")}
        assert decode_base64(pdu["hashes"]["sha256"]) == hashlib.sha256(canonical(body)).digest()
        # Reference hash: redact (a message's content is emptied; a create event keeps only
        # `creator` in v10 and everything in v11), drop signatures and unsigned.
        redacted = {k: v for k, v in pdu.items() if k not in ("signatures", "unsigned")}
        if event.type == "m.room.message":
            redacted["content"] = {}
        elif version is ROOM_V10:
            redacted["content"] = {"creator": "@u:domain"}
        ref = hashlib.sha256(canonical(redacted)).digest()
        assert event.event_id == "$" + encode_base64(ref, urlsafe=True)
        # The signature covers the redacted event and verifies with the public key.
        verify_signed_json(redact(version, pdu), "domain", get_verify_key(SPEC_KEY))


def test_redaction_differs_between_v10_and_v11():
    pdu = {
        "type": "m.room.create",
        "room_id": "!r:d",
        "sender": "@u:d",
        "origin": "d",
        "membership": "join",
        "prev_state": [],
        "content": {"creator": "@u:d", "m.federate": False, "room_version": "10"},
        "unsigned": {"age": 1},
    }
    v10 = redact(ROOM_V10, pdu)
    assert v10["content"] == {"creator": "@u:d"}
    assert {"origin", "membership", "prev_state"} <= set(v10)
    assert "unsigned" not in v10
    v11 = redact(ROOM_V11, pdu)
    assert v11["content"] == pdu["content"]  # v11 keeps the whole create content
    assert not {"origin", "membership", "prev_state"} & set(v11)

    pl = {"type": "m.room.power_levels", "content": {"invite": 0, "ban": 50, "other": 1}}
    assert redact(ROOM_V10, pl)["content"] == {"ban": 50}
    assert redact(ROOM_V11, pl)["content"] == {"ban": 50, "invite": 0}
    red = {"type": "m.room.redaction", "content": {"redacts": "$x", "reason": "spam"}}
    assert redact(ROOM_V10, red)["content"] == {}
    assert redact(ROOM_V11, red)["content"] == {"redacts": "$x"}
    member = {
        "type": "m.room.member",
        "content": {
            "membership": "invite",
            "displayname": "A",
            "third_party_invite": {"display_name": "x", "signed": {"mxid": "@a:d", "token": "t"}},
        },
    }
    assert redact(ROOM_V10, member)["content"] == {"membership": "invite"}
    assert redact(ROOM_V11, member)["content"] == {
        "membership": "invite",
        "third_party_invite": {"signed": {"mxid": "@a:d", "token": "t"}},
    }
    # Redaction never changes its input.
    before = copy.deepcopy(member)
    redact(ROOM_V11, member)
    assert member == before


def test_event_id_ignores_non_essential_content():
    base = {
        "type": "m.room.message",
        "room_id": "!r:d",
        "sender": "@u:d",
        "content": {"body": "a"},
        "hashes": {"sha256": "x"},
        "depth": 1,
        "prev_events": [],
        "auth_events": [],
        "origin_server_ts": 1,
    }
    other = dict(base, content={"body": "b"}, unsigned={"age": 5}, signatures={"d": {}})
    assert event_id_for(ROOM_V10, base) == event_id_for(ROOM_V10, other)
    assert event_id_for(ROOM_V10, base) != event_id_for(ROOM_V10, dict(base, depth=2))


def test_canonical_json_values():
    check_canonical_values({"a": [1, "x", None, True, {"b": 2**53 - 1}]})
    for bad in ({"f": 1.5}, {"big": 2**53}, {"neg": -(2**53)}, [float("nan")]):
        with pytest.raises(InvalidEvent):
            check_canonical_values(bad)


def test_size_limits():
    def build(content, event_type="m.room.message", state_key=None):
        return build_event(
            ROOM_V10,
            room_id="!r:domain",
            sender="@u:domain",
            event_type=event_type,
            content=content,
            state_key=state_key,
            prev_events=[],
            auth_events=[],
            origin_server_ts=1,
            server_name="domain",
            signing_key=SPEC_KEY,
        )

    build({"body": "x" * (MAX_PDU_BYTES - 1000)})
    with pytest.raises(InvalidEvent) as info:
        build({"body": "x" * MAX_PDU_BYTES})
    assert info.value.too_large
    with pytest.raises(InvalidEvent):
        build({}, event_type="t" * 256)
    with pytest.raises(InvalidEvent):
        build({}, event_type="m.x", state_key="k" * 256)
