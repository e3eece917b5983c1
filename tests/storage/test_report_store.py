"""The reports kept for admins, and room tags as m.tag account data, on SQLite and on a real
PostgreSQL cluster."""

import pytest

from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.reports import Report, ReportStore
from homeserver.storage.sync import SyncStore

ALICE, BOB, ROOM = "@alice:x", "@bob:x", "!r:x"


@pytest.fixture
def database(database_url):
    database = open_database(database_url)
    migrate(database)
    yield database
    database.close()


def test_reports_are_listed_newest_first_a_page_at_a_time(database):
    store = ReportStore(database)
    store.add(ALICE, "event", 1, room_id=ROOM, event_id="$e", reason="rude", score=-100)
    store.add(ALICE, "room", 2, room_id=ROOM, reason="scam")
    store.add(BOB, "user", 3, target_user_id=ALICE, reason="")
    every = store.list()
    assert [(r.kind, r.reporter, r.received_ts) for r in every] == [
        ("user", BOB, 3),
        ("room", ALICE, 2),
        ("event", ALICE, 1),
    ]
    assert every[2] == Report(every[2].id, ALICE, "event", ROOM, "$e", None, "rude", -100, 1)
    first = store.list(limit=2)
    assert [r.kind for r in first] == ["user", "room"]
    assert [r.kind for r in store.list(limit=2, before_id=first[-1].id)] == ["event"]


def test_room_tags_change_one_tag_at_a_time(database):
    store = SyncStore(database)
    assert store.update_room_tag(ALICE, ROOM, "m.favourite", {"order": 0.5})
    assert store.update_room_tag(ALICE, ROOM, "u.work", {})
    # The same content again, or a tag that is not there removed: no write, no position.
    assert not store.update_room_tag(ALICE, ROOM, "u.work", {})
    assert not store.update_room_tag(ALICE, ROOM, "u.never", None)
    assert store.get_account_data(ALICE, ROOM, "m.tag") == {
        "tags": {"m.favourite": {"order": 0.5}, "u.work": {}}
    }
    assert store.update_room_tag(ALICE, ROOM, "m.favourite", None)
    assert store.get_account_data(ALICE, ROOM, "m.tag") == {"tags": {"u.work": {}}}
    changes = store.account_data_changes(ALICE, 0, 10**9)
    assert [(c.room_id, c.type) for c in changes] == [(ROOM, "m.tag")]
