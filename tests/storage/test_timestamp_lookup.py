"""`RoomStore.event_near_ts`, on SQLite and PostgreSQL: the timeline's event closest to a
time in each direction, never an outlier, a soft-failed event or another room's, found
through the (room_id, origin_server_ts) index of migration 0054."""

import pytest

from homeserver.core.events import Event
from homeserver.storage.event_rows import insert_event_row
from homeserver.storage.rooms import RoomStore

ROOM, OTHER = "!room:x", "!other:x"


def add(db, position: int, room_id: str, ts: int, **flags) -> str:
    event_id = f"$e{position}"
    pdu = {
        "room_id": room_id,
        "type": "m.room.message",
        "sender": "@alice:x",
        "depth": position,
        "origin_server_ts": ts,
        "content": {"body": str(position)},
    }
    db.write(lambda tx: insert_event_row(tx, Event(event_id, pdu), position, **flags))
    return event_id


def near(store: RoomStore, ts: int, forward: bool) -> str | None:
    found = store.event_near_ts(ROOM, ts, forward)
    return None if found is None else found.event.event_id


def test_closest_timeline_event_each_way(db):
    for room_id in (ROOM, OTHER):
        db.write(
            lambda tx, r=room_id: tx.execute(
                "INSERT INTO rooms (room_id, room_version, creator, created_ts)"
                " VALUES (?, '11', '@alice:x', 0)",
                (r,),
            )
        )
    first = add(db, 1, ROOM, 1000)
    add(db, 2, ROOM, 2000, soft_failed=True)
    add(db, 3, ROOM, 2500, outlier=True)
    add(db, 4, OTHER, 2600)
    tied_a = add(db, 5, ROOM, 3000)
    tied_b = add(db, 6, ROOM, 3000)
    store = RoomStore(db)

    assert near(store, 1500, True) == tied_a  # skips the soft-failed, outlier, other room
    assert near(store, 2999, False) == first
    assert near(store, 3000, True) == tied_a  # ties: the earliest going forward
    assert near(store, 3000, False) == tied_b  # and the latest going back
    assert near(store, 1000, False) == first
    assert near(store, 3001, True) is None
    assert near(store, 999, False) is None


def test_the_lookup_uses_the_timestamp_index(db):
    if db.dialect != "sqlite":
        pytest.skip("the planner's choice on a near-empty PostgreSQL table says nothing")
    plan = db.read(
        lambda tx: tx.fetchall(
            "EXPLAIN QUERY PLAN SELECT event_id FROM events e WHERE e.room_id = ?"
            " AND e.soft_failed = 0 AND e.outlier = 0 AND e.origin_server_ts >= ?"
            " ORDER BY e.origin_server_ts ASC, e.stream_ordering ASC LIMIT 1",
            (ROOM, 0),
        )
    )
    assert "events_by_room_ts" in " ".join(str(row) for row in plan)
