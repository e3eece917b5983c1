"""Room version 12's differences from 11 (spec v1.16, "Room Version 12"), each checked on
events built and signed for real, and each shown to pass under the v11 rules: a hashed room
ID and no room_id on the create event, additional_creators, no create event in auth_events,
a room ID that must name the create event, and creators above every power level."""

import pytest
from signedjson.key import generate_signing_key

from homeserver.core.events import Event
from homeserver.core.identifiers import (
    create_event_id_for_room,
    is_hash_room_id,
    is_valid_room_id,
    room_id_server,
)
from homeserver.rooms.auth import (
    AuthError,
    auth_event_ids_to_check,
    check_against_state,
    check_auth_events,
    select_auth_events,
)
from homeserver.rooms.events import InvalidEvent, build_event, check_pdu_format, room_id_of
from homeserver.rooms.power_levels import CREATOR_POWER_LEVEL, user_power_level
from homeserver.rooms.versions import ROOM_V11, ROOM_V12

KEY = generate_signing_key("t")
ALICE, BOB, CAROL, DAVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs"


class Room:
    """A linear room of either version: each event is checked against its auth events (in
    v12, those listed plus the create event the room ID names), then becomes state."""

    def __init__(self, version=ROOM_V12, creator=ALICE, create_content=None):
        self.version = version
        self.state: dict = {}
        self.events: dict[str, Event] = {}
        self.last = None
        self.room_id = None if version.room_id_is_create_event_id else "!room:hs"
        self.create = self.send(
            creator,
            "m.room.create",
            {"room_version": version.identifier, **(create_content or {})},
            "",
        )
        self.room_id = self.create.room_id
        self.send(creator, "m.room.member", {"membership": "join"}, creator)

    def build(self, sender, event_type, content, state_key=None, auth=None, room_id=None):
        auth = (
            auth
            if auth is not None
            else select_auth_events(
                self.version, event_type, sender, state_key, content, self.state
            )
        )
        return build_event(
            self.version,
            room_id=room_id or self.room_id,
            sender=sender,
            event_type=event_type,
            content=content,
            state_key=state_key,
            prev_events=[self.last] if self.last else [],
            auth_events=auth,
            origin_server_ts=1,
            server_name="hs",
            signing_key=KEY,
        )

    def check(self, event):
        auth = [self.events[i] for i in auth_event_ids_to_check(self.version, event)]
        check_auth_events(self.version, event, auth)
        check_against_state(self.version, event, self.state)

    def send(self, sender, event_type, content, state_key=None):
        event = self.build(sender, event_type, content, state_key)
        self.check(event)
        self.events[event.event_id] = event
        self.last = event
        if state_key is not None:
            self.state[(event_type, state_key)] = event
        return event

    def refused(self, sender, event_type, content, state_key=None) -> str:
        with pytest.raises(AuthError) as info:
            self.send(sender, event_type, content, state_key)
        return str(info.value)

    def public_with_members(self, *users, levels=None):
        self.send(ALICE, "m.room.join_rules", {"join_rule": "public"}, "")
        if levels is not None:
            self.send(ALICE, "m.room.power_levels", {"users": levels}, "")
        for user in users:
            self.send(user, "m.room.member", {"membership": "join"}, user)


def test_room_id_is_the_create_event_id_and_the_create_event_has_no_room_id():
    room = Room()
    create = room.create
    assert "room_id" not in create.pdu
    assert room.room_id == "!" + create.event_id[1:]
    assert is_hash_room_id(room.room_id) and is_valid_room_id(room.room_id)
    assert room_id_server(room.room_id) is None  # no server part to read an origin from
    assert create_event_id_for_room(room.room_id) == create.event_id
    assert room_id_of(ROOM_V12, create.pdu) == room.room_id
    check_pdu_format(ROOM_V12, create)
    # Every other event names the room by that hash.
    message = room.send(ALICE, "m.room.message", {"body": "hi"})
    assert message.pdu["room_id"] == room.room_id
    check_pdu_format(ROOM_V12, message)
    # Under the v11 rules a create event without room_id is malformed and fails rule 1.2.
    with pytest.raises(InvalidEvent):
        check_pdu_format(ROOM_V11, create)
    with pytest.raises(AuthError):
        check_auth_events(ROOM_V11, create, [])
    with pytest.raises(InvalidEvent):
        build_event(
            ROOM_V11,
            room_id=None,
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


def test_a_create_event_with_a_room_id_is_rejected():
    create = build_event(
        ROOM_V11,  # v11 builds it with the room_id v12 forbids
        room_id="!room:hs",
        sender=ALICE,
        event_type="m.room.create",
        content={"room_version": "12"},
        state_key="",
        prev_events=[],
        auth_events=[],
        origin_server_ts=1,
        server_name="hs",
        signing_key=KEY,
    )
    with pytest.raises(AuthError, match="must not have a room_id"):
        check_auth_events(ROOM_V12, create, [])
    check_auth_events(ROOM_V11, create, [])  # v11: the room ID names the sender's server


@pytest.mark.parametrize("bad", ["@bob:hs", ["not a user id"], [1], {"@bob:hs": True}])
def test_additional_creators_must_be_a_list_of_user_ids(bad):
    with pytest.raises(AuthError, match="additional_creators"):
        Room(create_content={"additional_creators": bad})
    Room(ROOM_V11, create_content={"additional_creators": bad})  # meaningless before v12


def test_auth_events_never_list_the_create_event():
    room = Room()
    message = room.send(ALICE, "m.room.message", {"body": "hi"})
    assert room.create.event_id not in message.auth_event_ids
    assert room.create.event_id in auth_event_ids_to_check(ROOM_V12, message)
    # Listing it anyway: malformed, and refused by rule 3.2.
    listing = room.build(
        ALICE,
        "m.room.message",
        {"body": "hi"},
        auth=[
            room.create,
            *select_auth_events(ROOM_V12, "m.room.message", ALICE, None, {}, room.state),
        ],
    )
    with pytest.raises(InvalidEvent, match="create event"):
        check_pdu_format(ROOM_V12, listing)
    with pytest.raises(AuthError, match="must not list"):
        check_auth_events(ROOM_V12, listing, [room.events[i] for i in listing.auth_event_ids])
    # v11 selects it, and requires it.
    v11 = Room(ROOM_V11)
    v11_message = v11.send(ALICE, "m.room.message", {"body": "hi"})
    assert v11.create.event_id in v11_message.auth_event_ids


def test_the_room_id_must_name_an_accepted_create_event():
    room, other = Room(), Room(create_content={"m.federate": True})
    assert room.room_id != other.room_id
    message = room.build(ALICE, "m.room.message", {"body": "hi"})
    # Checked against another room's create event, as if the room ID named it: rule 2.
    state = {**room.state, ("m.room.create", ""): other.create}
    with pytest.raises(AuthError, match="does not name"):
        check_against_state(ROOM_V12, message, state)
    auth = [room.events[i] for i in message.auth_event_ids] + [other.create]
    with pytest.raises(AuthError):
        check_auth_events(ROOM_V12, message, auth)
    # Without a create event the rules cannot pass.
    with pytest.raises(AuthError):
        check_auth_events(ROOM_V12, message, [room.events[i] for i in message.auth_event_ids])
    # Version 11 has no such rule: the same state lets the event through.
    check_against_state(ROOM_V11, message, state)


def test_creators_are_above_every_power_level():
    room = Room(create_content={"additional_creators": [BOB]})
    room.public_with_members(BOB, CAROL, levels={CAROL: 100})
    for creator in (ALICE, BOB):
        assert user_power_level(ROOM_V12, creator, room.state) == CREATOR_POWER_LEVEL
    assert user_power_level(ROOM_V12, CAROL, room.state) == 100
    # Under v11 an unlisted creator has the users_default, and an additional creator is no one.
    assert user_power_level(ROOM_V11, ALICE, room.state) == 0
    assert user_power_level(ROOM_V11, BOB, room.state) == 0
    # A 100 admin can neither kick nor ban a creator, nor take their level away.
    assert "kick" in room.refused(CAROL, "m.room.member", {"membership": "leave"}, ALICE)
    assert "ban" in room.refused(CAROL, "m.room.member", {"membership": "ban"}, BOB)
    # Two creators are equal: neither can kick the other.
    assert "kick" in room.refused(ALICE, "m.room.member", {"membership": "leave"}, BOB)
    # A creator outranks any listed level: kicks the 100 admin, sets levels up to 2**53 - 1.
    room.send(ALICE, "m.room.power_levels", {"users": {CAROL: 2**53 - 1}, "kick": 2**53 - 1}, "")
    room.send(BOB, "m.room.member", {"membership": "leave"}, CAROL)


@pytest.mark.parametrize("creator", [ALICE, BOB])
def test_power_levels_may_not_list_a_creator(creator):
    room = Room(create_content={"additional_creators": [BOB]})
    assert "creators" in room.refused(ALICE, "m.room.power_levels", {"users": {creator: 100}}, "")
    # v11: the creator's own 100 is what power levels normally say.
    v11 = Room(ROOM_V11, create_content={"additional_creators": [BOB]})
    v11.send(ALICE, "m.room.power_levels", {"users": {creator: 100, ALICE: 100}}, "")


def test_without_power_levels_creators_are_infinite_and_others_zero():
    room = Room(create_content={"additional_creators": [BOB]})
    assert user_power_level(ROOM_V12, ALICE, room.state) == CREATOR_POWER_LEVEL
    assert user_power_level(ROOM_V12, BOB, room.state) == CREATOR_POWER_LEVEL
    assert user_power_level(ROOM_V12, CAROL, room.state) == 0
    assert user_power_level(ROOM_V11, ALICE, Room(ROOM_V11).state) == 100


def test_an_additional_creator_joins_like_anyone_else():
    # Only the create event's sender has the first-join exception; an additional creator
    # still needs the join rules to let them in.
    room = Room(create_content={"additional_creators": [BOB]})
    room.send(ALICE, "m.room.join_rules", {"join_rule": "invite"}, "")
    assert "not invited" in room.refused(BOB, "m.room.member", {"membership": "join"}, BOB)
    room.send(ALICE, "m.room.member", {"membership": "invite"}, BOB)
    room.send(BOB, "m.room.member", {"membership": "join"}, BOB)
    # Once in, an additional creator has a creator's power.
    room.send(BOB, "m.room.member", {"membership": "ban"}, DAVE)


def test_format_of_room_ids_by_version():
    room = Room()
    message = room.send(ALICE, "m.room.message", {"body": "hi"})
    # A v12 event must name its room by hash; a v11 event by `!localpart:server`.
    with pytest.raises(InvalidEvent, match="room ID"):
        check_pdu_format(ROOM_V12, Event(message.event_id, {**message.pdu, "room_id": "!a:hs"}))
    with pytest.raises(InvalidEvent, match="room ID"):
        check_pdu_format(ROOM_V11, message)
    with pytest.raises(InvalidEvent):
        check_pdu_format(ROOM_V12, Event(message.event_id, {**message.pdu, "room_id": "!short"}))
    bare = {k: v for k, v in message.pdu.items() if k != "room_id"}
    with pytest.raises(InvalidEvent):
        check_pdu_format(ROOM_V12, Event(message.event_id, bare))
