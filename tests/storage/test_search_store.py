"""The full-text search index on SQLite and PostgreSQL: a row per searchable event written
with the event (never for a soft-failed, outlier or encrypted one), gone with a redaction,
older events indexed by the migration, and any term, however hostile, a plain query."""

import json

import pytest

from homeserver.core.events import Event
from homeserver.storage.database import open_database
from homeserver.storage.event_rows import insert_event_row
from homeserver.storage.history import HistoryEvent, HistoryStore
from homeserver.storage.migrations import migrate
from homeserver.storage.redactions import RedactionStore
from homeserver.storage.search import SearchQuery, SearchStore, search_words

ROOM, OTHER_ROOM = "!room:x", "!other:x"
ALICE = "@alice:x"
ALL_KEYS = ["content.body", "content.name", "content.topic"]


class Events:
    def __init__(self, db):
        self.db = db
        self.position = 0
        for room in (ROOM, OTHER_ROOM):
            db.write(
                lambda tx, r=room: tx.execute(
                    "INSERT INTO rooms (room_id, room_version, creator, created_ts)"
                    " VALUES (?, '11', ?, 0) ON CONFLICT DO NOTHING",
                    (r, ALICE),
                )
            )

    def add(self, content: dict, event_type="m.room.message", room=ROOM, **flags) -> Event:
        self.position += 1
        pdu = {
            "room_id": room,
            "type": event_type,
            "sender": ALICE,
            "depth": self.position,
            "origin_server_ts": 1000 + self.position,
            "content": content,
        }
        if event_type in ("m.room.name", "m.room.topic"):
            pdu["state_key"] = ""
        event = Event(f"$e{self.position}", pdu)
        position = self.position
        self.db.write(lambda tx: insert_event_row(tx, event, position, **flags))
        return event


def found(db, term: str, rooms=(ROOM,), keys=ALL_KEYS, recent=True) -> list[str]:
    query = SearchQuery(list(rooms), search_words(term), list(keys), recent, 0, 50)
    hits, count = SearchStore(db).search(query)
    assert count == len(hits)
    return [h.stored.event.event_id for h in hits]


def test_events_are_indexed_in_the_write_that_stores_them(db):
    events = Events(db)
    events.add({"body": "the quick brown fox"})
    events.add({"name": "Fox den"}, "m.room.name")
    events.add({"topic": "all about foxes"}, "m.room.topic")
    events.add({"body": "fox hidden"}, soft_failed=True)
    events.add({"body": "fox outlier"}, outlier=True)
    events.add({"algorithm": "m.megolm.v1.aes-sha2", "body": "fox"}, "m.room.encrypted")
    events.add({"body": "fox elsewhere"}, room=OTHER_ROOM)
    events.add({"body": 7})  # not text: nothing to index
    assert found(db, "fox") == ["$e3", "$e2", "$e1"]  # newest first; "foxes" stems to fox
    assert found(db, "fox", keys=["content.name"]) == ["$e2"]
    assert found(db, "FOX brown") == ["$e1"]  # every word must match
    assert found(db, "fox", rooms=[ROOM, OTHER_ROOM]) == ["$e7", "$e3", "$e2", "$e1"]
    assert found(db, "fox", rooms=[]) == []


def test_backfilled_history_is_indexed_but_not_hidden_events_or_outliers(db):
    events = Events(db)
    newer = events.add({"body": "kestrel in the timeline"})

    def old(event_id: str) -> Event:
        content = {"body": f"kestrel {event_id}"}
        pdu = {"room_id": ROOM, "type": "m.room.message", "sender": ALICE, "content": content}
        pdu.update(depth=1, origin_server_ts=1, prev_events=[], auth_events=[])
        return Event(event_id, pdu)

    HistoryStore(db).store(
        [
            HistoryEvent(old("$backfilled")),
            HistoryEvent(old("$refused"), hidden=True),
            HistoryEvent(old("$fetched"), outlier=True),
        ]
    )
    assert found(db, "kestrel") == [newer.event_id, "$backfilled"]  # history sits below


def test_best_match_first_when_ranked(db):
    events = Events(db)
    events.add({"body": "cat and a long sentence about nothing much at all really"})
    events.add({"body": "cat cat cat"})
    assert found(db, "cat", recent=False) == ["$e2", "$e1"]
    assert found(db, "cat", recent=True) == ["$e2", "$e1"]
    events.add({"body": "the cat sat here and said nothing much at all, at length"})
    assert found(db, "cat", recent=False)[0] == "$e2"
    assert found(db, "cat", recent=True)[0] == "$e3"


def test_a_redaction_removes_the_row(db):
    events = Events(db)
    kept = events.add({"body": "secret plan"})
    redacted = events.add({"body": "secret code"})
    db.write(lambda tx: RedactionStore.apply(tx, redacted, {"content": {}}, {}, "$r", 1))
    assert found(db, "secret") == [kept.event_id]


@pytest.mark.parametrize("term", ['"', "*", "OR", "'", 'fox" OR "', "NEAR(fox", "a:b -c ^d", ""])
def test_hostile_terms_are_plain_words(db, term):
    events = Events(db)
    events.add({"body": "fox OR hound"})
    result = found(db, term)  # never an engine syntax error
    assert result in ([], ["$e1"])
    assert found(db, "or") == (["$e1"] if db.dialect == "sqlite" else [])  # a stop word in pg


def test_the_migration_indexes_events_stored_before_it(empty_database_url):
    db = open_database(empty_database_url)
    try:
        migrate(db, until=50)
        events = Events(db)  # the rooms' rows
        rows = [
            (1, "$old", "m.room.message", {"body": "old news"}, 0, 0),
            (2, "$hidden", "m.room.message", {"body": "old hidden"}, 1, 0),
            (3, "$outlier", "m.room.message", {"body": "old outlier"}, 0, 1),
            (4, "$topic", "m.room.topic", {"topic": "old topics"}, 0, 0),
            (5, "$crypt", "m.room.encrypted", {"body": "old"}, 0, 0),
        ]
        for position, event_id, event_type, content, soft_failed, outlier in rows:
            pdu = {"type": event_type, "sender": ALICE, "content": content, "room_id": ROOM}
            db.write(
                lambda tx, p=position, e=event_id, t=event_type, d=pdu, f=soft_failed, o=outlier: (
                    tx.execute(
                        "INSERT INTO events (stream_ordering, event_id, room_id, type, sender,"
                        " depth, origin_server_ts, json, soft_failed, outlier)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (p, e, ROOM, t, ALICE, p, p, json.dumps(d), f, o),
                    )
                )
            )
        migrate(db)
        assert found(db, "old") == ["$topic", "$old"]
        # And events stored afterwards are indexed beside them.
        events.position = 5
        events.add({"body": "old again"})
        assert found(db, "old") == ["$e6", "$topic", "$old"]
    finally:
        db.close()
