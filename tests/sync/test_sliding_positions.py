"""A room sent up to a pos is kept as sent "up to the pos" (sync/sliding_connections.py
`UP_TO_POS`): a message that moves a room already sent writes no new generation, and yet
a retried pos, an older one, or one read back from the rows after a restart each answer
from exactly where their own token stood."""

from tests.rooms.conftest import create_room, send
from tests.sync.test_sliding_sync import room_list, slide

REQUEST = {"lists": {"all": room_list([[0, 9]], timeline_limit=5)}}


def generation(pos: str) -> int:
    return int(pos.split(".", 2)[1])


def timeline_ids(body: dict, room: str) -> list[str]:
    return [e["event_id"] for e in body["rooms"].get(room, {}).get("timeline", [])]


def test_a_moved_room_keeps_the_generation_and_each_pos_its_own_place(server, user):
    alice = user("alice")
    room = create_room(alice, name="moves")
    first = slide(alice, REQUEST)
    assert room in first["rooms"]
    one = send(alice, room, "one")
    second = slide(alice, REQUEST, pos=first["pos"])
    assert timeline_ids(second, room) == [one]
    # Sent up to the new pos, as it was up to the old one: nothing new to keep.
    assert generation(second["pos"]) == generation(first["pos"])
    two = send(alice, room, "two")
    # The first pos again (its answer lost): both messages since it, not only the newest.
    assert timeline_ids(slide(alice, REQUEST, pos=first["pos"]), room) == [one, two]
    third = slide(alice, REQUEST, pos=second["pos"])
    assert timeline_ids(third, room) == [two]
    assert slide(alice, REQUEST, pos=third["pos"])["rooms"] == {}
    # Read back from the rows, each pos still answers from its own token.
    server.stop()
    server.start()
    alice.base_url = server.client_url
    assert timeline_ids(slide(alice, REQUEST, pos=second["pos"]), room) == [two]
    assert slide(alice, REQUEST, pos=third["pos"])["rooms"] == {}


def test_a_room_that_leaves_the_window_keeps_the_place_it_was_sent_to(user):
    alice = user("alice")
    quiet = create_room(alice, name="quiet")
    busy = create_room(alice, name="busy")
    one_room = {"lists": {"all": room_list([[0, 0]], timeline_limit=5)}}
    first = slide(alice, one_room)
    assert list(first["rooms"]) == [busy]
    send(alice, quiet, "back on top")  # quiet moves in, busy out of the window
    second = slide(alice, one_room, pos=first["pos"])
    assert list(second["rooms"]) == [quiet]
    assert generation(second["pos"]) > generation(first["pos"])
    send(alice, busy, "back again")
    third = slide(alice, one_room, pos=second["pos"])
    # busy was sent up to the first pos only: what came since is its whole news.
    assert list(third["rooms"]) == [busy]
    assert [e["content"]["body"] for e in third["rooms"][busy]["timeline"]] == ["back again"]
