"""`POST /rooms/{roomId}/upgrade` on the real server (SQLite and PostgreSQL): the new room
names its predecessor and takes over the old room's state, bans, aliases and directory
listing; the old room gets its tombstone, which a member's /sync shows, and its ordinary
members lose their voice; refusals are the spec's."""

import itertools
import time
from urllib.parse import quote

import pytest

from tests.rooms.conftest import V3, alias_path, create_room, send
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync

UPGRADE = "/_matrix/client/v3/rooms/{roomId}/upgrade"
COPIED = (
    "m.room.join_rules",
    "m.room.name",
    "m.room.topic",
    "m.room.history_visibility",
    "m.room.guest_access",
    "m.room.avatar",
    "m.room.encryption",
    "m.room.server_acl",
)
_names = itertools.count()


def upgrade(client, room_id: str, version: str, status: int = 200, **body) -> dict:
    r = client.post(f"{V3}/rooms/{room_id}/upgrade", json={"new_version": version, **body})
    assert r.status_code == status, r.text
    assert_matches_spec(r, "POST", UPGRADE)
    return r.json()


def state(client, room_id: str, event_type: str, state_key: str = "", status: int = 200):
    r = client.get(f"{V3}/rooms/{room_id}/state/{event_type}/{quote(state_key, safe='')}")
    assert r.status_code == status, r.text
    return r.json()


def state_event(client, room_id: str, event_type: str) -> dict:
    r = client.get(f"{V3}/rooms/{room_id}/state")
    assert r.status_code == 200, r.text
    return next(e for e in r.json() if e["type"] == event_type and e["state_key"] == "")


def join(client, room_id: str) -> None:
    r = client.post(f"{V3}/join/{quote(room_id, safe='')}", json={})
    assert r.status_code == 200, r.text


def refused(response, status: int, errcode: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["errcode"] == errcode


def wait_for_tombstone(client, room_id: str, since: str, within: float = 10) -> dict:
    """Long-polls the member's /sync until the room's timeline shows its tombstone."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        body = sync(client, since=since, timeout=int(max(0, deadline - time.monotonic()) * 1000))
        events = body["rooms"].get("join", {}).get(room_id, {}).get("timeline", {}).get("events")
        for event in events or []:
            if event["type"] == "m.room.tombstone":
                return event
        since = body["next_batch"]
    raise AssertionError(f"no tombstone in {room_id}'s /sync within {within} s")


def furnished_room(server, user, version: str):
    """alice's public room of `version`, with every copied state key, two of our aliases
    (one canonical, one alt) and another server's, bob at level 0, carol banned."""
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    name = f"upgraded{next(_names)}"
    room_id = create_room(
        alice,
        room_version=version,
        preset="public_chat",
        visibility="public",
        room_alias_name=name,
        name="Old name",
        topic="Old topic",
        power_level_content_override={"events": {"m.room.name": 75}, "users_default": 0},
        initial_state=[
            {"type": "m.room.avatar", "content": {"url": "mxc://weir.test/avatar"}},
            {"type": "m.room.encryption", "content": {"algorithm": "m.megolm.v1.aes-sha2"}},
            {"type": "m.room.guest_access", "content": {"guest_access": "can_join"}},
            {"type": "m.room.history_visibility", "content": {"history_visibility": "joined"}},
            {
                "type": "m.room.server_acl",
                "content": {"allow": ["*"], "deny": ["evil.example"], "allow_ip_literals": True},
            },
        ],
    )
    alias, alt = f"#{name}:weir.test", f"#{name}-alt:weir.test"
    r = alice.put(alias_path(alt), json={"room_id": room_id})
    assert r.status_code == 200, r.text
    canonical = {"alias": alias, "alt_aliases": [alt, "#theirs:elsewhere.example"]}
    r = alice.put(f"{V3}/rooms/{room_id}/state/m.room.canonical_alias/", json=canonical)
    assert r.status_code == 200, r.text
    join(bob, room_id)
    join(carol, room_id)
    r = alice.post(f"{V3}/rooms/{room_id}/ban", json={"user_id": carol.user_id, "reason": "spam"})
    assert r.status_code == 200, r.text
    return alice, bob, carol, room_id, alias, alt


# (old, new): before 12 the tombstone is built first and the create event names it; into 12
# the new room comes first; and out of 12, a creator keeps a top level as a number.
@pytest.mark.parametrize("versions", [("10", "11"), ("11", "12"), ("12", "12"), ("12", "10")])
def test_the_new_room_takes_over_state_bans_aliases_and_listing(server, user, versions):
    old_version, new_version = versions
    alice, bob, carol, old, alias, alt = furnished_room(server, user, old_version)
    old_state = {t: state(alice, old, t) for t in COPIED}
    old_levels = state(alice, old, "m.room.power_levels")
    since = sync(bob)["next_batch"]

    new = upgrade(alice, old, new_version)["replacement_room"]
    assert new != old

    # The create event: the version, the upgrader as its sender, the predecessor.
    create = state_event(alice, new, "m.room.create")
    assert create["sender"] == alice.user_id
    assert create["content"]["room_version"] == new_version
    tombstone = state_event(alice, old, "m.room.tombstone")
    predecessor = {"room_id": old}
    if new_version != "12":
        predecessor["event_id"] = tombstone["event_id"]
    assert create["content"]["predecessor"] == predecessor

    # Each copied key, as it was; the power levels the old room's once set up.
    for event_type in COPIED:
        assert state(alice, new, event_type) == old_state[event_type], event_type
    new_levels = state(alice, new, "m.room.power_levels")
    if new_version == "12":  # creators are above every level and may not be listed
        assert alice.user_id not in new_levels["users"]
        assert new_levels == {**old_levels, "users": {}}
    elif old_version == "12":  # a creator's infinite level, as the most any event needs
        assert new_levels == {**old_levels, "users": {alice.user_id: 100}}
    else:
        assert new_levels == old_levels

    # Bans come along, reasons and all; members do not.
    assert state(alice, new, "m.room.member", carol.user_id) == {
        "membership": "ban",
        "reason": "spam",
    }
    refused(carol.post(f"{V3}/join/{quote(new, safe='')}", json={}), 403, "M_FORBIDDEN")
    state(alice, new, "m.room.member", bob.user_id, status=404)

    # Our aliases and the listing point at the new room; the other server's alias stays.
    for name in (alias, alt):
        assert alice.get(alias_path(name)).json()["room_id"] == new
    assert state(alice, new, "m.room.canonical_alias") == {"alias": alias, "alt_aliases": [alt]}
    assert state(alice, old, "m.room.canonical_alias") == {
        "alt_aliases": ["#theirs:elsewhere.example"]
    }
    assert alice.get(f"{V3}/directory/list/room/{new}").json() == {"visibility": "public"}
    assert alice.get(f"{V3}/directory/list/room/{old}").json() == {"visibility": "private"}
    listed = [r["room_id"] for r in alice.get(f"{V3}/publicRooms").json()["chunk"]]
    assert new in listed and old not in listed

    # The tombstone, in bob's /sync; he may no longer talk in the old room, but joins the new.
    assert tombstone["content"] == {"body": "This room has been replaced", "replacement_room": new}
    seen = wait_for_tombstone(bob, old, since)
    assert seen["event_id"] == tombstone["event_id"]
    restricted = state(alice, old, "m.room.power_levels")
    assert restricted == {**old_levels, "events_default": 50, "invite": 50}
    r = bob.put(
        f"{V3}/rooms/{old}/send/m.room.message/late", json={"msgtype": "m.text", "body": "hi"}
    )
    refused(r, 403, "M_FORBIDDEN")
    join(bob, new)
    send(bob, new, "hello in the new room")


def test_refusals(server, user):
    alice, bob, outsider = user("alice"), user("bob"), user("outsider")
    room = create_room(alice, preset="public_chat")
    join(bob, room)
    before = alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]

    r = alice.post(f"{V3}/rooms/{room}/upgrade", json={"new_version": "99"})
    refused(r, 400, "M_UNSUPPORTED_ROOM_VERSION")
    assert_matches_spec(r, "POST", UPGRADE)
    refused(bob.post(f"{V3}/rooms/{room}/upgrade", json={"new_version": "12"}), 403, "M_FORBIDDEN")
    r = outsider.post(f"{V3}/rooms/{room}/upgrade", json={"new_version": "12"})
    refused(r, 404, "M_NOT_FOUND")
    r = alice.post(f"{V3}/rooms/!nowhere:weir.test/upgrade", json={"new_version": "12"})
    refused(r, 404, "M_NOT_FOUND")
    refused(alice.post(f"{V3}/rooms/{room}/upgrade", json={}), 400, "M_MISSING_PARAM")
    r = alice.post(
        f"{V3}/rooms/{room}/upgrade",
        json={"new_version": "12", "additional_creators": ["not a user"]},
    )
    refused(r, 400, "M_INVALID_PARAM")

    # Nothing was made, and the room goes on as before.
    assert alice.get(f"{V3}/joined_rooms").json()["joined_rooms"] == before
    state(alice, room, "m.room.tombstone", status=404)
    send(bob, room, "still talking")


def test_a_member_who_may_send_the_tombstone_may_upgrade(server, user):
    """The tombstone's level decides, not being the creator: bob, given it, upgrades; the
    old room's levels are raised above a high users_default."""
    alice, bob = user("alice"), user("bob")
    room = create_room(
        alice,
        room_version="11",
        preset="private_chat",
        invite=[bob.user_id],
        power_level_content_override={
            "users": {alice.user_id: 100, bob.user_id: 100},
            "users_default": 60,
        },
    )
    join(bob, room)
    new = upgrade(bob, room, "11")["replacement_room"]
    levels = state(bob, room, "m.room.power_levels")
    assert levels["events_default"] == levels["invite"] == 61
    assert state_event(bob, new, "m.room.create")["sender"] == bob.user_id
    # A private room stays invite-only: alice needs an invite to follow.
    refused(alice.post(f"{V3}/join/{quote(new, safe='')}", json={}), 403, "M_FORBIDDEN")


def test_a_space_into_12_keeps_its_children_and_names_more_creators(server, user):
    alice, bob = user("alice"), user("bob")
    child = create_room(alice)
    space = create_room(
        alice,
        room_version="12",
        creation_content={"type": "m.space"},
        power_level_content_override={"users": {bob.user_id: 50}},
    )
    for key, content in ((child, {"via": ["weir.test"]}), ("!gone:weir.test", {})):
        r = alice.put(f"{V3}/rooms/{space}/state/m.space.child/{key}", json=content)
        assert r.status_code == 200, r.text

    new = upgrade(alice, space, "12", additional_creators=[bob.user_id])["replacement_room"]
    create = state_event(alice, new, "m.room.create")["content"]
    assert create["type"] == "m.space"
    assert create["additional_creators"] == [bob.user_id]
    assert state(alice, new, "m.room.power_levels")["users"] == {}
    assert state(alice, new, "m.space.child", child) == {"via": ["weir.test"]}
    state(alice, new, "m.space.child", "!gone:weir.test", status=404)


def test_text_power_levels_of_an_old_version_become_numbers(server, user):
    """Room version 1 allowed levels as text; version 10 refuses them, so the copy holds
    their numbers."""
    alice = user("alice")
    room = create_room(
        alice, room_version="1", power_level_content_override={"ban": "60", "kick": " 40 "}
    )
    new = upgrade(alice, room, "10")["replacement_room"]
    levels = state(alice, new, "m.room.power_levels")
    assert levels["ban"] == 60 and levels["kick"] == 40
    assert state_event(alice, new, "m.room.create")["content"]["creator"] == alice.user_id
