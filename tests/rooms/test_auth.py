"""The authorisation rules as pure functions, on events built and signed for real."""

import pytest
from signedjson.key import generate_signing_key

from homeserver.rooms.auth import (
    AuthError,
    check_against_state,
    check_auth_events,
    select_auth_events,
    user_power_level,
)
from homeserver.rooms.events import build_event
from homeserver.rooms.versions import ROOM_V10, ROOM_V11

KEY = generate_signing_key("t")
ALICE, BOB, CAROL = "@alice:hs", "@bob:hs", "@carol:hs"


class Room:
    """A linear room: each event is checked against its auth events, then becomes state."""

    def __init__(self, version=ROOM_V10, creator=ALICE, create_content=None):
        self.version = version
        self.state = {}
        self.last = None
        content = {"room_version": version.identifier, **(create_content or {})}
        if not version.implicit_room_creator:
            content.setdefault("creator", creator)
        self.send(creator, "m.room.create", content, "")
        self.send(creator, "m.room.member", {"membership": "join"}, creator)

    def build(self, sender, event_type, content, state_key=None, auth_events=None, redacts=None):
        auth = (
            auth_events
            if auth_events is not None
            else select_auth_events(
                self.version, event_type, sender, state_key, content, self.state
            )
        )
        return build_event(
            self.version,
            room_id="!room:hs",
            sender=sender,
            event_type=event_type,
            content=content,
            state_key=state_key,
            prev_events=[self.last] if self.last else [],
            auth_events=auth,
            origin_server_ts=1,
            server_name="hs",
            signing_key=KEY,
            redacts=redacts,
        ), auth

    def send(self, sender, event_type, content, state_key=None, verify=None, redacts=None):
        event, auth = self.build(sender, event_type, content, state_key, redacts=redacts)
        check_auth_events(self.version, event, auth, verify)
        check_against_state(self.version, event, self.state, verify)
        self.last = event
        if state_key is not None:
            self.state[(event_type, state_key)] = event
        return event

    def refused(self, sender, event_type, content, state_key=None, verify=None, redacts=None):
        with pytest.raises(AuthError) as info:
            self.send(sender, event_type, content, state_key, verify, redacts)
        return str(info.value)

    def power_levels(self, users, **extra):
        return self.send(ALICE, "m.room.power_levels", {"users": users, **extra}, "")

    def join_rule(self, rule, **extra):
        return self.send(ALICE, "m.room.join_rules", {"join_rule": rule, **extra}, "")


def member(membership, **extra):
    return {"membership": membership, **extra}


def test_creator_joins_then_invite_only_room_needs_an_invite():
    room = Room()
    room.power_levels({ALICE: 100})
    room.join_rule("invite")
    assert "not invited" in room.refused(BOB, "m.room.member", member("join"), BOB)
    room.send(ALICE, "m.room.member", member("invite"), BOB)
    room.send(BOB, "m.room.member", member("join"), BOB)
    # Joining on someone else's behalf is never allowed.
    assert "behalf" in room.refused(BOB, "m.room.member", member("join"), CAROL)


def test_public_room_ban_and_leave():
    room = Room()
    room.power_levels({ALICE: 100})
    room.join_rule("public")
    room.send(BOB, "m.room.member", member("join"), BOB)
    assert "kick" in room.refused(BOB, "m.room.member", member("leave"), ALICE)
    room.send(ALICE, "m.room.member", member("ban"), BOB)
    assert "banned" in room.refused(BOB, "m.room.member", member("join"), BOB)
    assert "not in the room" in room.refused(BOB, "m.room.member", member("leave"), BOB)
    # Leaving a room you are not in is refused; an invite to a banned user too.
    assert room.refused(CAROL, "m.room.member", member("leave"), CAROL)
    assert "banned" in room.refused(ALICE, "m.room.member", member("invite"), BOB)
    room.send(ALICE, "m.room.member", member("leave"), BOB)  # unban
    room.send(BOB, "m.room.member", member("join"), BOB)


def test_non_members_cannot_send_and_power_gates_state():
    room = Room()
    room.power_levels({ALICE: 100}, events={"m.room.name": 50}, state_default=50)
    room.join_rule("public")
    assert "not in the room" in room.refused(BOB, "m.room.message", {"body": "hi"})
    room.send(BOB, "m.room.member", member("join"), BOB)
    room.send(BOB, "m.room.message", {"body": "hi"})
    assert "needs power level 50" in room.refused(BOB, "m.room.name", {"name": "x"}, "")
    assert "needs power level 50" in room.refused(BOB, "m.room.topic", {"topic": "x"}, "")
    room.send(ALICE, "m.room.name", {"name": "x"}, "")
    # State keys naming another user are reserved for that user.
    assert "reserved" in room.refused(ALICE, "m.custom", {}, BOB)
    room.send(ALICE, "m.custom", {}, ALICE)


def test_power_level_changes():
    room = Room()
    room.power_levels({ALICE: 100, BOB: 50})
    room.join_rule("public")
    room.send(BOB, "m.room.member", member("join"), BOB)
    room.send(CAROL, "m.room.member", member("join"), CAROL)
    # Bob needs 100 to send power levels at all (state_default 50 lets him; raise it first).
    room.power_levels({ALICE: 100, BOB: 50}, events={"m.room.power_levels": 50})
    assert "above your own" in room.refused(
        BOB,
        "m.room.power_levels",
        {"users": {ALICE: 100, BOB: 50, CAROL: 60}, "events": {"m.room.power_levels": 50}},
        "",
    )
    assert "level of @alice" in room.refused(
        BOB,
        "m.room.power_levels",
        {"users": {ALICE: 0, BOB: 50}, "events": {"m.room.power_levels": 50}},
        "",
    )
    room.send(
        BOB,
        "m.room.power_levels",
        {"users": {ALICE: 100, BOB: 50, CAROL: 50}, "events": {"m.room.power_levels": 50}},
        "",
    )
    # v10: string values are refused outright.
    assert "integer" in room.refused(
        ALICE, "m.room.power_levels", {"users": {ALICE: 100}, "ban": "50"}, ""
    )
    assert "users" in room.refused(ALICE, "m.room.power_levels", {"users": {"not-a-user": 1}}, "")
    assert user_power_level(ROOM_V10, CAROL, room.state) == 50


def test_no_power_levels_event_gives_the_creator_100():
    for version in (ROOM_V10, ROOM_V11):
        room = Room(version)
        assert user_power_level(version, ALICE, room.state) == 100
        assert user_power_level(version, BOB, room.state) == 0


def test_create_event_rules():
    # v10 needs content.creator; v11 takes the creator from the sender.
    room10 = Room(ROOM_V10)
    assert room10.state[("m.room.create", "")].content["creator"] == ALICE
    room11 = Room(ROOM_V11)
    assert "creator" not in room11.state[("m.room.create", "")].content
    bad, _ = Room(ROOM_V11).build(ALICE, "m.room.create", {"room_version": "11"}, "")
    # A create event with prev_events (every later create) is refused.
    with pytest.raises(AuthError, match="prev_events"):
        check_auth_events(ROOM_V11, bad, [])
    no_creator = build_event(
        ROOM_V10,
        room_id="!r:hs",
        sender=ALICE,
        event_type="m.room.create",
        content={"room_version": "10"},
        state_key="",
        prev_events=[],
        auth_events=[],
        origin_server_ts=1,
        server_name="hs",
        signing_key=KEY,
    )
    with pytest.raises(AuthError, match="creator"):
        check_auth_events(ROOM_V10, no_creator, [])
    check_auth_events(ROOM_V11, no_creator, [])
    other_server = build_event(
        ROOM_V11,
        room_id="!r:elsewhere",
        sender=ALICE,
        event_type="m.room.create",
        content={},
        state_key="",
        prev_events=[],
        auth_events=[],
        origin_server_ts=1,
        server_name="hs",
        signing_key=KEY,
    )
    with pytest.raises(AuthError, match="different servers"):
        check_auth_events(ROOM_V11, other_server, [])


def test_auth_events_list_is_checked():
    room = Room()
    room.power_levels({ALICE: 100})
    create = room.state[("m.room.create", "")]
    pl = room.state[("m.room.power_levels", "")]
    alice = room.state[("m.room.member", ALICE)]
    event, _ = room.build(ALICE, "m.room.message", {}, auth_events=[create, pl, alice])
    check_auth_events(ROOM_V10, event, [create, pl, alice])
    with pytest.raises(AuthError, match="duplicate"):
        check_auth_events(ROOM_V10, event, [create, pl, alice, alice])
    with pytest.raises(AuthError, match="no m.room.create"):
        check_auth_events(ROOM_V10, event, [pl, alice])
    join_rules = room.join_rule("public")
    with pytest.raises(AuthError, match="unexpected"):
        check_auth_events(ROOM_V10, event, [create, pl, alice, join_rules])


def test_federate_false_keeps_other_servers_out():
    room = Room(create_content={"m.federate": False})
    room.join_rule("public")
    assert "federate" in room.refused("@eve:other", "m.room.member", member("join"), "@eve:other")


def test_restricted_join_needs_a_signed_authoriser_with_invite_power():
    room = Room()
    room.power_levels({ALICE: 100}, invite=50)
    room.join_rule("restricted", allow=[{"type": "m.room_membership", "room_id": "!o:hs"}])
    signed_by_hs = lambda event, server: server == "hs"  # noqa: E731
    assert "authorised" in room.refused(BOB, "m.room.member", member("join"), BOB, signed_by_hs)
    content = member("join", join_authorised_via_users_server=ALICE)
    assert "signed" in room.refused(BOB, "m.room.member", content, BOB, lambda e, s: False)
    room.send(BOB, "m.room.member", content, BOB, signed_by_hs)
    # Bob (level 0) may not authorise Carol's join.
    assert "authorised" in room.refused(
        CAROL,
        "m.room.member",
        member("join", join_authorised_via_users_server=BOB),
        CAROL,
        signed_by_hs,
    )


def test_knocking():
    room = Room()
    room.power_levels({ALICE: 100})
    room.join_rule("invite")
    assert "knocks" in room.refused(BOB, "m.room.member", member("knock"), BOB)
    room.join_rule("knock")
    room.send(BOB, "m.room.member", member("knock"), BOB)
    room.send(BOB, "m.room.member", member("leave"), BOB)  # retract the knock
    room.send(ALICE, "m.room.member", member("invite"), BOB)
    assert "cannot knock" in room.refused(BOB, "m.room.member", member("knock"), BOB)


def test_unknown_membership_is_refused():
    room = Room()
    assert "unknown membership" in room.refused(ALICE, "m.room.member", member("dance"), ALICE)
    assert room.refused(ALICE, "m.room.member", {}, ALICE)


def test_third_party_invite_needs_a_signature_from_the_invite_keys():
    from signedjson.key import encode_verify_key_base64, get_verify_key
    from signedjson.sign import sign_json

    identity_key = generate_signing_key("0")
    room = Room()
    room.power_levels({ALICE: 100})
    room.join_rule("invite")
    room.send(
        ALICE,
        "m.room.third_party_invite",
        {
            "display_name": "b...@example.org",
            "key_validity_url": "https://id.example/valid",
            "public_key": encode_verify_key_base64(get_verify_key(identity_key)),
        },
        "tok",
    )

    def invite(signed_by, mxid=BOB, token="tok"):
        signed = sign_json({"mxid": mxid, "token": token, "sender": ALICE}, "id.example", signed_by)
        return member("invite", third_party_invite={"display_name": "b", "signed": signed})

    assert "no valid signature" in room.refused(
        ALICE, "m.room.member", invite(generate_signing_key("0")), BOB
    )
    assert "another user" in room.refused(ALICE, "m.room.member", invite(identity_key, CAROL), BOB)
    assert "no matching" in room.refused(
        ALICE, "m.room.member", invite(identity_key, token="other"), BOB
    )
    room.send(ALICE, "m.room.member", invite(identity_key), BOB)
    room.send(BOB, "m.room.member", member("join"), BOB)
