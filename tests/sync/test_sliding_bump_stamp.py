"""Simplified sliding sync's `bump_stamp` on the real server, SQLite and PostgreSQL: the
activity a client sorts its room list by (MSC4186's event types), apart from the list's own
order, which any event moves. The same through matrix-js-sdk, beside Synapse:
tests/e2ee/test_js_sdk_synapse.py."""

from tests.rooms.conftest import V3, create_room, send
from tests.rooms.test_relations_api import q
from tests.sync.test_sliding_sync import join, room_list, slide

TOP = {"lists": {"top": room_list([[0, 0]])}}


def react(client, room_id: str, event_id: str, txn: str) -> str:
    relates = {"rel_type": "m.annotation", "event_id": event_id, "key": "+1"}
    r = client.put(f"{V3}/rooms/{q(room_id)}/send/m.reaction/{txn}", json={"m.relates_to": relates})
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def test_a_reaction_or_a_rename_moves_the_list_but_not_the_bump_stamp(user):
    alice, bob = user("alice"), user("bob")
    quiet = create_room(alice, preset="public_chat", name="quiet")
    join(bob, quiet)
    hello = send(alice, quiet, "hello")
    busy = create_room(alice, name="busy")
    send(alice, busy, "newer")
    body = slide(alice, TOP)
    assert list(body["rooms"]) == [busy]
    newer = body["rooms"][busy]["bump_stamp"]

    # bob's reaction takes the room to the top of the list, sent whole with its last
    # message's bump_stamp (read from the database, not in its one-event timeline).
    react(bob, quiet, hello, "r1")
    moved = slide(alice, TOP, pos=body["pos"])
    entry = moved["rooms"][quiet]
    assert entry["initial"] is True and entry["timeline"][0]["type"] == "m.reaction"
    assert 0 < entry["bump_stamp"] < newer

    # Sent before, the room's news without activity leave its bump_stamp out (unchanged):
    # bob's reaction made from the woken events, alice's rename read from the database.
    react(bob, quiet, hello, "r2")
    again = slide(alice, TOP, pos=moved["pos"])
    assert again["rooms"][quiet]["timeline"][0]["type"] == "m.reaction"
    assert "bump_stamp" not in again["rooms"][quiet]
    r = alice.put(f"{V3}/rooms/{q(quiet)}/state/m.room.name/", json={"name": "renamed"})
    assert r.status_code == 200, r.text
    renamed = slide(alice, TOP, pos=again["pos"])
    assert renamed["rooms"][quiet]["name"] == "renamed"
    assert "bump_stamp" not in renamed["rooms"][quiet]

    # A message is activity: the room's bump_stamp is the message's, past busy's.
    send(bob, quiet, "news")
    news = slide(alice, TOP, pos=renamed["pos"])
    assert news["rooms"][quiet]["bump_stamp"] > newer
