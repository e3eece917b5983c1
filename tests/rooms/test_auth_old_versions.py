"""Room versions 1 to 9: what each changes, checked on events built and signed for real
(homeserver/rooms/versions.py). Versions 10 and later are tests/rooms/test_auth.py's."""

import pytest
from unpaddedbase64 import encode_base64

from homeserver.core.events import Event
from homeserver.rooms.events import (
    InvalidEvent,
    check_pdu_format,
    compute_reference_hash,
    event_id_for,
    redact,
)
from homeserver.rooms.pdu_checks import CheckedPdu, _keys_valid_at, signing_servers
from homeserver.rooms.versions import (
    KNOWN_ROOM_VERSIONS,
    ROOM_V1,
    ROOM_V2,
    ROOM_V3,
    ROOM_V4,
    ROOM_V5,
    ROOM_V6,
    ROOM_V7,
    ROOM_V8,
    ROOM_V9,
    ROOM_V10,
)
from tests.rooms.test_auth import ALICE, BOB, Room, member

OUTSIDER = "@mallory:elsewhere"


def test_versions_1_to_12_are_known_and_1_to_5_unstable():
    assert list(KNOWN_ROOM_VERSIONS) == [str(v) for v in range(1, 13)]
    unstable = [v.identifier for v in KNOWN_ROOM_VERSIONS.values() if not v.stable]
    assert unstable == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("version", [ROOM_V1, ROOM_V2])
def test_v1_and_v2_events_carry_their_id_and_name_others_with_hashes(version):
    room = Room(version)
    message = room.send(ALICE, "m.room.message", {"body": "hi"})
    assert message.pdu["event_id"] == message.event_id and message.event_id.endswith(":hs")
    # [ID, {"sha256": the content hash the named event carries}] pairs.
    prev = message.pdu["prev_events"]
    assert prev == [[room.state[("m.room.member", ALICE)].event_id, prev[0][1]]]
    assert prev[0][1] == {"sha256": room.state[("m.room.member", ALICE)].pdu["hashes"]["sha256"]}
    assert message.prev_event_ids == [prev[0][0]]
    assert set(message.auth_event_ids) == {e[0] for e in message.pdu["auth_events"]}
    check_pdu_format(version, message)
    # The server its ID names signs it too: it chose the ID.
    other = {**message.pdu, "event_id": "$x:elsewhere"}
    assert signing_servers(other, version) == ["hs", "elsewhere"]
    without_id = {k: v for k, v in message.pdu.items() if k != "event_id"}
    with pytest.raises(InvalidEvent, match="event_id"):
        check_pdu_format(version, Event(event_id_for(version, without_id), without_id))
    ids_only = {**message.pdu, "prev_events": message.prev_event_ids}
    with pytest.raises(InvalidEvent, match="prev_events"):
        check_pdu_format(version, Event(message.event_id, ids_only))


def test_v3_event_ids_are_standard_base64_and_v4_url_safe():
    room = Room(ROOM_V3)
    event = room.send(ALICE, "m.room.message", {"body": "hi"})
    reference = compute_reference_hash(ROOM_V3, event.pdu)
    assert event.event_id == "$" + encode_base64(reference)
    assert event_id_for(ROOM_V4, event.pdu) == "$" + encode_base64(reference, urlsafe=True)
    assert "event_id" not in event.pdu and event.pdu["prev_events"][0].startswith("$")
    with pytest.raises(InvalidEvent, match="prev_events"):
        pairs = {**event.pdu, "prev_events": [[event.pdu["prev_events"][0], {}]]}
        check_pdu_format(ROOM_V3, Event(event_id_for(ROOM_V3, pairs), pairs))


@pytest.mark.parametrize("version", [ROOM_V1, ROOM_V2])
def test_v1_and_v2_redact_another_servers_event_only_with_power(version):
    room = Room(version)
    room.power_levels({ALICE: 100})
    room.join_rule("public")
    room.send(BOB, "m.room.member", member("join"), BOB)
    theirs = "$their-event:elsewhere"
    assert "redact power level" in room.refused(BOB, "m.room.redaction", {}, redacts=theirs)
    # Rule 11.2: the redaction's ID and its target's name the same server.
    room.send(BOB, "m.room.redaction", {}, redacts="$ours:hs")
    room.send(ALICE, "m.room.redaction", {}, redacts=theirs)


@pytest.mark.parametrize("version", [ROOM_V4, ROOM_V5])
def test_before_v6_aliases_are_the_senders_servers_own(version):
    room = Room(version)
    # Rule 4 allows it before any membership rule: the sender need not be in the room.
    room.send(OUTSIDER, "m.room.aliases", {"aliases": ["#a:elsewhere"]}, "elsewhere")
    assert "sender's server" in room.refused(OUTSIDER, "m.room.aliases", {"aliases": []}, "hs")


def test_from_v6_aliases_are_a_state_event_like_any_other():
    room = Room(ROOM_V6)
    assert "not in the room" in room.refused(
        OUTSIDER, "m.room.aliases", {"aliases": ["#a:elsewhere"]}, "elsewhere"
    )


def test_redaction_keeps_what_each_version_keeps():
    aliases = {"type": "m.room.aliases", "state_key": "hs", "content": {"aliases": ["#a:hs"]}}
    rules = {
        "type": "m.room.join_rules",
        "state_key": "",
        "content": {"join_rule": "x", "allow": []},
    }
    joined = {
        "type": "m.room.member",
        "state_key": BOB,
        "content": {"membership": "join", "join_authorised_via_users_server": ALICE},
    }
    kept = {
        v.identifier: [sorted(redact(v, e)["content"]) for e in (aliases, rules, joined)]
        for v in (ROOM_V5, ROOM_V6, ROOM_V7, ROOM_V8, ROOM_V9)
    }
    # Aliases' `aliases` before v6; join rules' `allow` from v8; a member's
    # `join_authorised_via_users_server` from v9.
    authoriser = ["join_authorised_via_users_server", "membership"]
    assert kept == {
        "5": [["aliases"], ["join_rule"], ["membership"]],
        "6": [[], ["join_rule"], ["membership"]],
        "7": [[], ["join_rule"], ["membership"]],
        "8": [[], ["allow", "join_rule"], ["membership"]],
        "9": [[], ["allow", "join_rule"], authoriser],
    }


@pytest.mark.parametrize("version", [ROOM_V4, ROOM_V9])
def test_before_v10_a_level_may_be_the_text_of_an_integer(version):
    room = Room(version)
    room.power_levels({ALICE: 100, BOB: " 50 "}, ban="+60")
    room.join_rule("public")
    room.send(BOB, "m.room.member", member("join"), BOB)
    # Bob's "50" is below the ban level "+60".
    assert "ban" in room.refused(BOB, "m.room.member", member("ban"), ALICE)
    assert "users" in room.refused(ALICE, "m.room.power_levels", {"users": {BOB: "5x"}}, "")


def test_from_v10_a_level_is_an_integer():
    room = Room(ROOM_V10)
    assert "users" in room.refused(ALICE, "m.room.power_levels", {"users": {ALICE: "100"}}, "")


@pytest.mark.parametrize("version, allowed", [(ROOM_V5, True), (ROOM_V6, False)])
def test_notifications_levels_are_checked_from_v6(version, allowed):
    room = Room(version)
    room.power_levels({ALICE: 100, BOB: 50}, notifications={"room": 100})
    room.join_rule("public")
    room.send(BOB, "m.room.member", member("join"), BOB)
    # Bob, at 50, changes the level of a room ping, which is 100.
    content = {"users": {ALICE: 100, BOB: 50}, "notifications": {"room": 10}}
    if allowed:
        room.send(BOB, "m.room.power_levels", content, "")
    else:
        room.refused(BOB, "m.room.power_levels", content, "")


@pytest.mark.parametrize("version, allowed", [(ROOM_V6, False), (ROOM_V7, True)])
def test_knocking_is_from_v7(version, allowed):
    room = Room(version)
    room.join_rule("knock")
    if allowed:
        room.send(BOB, "m.room.member", member("knock"), BOB)
    else:
        room.refused(BOB, "m.room.member", member("knock"), BOB)


def test_signing_keys_must_be_valid_at_the_event_from_v5():
    pdu = {"origin_server_ts": 1234}
    assert _keys_valid_at(CheckedPdu("$e", pdu, ROOM_V4)) == 0
    assert _keys_valid_at(CheckedPdu("$e", pdu, ROOM_V5)) == 1234
