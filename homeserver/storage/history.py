"""Events stored as history: behind the room's timeline, never current state.

Backfilled events and the state and auth events fetched to fill a gap
(homeserver/rooms/backfill.py, rooms/gaps.py) are stored here, at negative stream positions
taken from the `history` counter (0024_history.sql): newest first, each lower than any
before it. They are not forward extremities, they do not touch current state or room stats,
and nothing wakes a sync for them (a sync reads forward of its token). An event already
stored is skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from homeserver.core.events import Event
from homeserver.storage import auth_chains, event_state, streams
from homeserver.storage.database import Database, in_lists
from homeserver.storage.event_rows import insert_event_row

HISTORY_STREAM = "history"

StateKey = tuple[str, str]


@dataclass(frozen=True)
class HistoryEvent:
    """An event to store as history; `state_before`, when known, gives it a state group.
    `hidden`: one the current state refuses, stored for the room's graph, never shown to
    clients. `outlier`: a send_join answer's state and auth chain, or the state and auth
    events fetched at a gap: valid state but no part of the timeline
    (0027_outliers.sql)."""

    event: Event
    state_before: Mapping[StateKey, str] | None = None
    hidden: bool = False
    outlier: bool = False


class HistoryStore:
    def __init__(self, db: Database):
        self.db = db

    def store(self, events: list[HistoryEvent]) -> list[str]:
        """Stores `events` (one room, newest first: each gets a lower position than the one
        before it) in one transaction; returns the IDs of those that were new."""
        if not events:
            return []
        return self.db.write(store_history, events)

    def oldest(self, room_id: str, count: int) -> list[Event]:
        """The `count` events of the room's timeline lowest in the stream: where its history
        ends (hidden events and outliers are no part of it)."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT event_id, json FROM events WHERE room_id = ? AND soft_failed = 0"
                " AND outlier = 0 ORDER BY stream_ordering LIMIT ?",
                (room_id, count),
            )
        )
        return [Event(r[0], json.loads(r[1])) for r in rows]

    def stored(self, event_ids: list[str]) -> set[str]:
        return self.db.read(_stored_ids, event_ids)

    def stored_or_rejected(self, event_ids: list[str]) -> set[str]:
        """Those of `event_ids` stored or rejected, in one read."""
        return self.db.read(_stored_or_rejected_ids, event_ids)


def store_history(tx, events: list[HistoryEvent]) -> list[str]:
    """`HistoryStore.store` inside a caller's transaction (a remote join's outliers)."""
    known = _stored_ids(tx, [h.event.event_id for h in events])
    new = [h for h in events if h.event.event_id not in known]
    new = list({h.event.event_id: h for h in new}.values())
    if not new:
        return []
    last = streams.advance(tx, HISTORY_STREAM, len(new))
    for offset, item in enumerate(new):
        position = -(last - len(new) + 1 + offset)
        event = item.event
        if item.state_before is not None:
            event_state.record_state(tx, event, item.state_before, local=False)
        insert_event_row(tx, event, position, None, item.hidden, item.outlier)
    auth_chains.index_events(tx, [h.event for h in new])
    return [h.event.event_id for h in new]


def _stored_or_rejected_ids(tx, event_ids: list[str]) -> set[str]:
    found = _stored_ids(tx, event_ids)
    for chunk, marks in in_lists([e for e in dict.fromkeys(event_ids) if e not in found]):
        found.update(
            r[0]
            for r in tx.fetchall(
                f"SELECT event_id FROM rejected_events WHERE event_id IN ({marks})", tuple(chunk)
            )
        )
    return found


def _stored_ids(tx, event_ids: list[str]) -> set[str]:
    found: set[str] = set()
    for chunk, marks in in_lists(list(dict.fromkeys(event_ids))):
        found.update(
            r[0]
            for r in tx.fetchall(
                f"SELECT event_id FROM events WHERE event_id IN ({marks})", tuple(chunk)
            )
        )
    return found
