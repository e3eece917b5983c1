"""Room tags over HTTP against a real server: set and removed a tag at a time, read back, and
shown in /sync as the room's m.tag account data, a waiting sync woken by the change."""

import gevent

from tests.rooms.conftest import V3, create_room
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import metric, sync
from tests.sync.test_sync_api import wait_until

TAGS = "/_matrix/client/v3/user/{userId}/rooms/{roomId}/tags"


def tags_url(client, room_id: str, tag: str | None = None) -> str:
    url = f"{V3}/user/{client.user_id}/rooms/{room_id}/tags"
    return url if tag is None else f"{url}/{tag}"


def room_account_data(body: dict, room_id: str) -> list[dict]:
    room = body["rooms"]["join"].get(room_id)
    return room["account_data"]["events"] if room else []


def refused(response, status: int, errcode: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["errcode"] == errcode


def test_tags_are_set_read_and_removed(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    r = alice.get(tags_url(alice, room_id))
    assert r.status_code == 200 and r.json() == {"tags": {}}

    r = alice.put(tags_url(alice, room_id, "m.favourite"), json={"order": 0.25})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "put", TAGS + "/{tag}")
    assert alice.put(tags_url(alice, room_id, "u.work"), json={}).status_code == 200
    r = alice.get(tags_url(alice, room_id))
    assert_matches_spec(r, "get", TAGS)
    assert r.json() == {"tags": {"m.favourite": {"order": 0.25}, "u.work": {}}}
    # The same tags as the room's m.tag account data.
    r = alice.get(f"{V3}/user/{alice.user_id}/rooms/{room_id}/account_data/m.tag")
    assert r.json() == {"tags": {"m.favourite": {"order": 0.25}, "u.work": {}}}

    r = alice.delete(tags_url(alice, room_id, "u.work"))
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "delete", TAGS + "/{tag}")
    assert alice.delete(tags_url(alice, room_id, "u.never")).status_code == 200
    assert alice.get(tags_url(alice, room_id)).json() == {"tags": {"m.favourite": {"order": 0.25}}}


def test_tag_refusals(server, user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice)
    # Only one's own tags.
    refused(bob.get(tags_url(alice, room_id)), 403, "M_FORBIDDEN")
    refused(bob.put(tags_url(alice, room_id, "u.x"), json={}), 403, "M_FORBIDDEN")
    refused(bob.delete(tags_url(alice, room_id, "u.x")), 403, "M_FORBIDDEN")
    # Only in a room one has a membership in.
    refused(bob.put(tags_url(bob, room_id, "u.x"), json={}), 403, "M_FORBIDDEN")
    # A tag is at most 255 bytes; order is a number.
    refused(alice.put(tags_url(alice, room_id, "u" + "x" * 255), json={}), 400, "M_INVALID_PARAM")
    refused(alice.put(tags_url(alice, room_id, "u.x"), json={"order": "1"}), 400, "M_BAD_JSON")
    refused(alice.put(tags_url(alice, room_id, "u.x"), json={"order": True}), 400, "M_BAD_JSON")
    refused(alice.put(tags_url(alice, room_id, "u.x"), json=[1]), 400, "M_NOT_JSON")
    refused(alice.get(tags_url(alice, "not-a-room")), 400, "M_INVALID_PARAM")
    # m.tag written whole through account data (as Synapse allows), even a malformed one,
    # is what the tags API reads and changes.
    data = f"{V3}/user/{alice.user_id}/rooms/{room_id}/account_data/m.tag"
    assert alice.put(data, json={"tags": {"u.whole": {}}}).status_code == 200
    assert alice.get(tags_url(alice, room_id)).json() == {"tags": {"u.whole": {}}}
    assert alice.put(data, json={"tags": ["not", "a", "map"]}).status_code == 200
    assert alice.get(tags_url(alice, room_id)).json() == {"tags": {}}
    assert alice.put(tags_url(alice, room_id, "u.x"), json={}).status_code == 200
    assert alice.get(data).json() == {"tags": {"u.x": {}}}


def test_tags_in_sync_and_a_waiting_sync_wakes(server, user):
    alice = user("alice")
    room_id = create_room(alice)
    assert alice.put(tags_url(alice, room_id, "m.lowpriority"), json={}).status_code == 200
    first = sync(alice)
    assert room_account_data(first, room_id) == [
        {"type": "m.tag", "content": {"tags": {"m.lowpriority": {}}}}
    ]

    waiting = gevent.spawn(sync, alice, first["next_batch"], timeout=60_000)
    wait_until(lambda: metric(server, "weir_sync_waiters") >= 1)
    assert alice.put(tags_url(alice, room_id, "m.favourite"), json={"order": 1}).status_code == 200
    woken = waiting.get(timeout=30)
    assert room_account_data(woken, room_id) == [
        {"type": "m.tag", "content": {"tags": {"m.lowpriority": {}, "m.favourite": {"order": 1}}}}
    ]

    assert alice.delete(tags_url(alice, room_id, "m.lowpriority")).status_code == 200
    after = sync(alice, woken["next_batch"])
    assert room_account_data(after, room_id) == [
        {"type": "m.tag", "content": {"tags": {"m.favourite": {"order": 1}}}}
    ]
    # Removing a tag that is not there changes nothing, and a sync sees nothing new.
    assert alice.delete(tags_url(alice, room_id, "m.lowpriority")).status_code == 200
    assert sync(alice, after["next_batch"])["next_batch"] == after["next_batch"]
