"""/context on the real server (SQLite and PostgreSQL): the events around one, split before
and after, filtered, with tokens /messages pages on from, the state at the answer's last
event (lazily loaded members included), and what a reader who may not see the event gets."""

import json
from urllib.parse import quote

from tests.rooms.conftest import V3, create_room, send
from tests.support.spec import assert_matches_spec

CONTEXT = "/_matrix/client/v3/rooms/{roomId}/context/{eventId}"


def q(value: str) -> str:
    return quote(value, safe="")


def context(client, room_id: str, event_id: str, status: int = 200, **params) -> dict:
    r = client.get(f"{V3}/rooms/{q(room_id)}/context/{q(event_id)}", params=params)
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "GET", CONTEXT)
    return r.json()


def bodies(events: list[dict]) -> list[str]:
    return [e["content"].get("body") for e in events]


def messages(client, room_id: str, **params) -> dict:
    r = client.get(f"{V3}/rooms/{q(room_id)}/messages", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_context_splits_the_limit_around_the_event_and_pages_on(user):
    alice = user("alice")
    room_id = create_room(alice, preset="private_chat")
    ids = [send(alice, room_id, f"m{i}") for i in range(20)]

    answer = context(alice, room_id, ids[10], limit=6)
    assert answer["event"]["event_id"] == ids[10]
    assert bodies(answer["events_before"]) == ["m9", "m8", "m7"]  # newest first
    assert bodies(answer["events_after"]) == ["m11", "m12", "m13"]
    assert answer["events_before"][0]["unsigned"]["membership"] == "join"

    # The tokens page on with /messages from where the answer stops, with no gap.
    older = messages(alice, room_id, dir="b", limit=3, **{"from": answer["start"]})
    assert bodies(older["chunk"]) == ["m6", "m5", "m4"]
    newer = messages(alice, room_id, dir="f", limit=3, **{"from": answer["end"]})
    assert bodies(newer["chunk"]) == ["m14", "m15", "m16"]

    # The default is 10: five each way; limit 0 gives the event alone.
    answer = context(alice, room_id, ids[10])
    assert len(answer["events_before"]) == 5 and len(answer["events_after"]) == 5
    answer = context(alice, room_id, ids[10], limit=0)
    assert answer["events_before"] == [] and answer["events_after"] == []
    # Past the cap, 100 at most; the room has fewer.
    answer = context(alice, room_id, ids[19], limit=100000)
    assert bodies(answer["events_before"])[:3] == ["m18", "m17", "m16"]
    assert answer["events_after"] == []


def test_context_filter_and_lazy_loaded_members(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room_id = create_room(alice, preset="public_chat")
    for member in (bob, carol):
        assert member.post(f"{V3}/join/{q(room_id)}", json={}).status_code == 200
    send(carol, room_id, "carol early")
    send(bob, room_id, "bob before")
    r = alice.put(f"{V3}/rooms/{q(room_id)}/send/m.reaction/r1", json={})
    assert r.status_code == 200, r.text
    middle = send(alice, room_id, "alice middle")
    send(bob, room_id, "bob after")

    event_filter = {"types": ["m.room.message"], "lazy_load_members": True}
    answer = context(alice, room_id, middle, limit=4, filter=json.dumps(event_filter))
    assert bodies(answer["events_before"]) == ["bob before", "carol early"]
    assert bodies(answer["events_after"]) == ["bob after"]
    # The filter keeps the state to its types too, as Synapse's does: no members then.
    assert answer["state"] == []

    lazy = {"lazy_load_members": True}
    answer = context(alice, room_id, middle, limit=2, filter=json.dumps(lazy))
    members = {e["state_key"] for e in answer["state"] if e["type"] == "m.room.member"}
    senders = {alice.user_id, bob.user_id}
    assert {e["sender"] for e in answer["events_before"] + answer["events_after"]} <= senders
    assert members == senders
    assert any(e["type"] == "m.room.create" for e in answer["state"])

    answer = context(alice, room_id, middle, limit=2)
    members = {e["state_key"] for e in answer["state"] if e["type"] == "m.room.member"}
    assert members == {alice.user_id, bob.user_id, carol.user_id}


def test_context_refusals(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room_id = create_room(alice, preset="public_chat")
    r = alice.put(
        f"{V3}/rooms/{q(room_id)}/state/m.room.history_visibility",
        json={"history_visibility": "joined"},
    )
    assert r.status_code == 200, r.text
    before_bob = send(alice, room_id, "before bob joined")
    assert bob.post(f"{V3}/join/{q(room_id)}", json={}).status_code == 200
    seen = send(alice, room_id, "bob sees this")

    # What the reader may not see is unknown to them, as /event has it.
    assert context(bob, room_id, before_bob, 404)["errcode"] == "M_NOT_FOUND"
    assert context(carol, room_id, seen, 404)["errcode"] == "M_NOT_FOUND"
    assert context(alice, room_id, "$nosuchevent", 404)["errcode"] == "M_NOT_FOUND"
    # Bob sees his own context without the event before he joined.
    answer = context(bob, room_id, seen)
    assert before_bob not in [e["event_id"] for e in answer["events_before"]]

    for params in ({"limit": "many"}, {"limit": "-1"}, {"filter": "{not json"}):
        assert context(alice, room_id, seen, 400, **params)["errcode"] in (
            "M_INVALID_PARAM",
            "M_NOT_JSON",
            "M_BAD_JSON",
        )
    assert context(alice, room_id, seen, 400, filter='{"types": 3}')["errcode"] == "M_BAD_JSON"
