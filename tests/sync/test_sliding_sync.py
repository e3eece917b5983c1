"""Simplified sliding sync (MSC4186) on the real server, SQLite and PostgreSQL: lists by
recency with counts, a long-poll woken by a message, room subscriptions, invites, lazy
members, unknown positions, each extension, and a connection that outlives a restart of
its cache."""

import threading

import pytest

from tests.rooms.conftest import V3, create_room, send
from tests.rooms.test_relations_api import q

SLIDING = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
ALL_STATE = [["*", "*"]]


def slide(client, body: dict, pos=None, timeout=0, status=200) -> dict:
    params = {"timeout": timeout}
    if pos is not None:
        params["pos"] = pos
    r = client.post(SLIDING, json=body, params=params, timeout=30 + timeout / 1000)
    assert r.status_code == status, r.text
    return r.json()


def room_list(ranges, timeline_limit=1, required_state=None, **filters) -> dict:
    return {
        "ranges": ranges,
        "timeline_limit": timeline_limit,
        "required_state": required_state or [["m.room.name", ""]],
        "filters": filters,
    }


def join(client, room_id: str) -> None:
    r = client.post(f"{V3}/join/{q(room_id)}", json={})
    assert r.status_code == 200, r.text


def test_versions_advertise_it(user):
    r = user("v").get("/_matrix/client/versions")
    assert r.json()["unstable_features"]["org.matrix.simplified_msc3575"] is True


def test_lists_the_ten_most_recent_of_thirty_rooms_in_order(user):
    alice = user("alice")
    rooms = [create_room(alice, name=f"room {i}") for i in range(30)]
    # Bring every third room to the top again, oldest of them first.
    for i in range(0, 30, 3):
        send(alice, rooms[i], f"bump {i}")
    recency = [rooms[i] for i in range(27, -1, -3)] + [
        r for r in reversed(rooms) if rooms.index(r) % 3
    ]
    body = slide(alice, {"lists": {"all": room_list([[0, 9]])}})
    assert body["lists"]["all"]["count"] == 30
    got = sorted(body["rooms"], key=lambda r: -body["rooms"][r]["bump_stamp"])
    assert got == recency[:10]
    for room_id in got:
        entry = body["rooms"][room_id]
        assert entry["name"] == f"room {rooms.index(room_id)}"
        assert entry["initial"] is True
        assert entry["lists"] == ["all"]
        assert entry["joined_count"] == 1
        assert len(entry["timeline"]) == 1
        assert entry["required_state"][0]["type"] == "m.room.name"
    # The next ten: only those not sent yet.
    more = slide(alice, {"lists": {"all": room_list([[0, 19]])}}, pos=body["pos"])
    assert sorted(more["rooms"]) == sorted(recency[10:20])


def test_a_message_wakes_the_long_poll_and_moves_its_room_to_the_top(user):
    alice = user("alice")
    rooms = [create_room(alice, name=f"r{i}") for i in range(5)]
    request = {"lists": {"top": room_list([[0, 1]])}}
    body = slide(alice, request)
    assert set(body["rooms"]) == {rooms[4], rooms[3]}
    results: dict = {}

    def wait():
        results["body"] = slide(alice, request, pos=body["pos"], timeout=20_000)

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(0.5)  # the long-poll parks: nothing has happened yet
    assert waiter.is_alive()
    event_id = send(alice, rooms[0], "back to the top")
    waiter.join(20)
    assert not waiter.is_alive()
    woken = results["body"]
    assert list(woken["rooms"]) == [rooms[0]]
    entry = woken["rooms"][rooms[0]]
    assert entry["initial"] is True  # never sent on this connection before
    assert [e["event_id"] for e in entry["timeline"]] == [event_id]
    assert entry["num_live"] == 1
    # A message in a room already sent: only what is new.
    second = send(alice, rooms[0], "and again")
    again = slide(alice, request, pos=woken["pos"])
    entry = again["rooms"][rooms[0]]
    assert "initial" not in entry and [e["event_id"] for e in entry["timeline"]] == [second]
    assert entry["limited"] is False and entry["num_live"] == 1


def test_a_subscription_carries_twenty_timeline_events(user):
    alice = user("alice")
    room = create_room(alice, name="busy")
    sent = [send(alice, room, f"message {i}") for i in range(25)]
    body = slide(
        alice,
        {"room_subscriptions": {room: {"timeline_limit": 20, "required_state": ALL_STATE}}},
    )
    entry = body["rooms"][room]
    assert [e["event_id"] for e in entry["timeline"]] == sent[-20:]
    assert entry["limited"] is True and entry["prev_batch"]
    assert "lists" not in entry
    types = {e["type"] for e in entry["required_state"]}
    assert {"m.room.create", "m.room.member", "m.room.name", "m.room.power_levels"} <= types
    r = alice.get(
        f"{V3}/rooms/{q(room)}/messages", params={"from": entry["prev_batch"], "dir": "b"}
    )
    assert r.status_code == 200 and r.json()["chunk"][0]["event_id"] == sent[4]
    # Sticky: the next request need not repeat it to hear of the room.
    newer = send(alice, room, "later")
    later = slide(alice, {}, pos=body["pos"])
    assert [e["event_id"] for e in later["rooms"][room]["timeline"]] == [newer]
    # Unsubscribed, the room is no longer sent.
    gone = slide(alice, {"unsubscribe_rooms": [room]}, pos=later["pos"])
    send(alice, room, "unheard")
    assert slide(alice, {}, pos=gone["pos"])["rooms"] == {}


def test_an_invite_carries_its_stripped_state(user):
    alice, bob = user("alice"), user("bob")
    room = create_room(alice, name="Secret garden")
    r = alice.post(f"{V3}/rooms/{q(room)}/invite", json={"user_id": bob.user_id})
    assert r.status_code == 200, r.text
    create_room(bob, name="bob's own")
    body = slide(bob, {"lists": {"invites": room_list([[0, 9]], is_invite=True)}})
    assert body["lists"]["invites"]["count"] == 1
    entry = body["rooms"][room]
    assert entry["membership"] == "invite" and entry["name"] == "Secret garden"
    stripped = {(e["type"], e["state_key"]) for e in entry["invite_state"]}
    assert ("m.room.name", "") in stripped and ("m.room.member", bob.user_id) in stripped
    assert entry["stripped_state"] == entry["invite_state"]


def test_lazy_members_are_the_timelines_senders(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = create_room(alice, preset="public_chat")
    join(bob, room)
    join(carol, room)
    send(bob, room, "bob speaks")
    wanted = [["m.room.member", "$LAZY"], ["m.room.create", ""], ["m.room.member", "$ME"]]
    body = slide(
        alice,
        {"room_subscriptions": {room: {"timeline_limit": 1, "required_state": wanted}}},
    )
    members = {
        e["state_key"]
        for e in body["rooms"][room]["required_state"]
        if e["type"] == "m.room.member"
    }
    assert members == {bob.user_id, alice.user_id}  # not carol: she sent nothing shown


def test_an_unknown_pos_is_refused_so_the_client_starts_over(user):
    alice, bob = user("alice"), user("bob")
    create_room(alice)
    body = slide(alice, {"lists": {"all": room_list([[0, 9]])}})
    for pos in ("nonsense", "999999.1." + body["pos"].split(".", 2)[2], body["pos"] + "x"):
        r = slide(alice, {}, pos=pos, status=400)
        assert r["errcode"] == "M_UNKNOWN_POS"
    # Another user's pos is unknown to them, as is a pos past what was given.
    assert slide(bob, {}, pos=body["pos"], status=400)["errcode"] == "M_UNKNOWN_POS"
    connection, generation, token = body["pos"].split(".", 2)
    ahead = f"{connection}.{int(generation) + 5}.{token}"
    assert slide(alice, {}, pos=ahead, status=400)["errcode"] == "M_UNKNOWN_POS"
    # A new connection of the same name replaces the old one.
    slide(alice, {"lists": {"all": room_list([[0, 9]])}})
    assert slide(alice, {}, pos=body["pos"], status=400)["errcode"] == "M_UNKNOWN_POS"
    slide(alice, {"lists": "nope"}, status=400)


@pytest.mark.parametrize("retry", [False, True])
def test_a_retried_pos_is_answered_again(user, retry):
    alice = user("alice")
    room = create_room(alice, name="retry")
    body = slide(alice, {})
    first = slide(alice, {"lists": {"all": room_list([[0, 0]])}}, pos=body["pos"])
    assert room in first["rooms"]
    # The answer was lost: the same pos again sends the room again.
    again = slide(alice, {"lists": {"all": room_list([[0, 0]])}}, pos=body["pos"])
    assert room in again["rooms"] and again["rooms"][room]["initial"] is True
    nothing = slide(alice, {"lists": {"all": room_list([[0, 0]])}}, pos=again["pos"])
    assert nothing["rooms"] == {}
