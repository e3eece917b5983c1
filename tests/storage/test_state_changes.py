"""`RoomStore.state_changes`, the membership and visibility timelines history is judged by,
on SQLite and PostgreSQL: every key's events in one statement, each under its own key,
oldest first, never a soft-failed one."""

from homeserver.storage.rooms import RoomStore
from tests.storage.test_relations_store import ALICE, BOB, ROOM, Events

VISIBILITY = ("m.room.history_visibility", "")


def test_each_key_has_its_events_oldest_first(db):
    events = Events(db)
    member = ("m.room.member", ALICE)

    def state(key, content, **extra):
        return events.add(ALICE, content, type=key[0], state_key=key[1], **extra)

    joined = state(member, {"membership": "join"})
    shared = state(VISIBILITY, {"history_visibility": "shared"})
    events.add(ALICE, {"body": "not state"})
    state(member, {"membership": "leave"}, soft_failed=True)  # never part of the timeline
    left = state(member, {"membership": "leave"})
    joined_only = state(VISIBILITY, {"history_visibility": "joined"})
    state(("m.room.member", BOB), {"membership": "join"})

    changes = RoomStore(db).state_changes(ROOM, [member, VISIBILITY, member, ("m.x", "")])
    assert {key: [(at, s.event.event_id) for at, s in found] for key, found in changes.items()} == {
        member: [(1, joined.event.event_id), (5, left.event.event_id)],
        VISIBILITY: [(2, shared.event.event_id), (6, joined_only.event.event_id)],
        ("m.x", ""): [],
    }
