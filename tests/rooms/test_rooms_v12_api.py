"""A room version 12 room over HTTP against a real server: created, named by its create
event's hash, and used like any other room (send, state, membership, power levels, /sync,
/messages, aliases, the public list), with its creator above every power level."""

from urllib.parse import quote

from homeserver.core.events import Event
from homeserver.core.identifiers import is_hash_room_id
from homeserver.rooms.events import check_pdu_format, event_id_for
from homeserver.rooms.versions import ROOM_V12
from tests.rooms.conftest import V3, alias_path, create_room, send, stored_pdus
from tests.support.spec import assert_matches_spec


def test_a_v12_room_is_named_by_its_create_event_and_works(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    local = f"v12room{alice.user_id[1:].split(':')[0]}"
    r = alice.post(
        f"{V3}/createRoom",
        json={
            "room_version": "12",
            "preset": "public_chat",
            "visibility": "public",
            "room_alias_name": local,
            "name": "Twelve",
        },
    )
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/createRoom")
    room_id = r.json()["room_id"]
    assert is_hash_room_id(room_id)

    # What was stored: a create event without room_id whose ID is the room ID, and events
    # that name the room by it and never list the create event; every ID a reference hash.
    pdus = stored_pdus(server, room_id)
    (create_id, create), *rest = pdus
    assert create["type"] == "m.room.create" and "room_id" not in create
    assert room_id == "!" + create_id[1:]
    for event_id, pdu in pdus:
        assert event_id_for(ROOM_V12, pdu) == event_id
        check_pdu_format(ROOM_V12, Event(event_id, pdu))
    for _, pdu in rest:
        assert pdu["room_id"] == room_id and create_id not in pdu["auth_events"]

    # Clients see the create event with the room ID; no creator in content or power levels.
    state = alice.get(f"{V3}/rooms/{room_id}/state").json()
    by_type = {e["type"]: e for e in state}
    assert by_type["m.room.create"]["room_id"] == room_id
    assert by_type["m.room.create"]["content"] == {"room_version": "12"}
    levels = by_type["m.room.power_levels"]["content"]
    assert levels["users"] == {} and levels["events"]["m.room.tombstone"] == 150

    # The alias and the public list lead to it; others join by ID.
    assert alice.get(alias_path(f"#{local}:weir.test")).json()["room_id"] == room_id
    rooms = alice.get(f"{V3}/publicRooms", params={"limit": 500}).json()["chunk"]
    assert room_id in {entry["room_id"] for entry in rooms}
    for member in (bob, carol):
        joined = member.post(f"{V3}/join/{quote(room_id)}", json={})
        assert joined.status_code == 200 and joined.json() == {"room_id": room_id}

    # /sync and /messages carry the room's events.
    message_id = send(bob, room_id, "hello twelve")
    synced = carol.get(f"{V3}/sync").json()["rooms"]["join"][room_id]
    assert any(e["event_id"] == message_id for e in synced["timeline"]["events"])
    chunk = carol.get(f"{V3}/rooms/{room_id}/messages", params={"dir": "b"}).json()["chunk"]
    assert chunk[0]["event_id"] == message_id

    # Carol made admin at 100 can kick Bob, but not touch Alice, the creator.
    ok = alice.put(
        f"{V3}/rooms/{room_id}/state/m.room.power_levels",
        json={**levels, "users": {carol.user_id: 100}},
    )
    assert ok.status_code == 200, ok.text
    kick = carol.post(f"{V3}/rooms/{room_id}/kick", json={"user_id": alice.user_id})
    ban = carol.put(
        f"{V3}/rooms/{room_id}/state/m.room.member/{quote(alice.user_id)}",
        json={"membership": "ban"},
    )
    for refused in (kick, ban):
        assert (refused.status_code, refused.json()["errcode"]) == (403, "M_FORBIDDEN")
    demote = carol.put(
        f"{V3}/rooms/{room_id}/state/m.room.power_levels",
        json={**levels, "users": {carol.user_id: 100, alice.user_id: 50}},
    )
    assert (demote.status_code, demote.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert (
        carol.post(f"{V3}/rooms/{room_id}/kick", json={"user_id": bob.user_id}).status_code == 200
    )


def test_v12_creation_options(server, user):
    alice, bob = user("alice"), user("bob")
    # A trusted private chat's invitees become additional creators, not 100s in power levels.
    room_id = create_room(
        alice, room_version="12", preset="trusted_private_chat", invite=[bob.user_id]
    )
    create = alice.get(f"{V3}/rooms/{room_id}/state/m.room.create").json()
    assert create == {"room_version": "12", "additional_creators": [bob.user_id]}
    levels = alice.get(f"{V3}/rooms/{room_id}/state/m.room.power_levels").json()
    assert levels["users"] == {}

    # Power levels that list the creator are refused, as the v12 rules refuse them.
    r = alice.post(
        f"{V3}/createRoom",
        json={
            "room_version": "12",
            "power_level_content_override": {"users": {alice.user_id: 100}},
        },
    )
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_ROOM_STATE")
    r = alice.post(
        f"{V3}/createRoom",
        json={"room_version": "12", "creation_content": {"additional_creators": ["nobody"]}},
    )
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_ROOM_STATE")

    # Two rooms from identical requests get two IDs.
    twins = {create_room(alice, room_version="12") for _ in range(2)}
    assert len(twins) == 2

    # An unknown v12 room names no server: without `via` there is nobody to ask.
    unknown = "!" + "A" * 43
    r = alice.post(f"{V3}/join/{quote(unknown)}", json={})
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    assert "via" in r.json()["error"]
