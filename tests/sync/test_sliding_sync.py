"""Simplified sliding sync (MSC4186) on the real server, SQLite and PostgreSQL: lists by
recency with counts, a long-poll woken by a message, room subscriptions, invites, lazy
members, unknown positions, each extension, and a connection that outlives a restart of
its cache."""

import re
import threading

import pytest
import requests

from tests.e2ee.conftest import device  # noqa: F401 - fixture
from tests.rooms.conftest import V3, create_room, send
from tests.rooms.test_relations_api import q
from tests.sync.conftest import metric
from tests.sync.test_waiting import wait_until

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


def test_a_message_wakes_the_long_poll_and_moves_its_room_to_the_top(server, user):
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
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)  # parked
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


def test_a_longer_timeline_sends_the_room_again(user):
    """Opening a room (a subscription with more events than its list's one) sends it again
    with the longer timeline, marked expanded, without waiting for news."""
    alice = user("alice")
    room = create_room(alice, name="opened")
    sent = [send(alice, room, f"m{i}") for i in range(6)]
    body = slide(alice, {"lists": {"all": room_list([[0, 9]])}})
    assert [e["event_id"] for e in body["rooms"][room]["timeline"]] == sent[-1:]
    subscription = {room: {"timeline_limit": 5, "required_state": []}}
    opened = slide(
        alice,
        {"lists": {"all": room_list([[0, 9]])}, "room_subscriptions": subscription},
        pos=body["pos"],
        timeout=10_000,
    )
    entry = opened["rooms"][room]
    assert [e["event_id"] for e in entry["timeline"]] == sent[-5:]
    assert entry["initial"] is True and entry["expanded_timeline"] is True


def test_unread_counts_come_from_the_push_rules(user):
    """Two messages from bob notify alice, a mention highlights, and her read receipt
    clears both, as /sync's unread_notifications do (sync/notifications.py)."""
    alice, bob = user("alice"), user("bob")
    room = create_room(alice, preset="public_chat")
    join(bob, room)
    request = {"lists": {"all": room_list([[0, 0]])}}
    body = slide(alice, request)
    assert (body["rooms"][room]["notification_count"], body["rooms"][room]["highlight_count"]) == (
        0,
        0,
    )
    send(bob, room, "one")
    send(bob, room, "two")
    r = bob.put(
        f"{V3}/rooms/{q(room)}/send/m.room.message/mention",
        json={"msgtype": "m.text", "body": "alice!", "m.mentions": {"user_ids": [alice.user_id]}},
    )
    assert r.status_code == 200, r.text
    body = slide(alice, request, pos=body["pos"])
    entry = body["rooms"][room]
    assert (entry["notification_count"], entry["highlight_count"]) == (3, 1)
    r = alice.post(f"{V3}/rooms/{q(room)}/receipt/m.read/{q(r.json()['event_id'])}", json={})
    assert r.status_code == 200, r.text
    send(alice, room, "read them")  # her own message: it notifies nobody, and moves the room
    body = slide(alice, request, pos=body["pos"])
    entry = body["rooms"][room]
    assert (entry["notification_count"], entry["highlight_count"]) == (0, 0)


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
    # The MSC's final form of the same: everything but members, and the lazy ones.
    final = {"include": [{}], "exclude": [{"type": "m.room.member"}], "lazy_members": True}
    body = slide(
        alice, {"room_subscriptions": {room: {"timeline_limit": 1, "required_state": final}}}
    )
    state = body["rooms"][room]["required_state"]
    assert {e["state_key"] for e in state if e["type"] == "m.room.member"} == {bob.user_id}
    assert {"m.room.create", "m.room.power_levels", "m.room.join_rules"} <= {
        e["type"] for e in state
    }


def test_left_and_kicked_rooms(user):
    """A room left by one's own hand stays out of the lists unless the connection sent it;
    a kick is always listed; a subscription still reaches a room one has left."""
    alice, bob = user("alice"), user("bob")
    left, kicked, shown = (
        create_room(bob, preset="public_chat", name=n) for n in ("left", "kicked", "shown")
    )
    for room in (left, kicked, shown):
        join(alice, room)
    request = {"lists": {"all": room_list([[0, 9]], timeline_limit=2)}}
    before = slide(alice, request)
    assert before["lists"]["all"]["count"] == 3
    start = slide(alice, {"conn_id": "other"})["pos"]  # it has sent none of them
    assert alice.post(f"{V3}/rooms/{q(left)}/leave", json={}).status_code == 200
    r = bob.post(f"{V3}/rooms/{q(kicked)}/kick", json={"user_id": alice.user_id})
    assert r.status_code == 200, r.text
    assert alice.post(f"{V3}/rooms/{q(shown)}/leave", json={}).status_code == 200

    fresh = slide(alice, {**request, "conn_id": "other"}, pos=start)
    assert fresh["lists"]["all"]["count"] == 1 and list(fresh["rooms"]) == [kicked]
    assert fresh["rooms"][kicked]["membership"] == "leave"
    assert fresh["rooms"][kicked]["timeline"][-1]["content"]["membership"] == "leave"
    # The connection that sent `shown` is told of the leave, in the room's own entry.
    told = slide(alice, request, pos=before["pos"])
    assert set(told["rooms"]) == {kicked, left, shown}
    assert told["rooms"][shown]["membership"] == "leave"
    subscription = {left: {"timeline_limit": 1, "required_state": [["m.room.name", ""]]}}
    sub = slide(alice, {"room_subscriptions": subscription, "conn_id": "other"}, pos=fresh["pos"])
    assert sub["rooms"][left]["membership"] == "leave"
    assert sub["rooms"][left]["required_state"][0]["content"] == {"name": "left"}


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


def test_a_request_the_client_gave_up_on_writes_nothing(server, user):
    """The client left a parked request for a new one from the same pos: when the old one
    wakes, what it would have sent is not taken as sent."""
    alice, bob = user("alice"), user("bob")
    room = create_room(alice, name="seen by the second")
    start = slide(alice, {})["pos"]
    results: dict = {}

    def old_request():
        invites = {"invites": room_list([[0, 9]], is_invite=True)}
        results["old"] = slide(alice, {"lists": invites}, pos=start, timeout=20_000)

    waiter = threading.Thread(target=old_request)
    waiter.start()
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)  # parked
    newer = slide(alice, {"lists": {"all": room_list([[0, 9]])}}, pos=start)
    assert room in newer["rooms"]
    invite_room = create_room(bob, invite=[alice.user_id])  # wakes the old request
    waiter.join(20)
    assert not waiter.is_alive()
    assert results["old"]["pos"] == start  # answered, but nothing of it kept
    after = slide(alice, {"lists": {"all": room_list([[0, 9]])}}, pos=newer["pos"])
    assert list(after["rooms"]) == [invite_room]  # the first room is not sent again


EVERY_EXTENSION = {
    name: {"enabled": True} for name in ("to_device", "e2ee", "account_data", "receipts", "typing")
}


def test_extensions_each_carry_their_data(device):  # noqa: F811 - the fixture
    alice, bob = device("alice"), device("bob")
    room = create_room(alice.client, name="ext", preset="public_chat")
    join(bob.client, room)
    alice.upload(device_keys=alice.device_keys(), one_time_keys=alice.one_time_keys(3))
    request = {"lists": {"all": room_list([[0, 9]])}, "extensions": EVERY_EXTENSION}
    first = slide(alice.client, request)
    ext = first["extensions"]
    assert ext["e2ee"]["device_one_time_keys_count"]["signed_curve25519"] == 3
    assert ext["e2ee"]["device_unused_fallback_key_types"] == []
    assert ext["to_device"]["events"] == [] and ext["to_device"]["next_batch"]
    pushed = [e["type"] for e in ext["account_data"]["global"]]
    assert "m.push_rules" in pushed

    # Everything at once: a to-device message, a key change of bob's, account data global
    # and of the room, bob's receipt and typing.
    r = bob.client.put(
        f"{V3}/sendToDevice/m.room_key_request/t1",
        json={"messages": {alice.user_id: {alice.device_id: {"hello": "alice"}}}},
    )
    assert r.status_code == 200, r.text
    assert bob.upload(device_keys=bob.device_keys()).status_code == 200
    base = f"{V3}/user/{q(alice.user_id)}"
    r = alice.client.put(f"{base}/account_data/m.direct", json={bob.user_id: [room]})
    assert r.status_code == 200, r.text
    r = alice.client.put(f"{base}/rooms/{q(room)}/tags/u.work", json={"order": 0.5})
    assert r.status_code == 200, r.text
    event_id = send(alice.client, room, "read me")
    r = bob.client.post(f"{V3}/rooms/{q(room)}/receipt/m.read/{q(event_id)}", json={})
    assert r.status_code == 200, r.text
    r = bob.client.put(
        f"{V3}/rooms/{q(room)}/typing/{q(bob.user_id)}", json={"typing": True, "timeout": 30000}
    )
    assert r.status_code == 200, r.text

    request["extensions"]["to_device"]["since"] = ext["to_device"]["next_batch"]
    body = slide(alice.client, request, pos=first["pos"])
    ext = body["extensions"]
    assert ext["to_device"]["events"] == [
        {"sender": bob.user_id, "type": "m.room_key_request", "content": {"hello": "alice"}}
    ]
    assert ext["e2ee"]["device_lists"]["changed"] == [bob.user_id]
    assert {"type": "m.direct", "content": {bob.user_id: [room]}} in ext["account_data"]["global"]
    assert ext["account_data"]["rooms"][room] == [
        {"type": "m.tag", "content": {"tags": {"u.work": {"order": 0.5}}}}
    ]
    receipt = ext["receipts"]["rooms"][room]
    assert receipt["type"] == "m.receipt"
    assert bob.user_id in receipt["content"][event_id]["m.read"]
    assert ext["typing"]["rooms"][room] == {
        "type": "m.typing",
        "content": {"user_ids": [bob.user_id]},
    }
    # Acknowledged by the next since: never sent again.
    request["extensions"]["to_device"]["since"] = ext["to_device"]["next_batch"]
    after = slide(alice.client, request, pos=body["pos"])
    assert after["extensions"]["to_device"]["events"] == []


def test_list_filters(user):
    alice, bob = user("alice"), user("bob")
    plain = create_room(alice, name="plain")
    secret = create_room(
        alice,
        name="secret",
        initial_state=[
            {
                "type": "m.room.encryption",
                "state_key": "",
                "content": {"algorithm": "m.megolm.v1.aes-sha2"},
            }
        ],
    )
    space = create_room(alice, name="space", creation_content={"type": "m.space"})
    dm = create_room(alice, is_direct=True, invite=[bob.user_id])
    r = alice.put(
        f"{V3}/rooms/{q(space)}/state/m.space.child/{q(plain)}", json={"via": ["hs.test"]}
    )
    assert r.status_code == 200, r.text
    base = f"{V3}/user/{q(alice.user_id)}"
    assert alice.put(f"{base}/account_data/m.direct", json={bob.user_id: [dm]}).status_code == 200
    assert alice.put(f"{base}/rooms/{q(secret)}/tags/m.favourite", json={}).status_code == 200
    lists = {
        "dms": room_list([[0, 9]], is_dm=True),
        "not_dms": room_list([[0, 9]], is_dm=False),
        "encrypted": room_list([[0, 9]], is_encrypted=True),
        "spaces": room_list([[0, 9]], room_types=["m.space"]),
        "rooms": room_list([[0, 9]], not_room_types=["m.space"]),
        "untyped": room_list([[0, 9]], room_types=[None]),
        "in_space": room_list([[0, 9]], spaces=[space]),
        "favourites": room_list([[0, 9]], tags=["m.favourite"]),
        "others": room_list([[0, 9]], not_tags=["m.favourite"]),
        "no_range": {"timeline_limit": 0, "required_state": []},
    }
    body = slide(alice, {"lists": lists})

    def members(name: str) -> set:
        return {r for r, entry in body["rooms"].items() if name in entry.get("lists", ())}

    assert members("dms") == {dm}
    assert members("not_dms") == {plain, secret, space}
    assert members("encrypted") == {secret}
    assert members("spaces") == {space}
    assert members("rooms") == members("untyped") == {plain, secret, dm}
    assert members("in_space") == {plain}
    assert members("favourites") == {secret}
    assert members("others") == {plain, space, dm}
    assert members("no_range") == {plain, secret, space, dm}
    counts = {name: found["count"] for name, found in body["lists"].items()}
    assert counts["not_dms"] == 3 and counts["no_range"] == 4
    assert body["rooms"][dm]["heroes"][0]["user_id"] == bob.user_id


def lists_made(server) -> dict:
    """weir_sliding_sync_lists_total by made_from: kept (brought up to date) or whole."""
    text = requests.get(server.url("/metrics"), timeout=10).text
    found = re.findall(r'^weir_sliding_sync_lists_total\{made_from="(\w+)"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


def without_ages(value):
    """The response as a recomputation would give it again: ages move with the clock."""
    if isinstance(value, dict):
        return {k: without_ages(v) for k, v in value.items() if k != "age"}
    if isinstance(value, list):
        return [without_ages(v) for v in value]
    return value


def test_a_kept_list_answers_as_a_whole_read_would(server, user):
    """Messages after a response move their rooms up in the kept list (no rooms read); the
    answer is the one a connection that reads the whole list gives, room for room."""
    alice = user("alice")
    gone = create_room(alice, name="gone")
    assert alice.post(f"{V3}/rooms/{q(gone)}/leave", json={}).status_code == 200
    rooms = [create_room(alice, name=f"r{i}") for i in range(8)]
    request = {"lists": {"top": room_list([[0, 2]], timeline_limit=3, required_state=ALL_STATE)}}
    kept = slide(alice, {**request, "conn_id": "kept"})
    whole = slide(alice, {**request, "conn_id": "whole"})
    assert kept["rooms"].keys() == whole["rooms"].keys() == set(rooms[5:])
    send(alice, rooms[0], "from the bottom")  # into the window
    send(alice, rooms[6], "within it")
    send(alice, rooms[2], "one")
    send(alice, rooms[2], "two")  # to the top, with two new events
    made = lists_made(server)
    from_kept = slide(alice, {**request, "conn_id": "kept"}, pos=kept["pos"])
    assert lists_made(server)["kept"] == made["kept"] + 1
    # Forgetting a room left before moves no stream: the kept list is read whole again.
    assert alice.post(f"{V3}/rooms/{q(gone)}/forget", json={}).status_code == 200
    from_whole = slide(alice, {**request, "conn_id": "whole"}, pos=whole["pos"])
    assert lists_made(server)["whole"] == made["whole"] + 1
    assert set(from_kept["rooms"]) == {rooms[2], rooms[6], rooms[0]}
    assert from_kept["lists"] == from_whole["lists"] == {"top": {"count": 8}}
    assert without_ages(from_kept["rooms"]) == without_ages(from_whole["rooms"])
    timeline = [e["content"].get("body") for e in from_kept["rooms"][rooms[2]]["timeline"]]
    assert timeline[-2:] == ["one", "two"] and "initial" not in from_kept["rooms"][rooms[6]]


def test_a_woken_answer_made_from_the_new_events_is_a_whole_reads(server, user):
    """Another member's messages wake a parked long-poll, whose rooms already sent are
    answered from the events themselves: the answer a whole read gives, room for room."""
    alice, bob = user("alice"), user("bob")
    gone = create_room(alice, name="gone")
    assert alice.post(f"{V3}/rooms/{q(gone)}/leave", json={}).status_code == 200
    rooms = [create_room(bob, preset="public_chat", name=f"b{i}") for i in range(3)]
    for room in rooms:
        join(alice, room)
    request = {"lists": {"all": room_list([[0, 9]], timeline_limit=2)}}
    kept = slide(alice, {**request, "conn_id": "kept"})
    whole = slide(alice, {**request, "conn_id": "whole"})
    results: dict = {}

    def wait():
        results["body"] = slide(
            alice, {**request, "conn_id": "kept"}, pos=kept["pos"], timeout=20_000
        )

    made = lists_made(server)
    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)  # parked
    first = send(bob, rooms[0], "wake up")
    waiter.join(20)
    assert not waiter.is_alive()
    woken = results["body"]
    assert lists_made(server)["kept"] == made["kept"] + 2  # parking, then woken
    entry = woken["rooms"][rooms[0]]
    assert [e["event_id"] for e in entry["timeline"]] == [first]
    assert entry["num_live"] == 1 and entry["limited"] is False and "initial" not in entry
    # Forgetting a room left before moves no stream: the kept list is read whole again.
    assert alice.post(f"{V3}/rooms/{q(gone)}/forget", json={}).status_code == 200
    from_whole = slide(alice, {**request, "conn_id": "whole"}, pos=whole["pos"])
    assert woken["lists"] == from_whole["lists"] == {"all": {"count": 3}}
    assert without_ages(woken["rooms"]) == without_ages(from_whole["rooms"])
    # Three more than the timeline takes: read from the database, limited, as a whole read.
    for text in ("one", "two", "three"):
        send(bob, rooms[1], text)
    again = slide(alice, {**request, "conn_id": "kept"}, pos=woken["pos"])
    entry = again["rooms"][rooms[1]]
    assert entry["limited"] is True and [e["content"]["body"] for e in entry["timeline"]] == [
        "two",
        "three",
    ]


def test_a_membership_or_a_state_change_reads_the_list_whole(server, user):
    """A room joined, or renamed, after a response is listed as a whole read lists it."""
    alice, bob = user("alice"), user("bob")
    mine = [create_room(alice, name=f"m{i}") for i in range(3)]
    theirs = create_room(bob, preset="public_chat", name="theirs")
    request = {"lists": {"all": room_list([[0, 9]])}}
    body = slide(alice, request)
    send(alice, mine[0], "warm")
    body = slide(alice, request, pos=body["pos"])  # the kept list, brought up to date
    made = lists_made(server)
    join(alice, theirs)
    joined = slide(alice, request, pos=body["pos"])
    assert lists_made(server)["whole"] == made["whole"] + 1
    assert joined["lists"]["all"]["count"] == 4
    assert joined["rooms"][theirs]["initial"] is True
    assert joined["rooms"][theirs]["name"] == "theirs"
    r = alice.put(f"{V3}/rooms/{q(mine[1])}/state/m.room.name", json={"name": "renamed"})
    assert r.status_code == 200, r.text
    renamed = slide(alice, request, pos=joined["pos"])
    assert lists_made(server)["whole"] == made["whole"] + 2
    assert renamed["rooms"][mine[1]]["name"] == "renamed"
    assert renamed["rooms"][mine[1]]["required_state"][0]["content"] == {"name": "renamed"}
    send(alice, mine[2], "quiet again")
    again = slide(alice, request, pos=renamed["pos"])
    assert lists_made(server)["kept"] == made["kept"] + 1
    assert list(again["rooms"]) == [mine[2]] and again["lists"]["all"]["count"] == 4


def test_a_connection_goes_on_from_the_database(server, user):
    """The in-memory state gone (a restart, or a connection pushed out of the cache), the
    next request is answered from the rows."""
    alice = user("alice")
    room = create_room(alice, name="kept")
    request = {"lists": {"all": room_list([[0, 9]])}}
    body = slide(alice, request)
    assert room in body["rooms"]
    server.stop()
    server.start()  # the module's last test: the others hold the old address
    alice.base_url = server.client_url
    assert slide(alice, request, pos=body["pos"])["rooms"] == {}  # nothing new: nothing sent
    newer = send(alice, room, "after the restart")
    later = slide(alice, request, pos=body["pos"])
    entry = later["rooms"][room]
    assert "initial" not in entry and [e["event_id"] for e in entry["timeline"]] == [newer]
    # A long-poll read back from the rows goes on, once woken, from the list it read.
    server.stop()
    server.start()
    alice.base_url = server.client_url
    results: dict = {}

    def wait():
        results["body"] = slide(alice, request, pos=later["pos"], timeout=20_000)

    made = lists_made(server)
    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)  # parked
    latest = send(alice, room, "while it waits")
    waiter.join(20)
    assert not waiter.is_alive()
    entry = results["body"]["rooms"][room]
    assert [e["event_id"] for e in entry["timeline"]] == [latest]
    made_now = lists_made(server)
    assert made_now["kept"] == made.get("kept", 0) + 1  # woken: the list it read, brought on
    assert made_now["whole"] == made.get("whole", 0) + 1  # parked: the rows, its list whole
