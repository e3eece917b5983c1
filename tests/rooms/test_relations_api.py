"""Relationships over the client-server API on the real server (SQLite and PostgreSQL): edits,
threads and references bundled in `unsigned.m.relations` of /event, /messages and /sync;
/relations paginated, filtered and recursive; /threads; and what a reader who may not see
events is refused or left without."""

import itertools
from urllib.parse import quote

import pytest

from tests.rooms.conftest import V3, create_room, send
from tests.rooms.test_redactions_api import redact
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync, timeline

V1 = "/_matrix/client/v1"
RELATIONS = "/_matrix/client/v1/rooms/{roomId}/relations/{eventId}"
RELATIONS_TYPE = RELATIONS + "/{relType}"
RELATIONS_EVENT_TYPE = RELATIONS_TYPE + "/{eventType}"
THREADS = "/_matrix/client/v1/rooms/{roomId}/threads"
EVENT = "/_matrix/client/v3/rooms/{roomId}/event/{eventId}"
MESSAGES = "/_matrix/client/v3/rooms/{roomId}/messages"
_txns = itertools.count()


def q(value: str) -> str:
    return quote(value, safe="")


def send_event(client, room_id: str, content: dict, event_type: str = "m.room.message") -> str:
    r = client.put(f"{V3}/rooms/{q(room_id)}/send/{event_type}/rel{next(_txns)}", json=content)
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def relation(rel_type: str, parent: str, **content) -> dict:
    return {**content, "m.relates_to": {"rel_type": rel_type, "event_id": parent}}


def edit(client, room_id: str, parent: str, body: str) -> str:
    content = relation("m.replace", parent, msgtype="m.text", body=f"* {body}")
    content["m.new_content"] = {"msgtype": "m.text", "body": body}
    return send_event(client, room_id, content)


def react(client, room_id: str, parent: str, key: str) -> str:
    content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": parent, "key": key}}
    return send_event(client, room_id, content, "m.reaction")


def reply_in_thread(client, room_id: str, root: str, body: str) -> str:
    return send_event(client, room_id, relation("m.thread", root, msgtype="m.text", body=body))


def get_event(client, room_id: str, event_id: str) -> dict:
    r = client.get(f"{V3}/rooms/{q(room_id)}/event/{q(event_id)}")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", EVENT)
    return r.json()


def relations(client, room_id: str, parent: str, *path: str, status: int = 200, **params):
    url = "/".join([f"{V1}/rooms/{q(room_id)}/relations/{q(parent)}", *map(q, path)])
    r = client.get(url, params=params)
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "GET", [RELATIONS, RELATIONS_TYPE, RELATIONS_EVENT_TYPE][len(path)])
    return r.json()


def threads(client, room_id: str, status: int = 200, **params) -> dict:
    r = client.get(f"{V1}/rooms/{q(room_id)}/threads", params=params)
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "GET", THREADS)
    return r.json()


def bundled(event: dict) -> dict:
    return event["unsigned"].get("m.relations", {})


def ids(chunk: list[dict]) -> list[str]:
    return [e["event_id"] for e in chunk]


def test_edit_bundled_everywhere_and_a_redacted_edit_stops_applying(user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/join/{q(room_id)}", json={}).status_code == 200
    original = send(alice, room_id, "helo")
    first = edit(alice, room_id, original, "hello")
    second = edit(alice, room_id, original, "hello!")
    edit(bob, room_id, original, "bob may not edit alice's message")

    replace = bundled(get_event(bob, room_id, original))["m.replace"]
    assert replace["event_id"] == second
    assert replace["content"]["m.new_content"]["body"] == "hello!"
    # The bundled edit carries its transaction ID for the device that sent it alone.
    assert "transaction_id" not in replace["unsigned"]
    own = bundled(get_event(alice, room_id, original))["m.replace"]
    assert own["unsigned"]["transaction_id"].startswith("rel")
    r = bob.get(f"{V3}/rooms/{q(room_id)}/messages", params={"dir": "b"})
    assert_matches_spec(r, "GET", MESSAGES)
    by_id = {e["event_id"]: e for e in r.json()["chunk"]}
    assert bundled(by_id[original])["m.replace"]["event_id"] == second
    assert "m.relations" not in by_id[second]["unsigned"]  # an edit has no bundle of its own
    synced = {e["event_id"]: e for e in timeline(sync(bob), room_id)}
    assert bundled(synced[original])["m.replace"]["event_id"] == second

    assert redact(alice, room_id, second, "redact-edit").status_code == 200
    assert bundled(get_event(bob, room_id, original))["m.replace"]["event_id"] == first
    assert redact(alice, room_id, first, "redact-first").status_code == 200
    assert "m.replace" not in bundled(get_event(bob, room_id, original))
    # Redacted edits are relations no more: /relations no longer lists them.
    chunk = relations(bob, room_id, original, "m.replace")["chunk"]
    assert [e["sender"] for e in chunk] == [bob.user_id]


def test_reactions_and_references_through_relations(user):
    alice = user("alice")
    room_id = create_room(alice)
    parent = send(alice, room_id, "react to me")
    reactions = [react(alice, room_id, parent, key) for key in ("👍", "🎉", "❤️", "😀", "🚀")]
    references = [
        send_event(alice, room_id, relation("m.reference", parent, body=f"r{i}")) for i in range(2)
    ]

    body = relations(alice, room_id, parent)
    assert ids(body["chunk"]) == (reactions + references)[::-1]  # newest first
    assert "next_batch" not in body and "prev_batch" not in body and "recursion_depth" not in body
    annotations = relations(alice, room_id, parent, "m.annotation")["chunk"]
    assert ids(annotations) == reactions[::-1]
    assert annotations[0]["content"]["m.relates_to"]["key"] == "🚀"
    assert relations(alice, room_id, parent, "m.annotation", "m.room.message")["chunk"] == []
    typed = relations(alice, room_id, parent, "m.annotation", "m.reaction")["chunk"]
    assert ids(typed) == reactions[::-1]

    # References are bundled as IDs; reactions are not bundled.
    assert bundled(get_event(alice, room_id, parent)) == {
        "m.reference": {"chunk": [{"event_id": e} for e in references]}
    }

    # Pages of two, backwards then forwards, each page naming the next.
    seen, token, pages = [], None, 0
    while True:
        params = {"limit": 2, **({"from": token} if token else {})}
        page = relations(alice, room_id, parent, **params)
        assert ("prev_batch" in page) == (token is not None)
        seen += ids(page["chunk"])
        pages += 1
        token = page.get("next_batch")
        if token is None:
            break
    assert seen == (reactions + references)[::-1] and pages == 4
    forward = relations(alice, room_id, parent, "m.annotation", dir="f", limit=3)
    assert ids(forward["chunk"]) == reactions[:3]
    rest = relations(
        alice, room_id, parent, "m.annotation", dir="f", **{"from": forward["next_batch"]}
    )
    assert ids(rest["chunk"]) == reactions[3:] and "next_batch" not in rest
    # `to` stops a backward page where an earlier forward page ended.
    upto = relations(alice, room_id, parent, "m.annotation", to=forward["next_batch"])
    assert ids(upto["chunk"]) == reactions[3:][::-1]

    relations(alice, room_id, "$unknown", status=404)
    relations(alice, room_id, parent, dir="sideways", status=400)


def test_recurse_follows_relations_three_deep(user):
    alice = user("alice")
    room_id = create_room(alice)
    root = send(alice, room_id, "root")
    chain = [root]
    for depth in range(4):  # each relates to the one before: depths 1 to 4 below the root
        chain.append(
            send_event(alice, room_id, relation("m.reference", chain[-1], body=str(depth)))
        )

    assert ids(relations(alice, room_id, root)["chunk"]) == [chain[1]]
    deep = relations(alice, room_id, root, recurse="true")
    assert ids(deep["chunk"]) == chain[1:4][::-1]  # depth 4 is beyond the limit
    assert deep["recursion_depth"] == 3
    assert relations(alice, room_id, root, recurse="false")["recursion_depth"] == 1
    assert (
        ids(relations(alice, room_id, root, "m.reference", recurse="true", dir="f")["chunk"])
        == chain[1:4]
    )


def test_threads_bundled_and_listed_latest_activity_first(user):
    alice, bob = user("alice"), user("bob")
    room_id = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/join/{q(room_id)}", json={}).status_code == 200
    first = send(alice, room_id, "first thread")
    second = send(alice, room_id, "second thread")
    reply_in_thread(bob, room_id, first, "bob in the first")
    reply_in_thread(alice, room_id, second, "alice in the second")
    latest = reply_in_thread(alice, room_id, first, "alice again in the first")
    edit(alice, room_id, latest, "alice again in the first, edited")

    thread = bundled(get_event(bob, room_id, first))["m.thread"]
    assert thread["count"] == 2 and thread["current_user_participated"] is True
    assert thread["latest_event"]["event_id"] == latest
    assert thread["latest_event"]["unsigned"]["m.relations"]["m.replace"]["content"][
        "body"
    ].startswith("*")
    other = bundled(get_event(bob, room_id, second))["m.thread"]
    assert other["count"] == 1 and other["current_user_participated"] is False

    listed = threads(bob, room_id)
    assert ids(listed["chunk"]) == [first, second] and "next_batch" not in listed
    assert bundled(listed["chunk"][0])["m.thread"]["latest_event"]["event_id"] == latest
    page = threads(bob, room_id, limit=1)
    assert ids(page["chunk"]) == [first]
    rest = threads(bob, room_id, limit=1, **{"from": page["next_batch"]})
    assert ids(rest["chunk"]) == [second] and "next_batch" not in rest
    assert ids(threads(bob, room_id, include="participated")["chunk"]) == [first]
    assert ids(threads(alice, room_id, include="participated")["chunk"]) == [first, second]
    threads(bob, room_id, include="mine", status=400)

    # The thread's replies, through /relations, and in /sync as bundled aggregations.
    replies = relations(bob, room_id, first, "m.thread")["chunk"]
    assert len(replies) == 2 and replies[0]["event_id"] == latest
    synced = {e["event_id"]: e for e in timeline(sync(bob), room_id)}
    assert bundled(synced[first])["m.thread"]["count"] == 2


def test_readers_see_only_what_history_visibility_lets_them(user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room_id = create_room(alice, preset="public_chat")
    r = alice.put(
        f"{V3}/rooms/{q(room_id)}/state/m.room.history_visibility",
        json={"history_visibility": "joined"},
    )
    assert r.status_code == 200, r.text
    before_bob = send(alice, room_id, "before bob joined")
    assert bob.post(f"{V3}/join/{q(room_id)}", json={}).status_code == 200
    parent = send(alice, room_id, "while bob is here")
    seen_reply = reply_in_thread(alice, room_id, parent, "bob sees this one")
    seen_reaction = react(alice, room_id, parent, "👀")
    assert bob.post(f"{V3}/rooms/{q(room_id)}/leave", json={}).status_code == 200
    reply_in_thread(alice, room_id, parent, "after bob left")
    react(alice, room_id, parent, "🙈")

    # Carol was never in the room: refused outright.
    relations(carol, room_id, parent, status=403)
    threads(carol, room_id, status=403)
    # Bob may not see what was sent before he joined: unknown to him.
    relations(bob, room_id, before_bob, status=404)
    # Of what came after he left, he gets nothing, in lists and in the bundle.
    assert ids(relations(bob, room_id, parent)["chunk"]) == [seen_reaction, seen_reply]
    thread = bundled(get_event(bob, room_id, parent))["m.thread"]
    assert thread["latest_event"]["event_id"] == seen_reply
    assert ids(threads(bob, room_id)["chunk"]) == [parent]


@pytest.mark.parametrize("path", ["/_matrix/client/versions"])
def test_versions_list_v1_4_for_stable_threads(server, path):
    import requests

    versions = requests.get(server.client_url + path).json()["versions"]
    assert "v1.4" in versions and "r0.0.1" in versions and versions[-1] == "v1.16"
