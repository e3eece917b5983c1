"""The relations index and the bundled aggregations' reads, on SQLite and PostgreSQL: a row
per related event written with the event (never for a soft-failed one), gone with a
redaction, and a whole page's aggregations in a fixed number of queries."""

import json

from homeserver.core.events import Event
from homeserver.rooms.aggregations import Aggregations
from homeserver.storage import database as database_module
from homeserver.storage.database import open_database
from homeserver.storage.event_rows import insert_event_row
from homeserver.storage.migrations import migrate
from homeserver.storage.redactions import RedactionStore
from homeserver.storage.relations import RelationStore
from homeserver.storage.rooms import RoomStore, StoredEvent

ROOM = "!room:x"
ALICE, BOB = "@alice:x", "@bob:x"


class Events:
    """Writes events as the persist path does, one position after another."""

    def __init__(self, db):
        self.db = db
        self.position = 0
        db.write(
            lambda tx: tx.execute(
                "INSERT INTO rooms (room_id, room_version, creator, created_ts)"
                " VALUES (?, '11', ?, 0)",
                (ROOM, ALICE),
            )
        )

    def add(self, sender: str, content: dict, soft_failed: bool = False, **extra) -> StoredEvent:
        self.position += 1
        event_id = f"$e{self.position}"
        pdu = {
            "room_id": ROOM,
            "type": extra.pop("type", "m.room.message"),
            "sender": sender,
            "depth": self.position,
            "origin_server_ts": 1000 + self.position,
            "content": content,
            **extra,
        }
        event = Event(event_id, pdu)
        position = self.position
        self.db.write(lambda tx: insert_event_row(tx, event, position, soft_failed=soft_failed))
        return StoredEvent(event, position)


def relates(rel_type: str, parent: StoredEvent, **content) -> dict:
    return {**content, "m.relates_to": {"rel_type": rel_type, "event_id": parent.event.event_id}}


def edit(parent: StoredEvent, body: str) -> dict:
    return relates("m.replace", parent, body=f"* {body}", **{"m.new_content": {"body": body}})


def test_rows_are_written_with_events_and_dropped_by_redaction(db):
    events = Events(db)
    parent = events.add(ALICE, {"body": "hi"})
    first = events.add(ALICE, edit(parent, "one"))
    second = events.add(ALICE, edit(parent, "two"))
    events.add(ALICE, edit(parent, "hidden"), soft_failed=True)  # never shown: no relation
    events.add(BOB, edit(parent, "not bob's to edit"))
    events.add(ALICE, {"m.relates_to": {"rel_type": "m.replace", "event_id": 7}})  # no string
    store = RelationStore(db)
    assert store.edits(ROOM, [parent.event.event_id])[parent.event.event_id] == second

    db.write(
        lambda tx: RedactionStore.apply(tx, second.event, {"content": {}}, {}, "$redaction", 1)
    )
    assert store.edits(ROOM, [parent.event.event_id])[parent.event.event_id] == first
    rows = db.read(lambda tx: tx.fetchall("SELECT event_id FROM event_relations"))
    assert sorted(r[0] for r in rows) == ["$e2", "$e5"]


def test_the_migration_indexes_events_stored_before_it(empty_database_url):
    db = open_database(empty_database_url)
    try:
        migrate(db, until=49)
        Events(db)  # the room's row
        parent = Event("$parent", {"room_id": ROOM, "type": "m.room.message", "sender": ALICE})
        rows = [
            (1, "$parent", {"body": "hi"}, 0),
            (2, "$edit", edit(StoredEvent(parent, 1), "hello"), 0),
            (3, "$hidden", relates("m.thread", StoredEvent(parent, 1)), 1),  # soft-failed
            (4, "$reply", relates("m.thread", StoredEvent(parent, 1), body="re"), 0),
        ]
        for position, event_id, content, soft_failed in rows:
            pdu = {
                "type": "m.room.message",
                "sender": ALICE,
                "origin_server_ts": position,
                "content": content,
                "room_id": ROOM,
            }
            db.write(
                lambda tx, p=position, e=event_id, d=pdu, f=soft_failed: tx.execute(
                    "INSERT INTO events (stream_ordering, event_id, room_id, type, sender, depth,"
                    " origin_server_ts, json, soft_failed, outlier)"
                    " VALUES (?, ?, ?, 'm.room.message', ?, ?, ?, ?, ?, 0)",
                    (p, e, ROOM, ALICE, p, p, json.dumps(d), f),
                )
            )
        migrate(db)
        indexed = db.read(
            lambda tx: tx.fetchall(
                "SELECT event_id, rel_type, thread_root FROM event_relations ORDER BY event_id"
            )
        )
        assert indexed == [("$edit", "m.replace", None), ("$reply", "m.thread", "$parent")]
    finally:
        db.close()


def test_a_page_of_fifty_costs_four_queries(db, monkeypatch):
    events = Events(db)
    parents = [events.add(ALICE, {"body": f"message {i}"}) for i in range(50)]
    for parent in parents:
        events.add(ALICE, edit(parent, "edited"))
        events.add(BOB, relates("m.thread", parent, body="in a thread"))
        events.add(BOB, relates("m.reference", parent, body="see above"))

    executed: list[str] = []
    original = database_module.Tx.execute

    def counting(self, sql, params=()):
        executed.append(sql)
        return original(self, sql, params)

    monkeypatch.setattr(database_module.Tx, "execute", counting)
    bundles = Aggregations(RelationStore(db), RoomStore(db).txn_ids_for).bundles(
        ALICE, None, parents, 5000
    )
    assert len(executed) == 4  # edits, threads, references; the threads' latest events' edits
    assert len(bundles) == 50
    for parent in parents:
        bundle = bundles[parent.event.event_id]
        assert bundle["m.replace"]["content"]["m.new_content"] == {"body": "edited"}
        assert bundle["m.thread"]["count"] == 1
        assert bundle["m.thread"]["current_user_participated"] is True  # alice's root
        assert bundle["m.thread"]["latest_event"]["sender"] == BOB
        assert len(bundle["m.reference"]["chunk"]) == 1
