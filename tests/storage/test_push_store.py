"""Push actions as the persist path writes them, on SQLite and PostgreSQL (where each event's
rows are one statement): every row of a batch of several events is kept, a repeated row is
kept once, a soft-failed event gets none, and the unread counts read them back."""

import json

from homeserver.storage.push import PushAction, PushStore
from tests.storage.test_relations_store import ALICE, BOB, ROOM, Events

CAROL = "@carol:x"


def test_a_batch_of_events_keeps_every_row_once_and_none_for_a_hidden_event(db):
    events = Events(db)
    first = events.add(ALICE, {"body": "hi"}).event.event_id
    hidden = events.add(ALICE, {"body": "hidden"}, soft_failed=True).event.event_id
    second = events.add(ALICE, {"body": "@bob"}).event.event_id
    notify, loud = ["notify"], ["notify", {"set_tweak": "highlight"}]
    batch = [
        PushAction(BOB, first, "main", False, notify),
        PushAction(CAROL, first, "main", False, notify),
        PushAction(BOB, hidden, "main", False, notify),
        PushAction(BOB, second, "$root", True, loud),
        PushAction(BOB, second, "$root", True, loud),  # the same row twice: kept once
        PushAction(CAROL, second, "main", False, notify),
    ]
    db.write(lambda tx: PushStore.insert_push_actions(tx, batch))

    rows = db.read(
        lambda tx: tx.fetchall(
            "SELECT user_id, event_id, stream_ordering, thread_id, highlight, actions"
            " FROM event_push_actions ORDER BY event_id, user_id"
        )
    )
    assert [(*r[:5], json.loads(r[5])) for r in rows] == [
        (BOB, first, 1, "main", 0, notify),
        (CAROL, first, 1, "main", 0, notify),
        (BOB, second, 3, "$root", 1, loud),
        (CAROL, second, 3, "main", 0, notify),
    ]
    assert PushStore(db).unread_counts_of([BOB, CAROL], [ROOM]) == {
        BOB: {ROOM: {"main": (1, 0), "$root": (1, 1)}},
        CAROL: {ROOM: {"main": (2, 0)}},
    }
