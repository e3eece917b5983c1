"""Walks of a room's event graph for serving other servers: an event's auth chain, backfill
and missing events (the state before an event is rooms/resolution.py's).

Every walk stays inside one room and stops at a count given by the caller, so what a remote
server can ask for is bounded by the room and by that cap, never by the request.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Mapping, Sequence

from homeserver.core.identifiers import server_of
from homeserver.storage import auth_chains
from homeserver.storage.database import Database, in_lists
from homeserver.storage.parsed_events import PARSED
from homeserver.storage.rooms import RoomStore, StoredEvent


def _stored(row) -> StoredEvent:
    return StoredEvent(PARSED.event(row[1], row[2]), row[0])


class RoomGraphStore:
    def __init__(self, db: Database, rooms: RoomStore):
        self.db = db
        self.rooms = rooms

    def _events(self, tx, room_id: str, event_ids: Iterable[str]) -> list[StoredEvent]:
        found: list[StoredEvent] = []
        for chunk, marks in in_lists(list(event_ids)):
            # By ID alone, the room checked here (storage/rooms.py, events_in_room).
            found += [
                _stored(r)
                for r in tx.fetchall(
                    "SELECT stream_ordering, event_id, json, room_id FROM events"
                    f" WHERE event_id IN ({marks})",
                    chunk,
                )
                if r[3] == room_id
            ]
        return found

    def events(self, room_id: str, event_ids: Iterable[str]) -> list[StoredEvent]:
        """Those of `event_ids` stored in the room, read in chunks however many."""
        return self.db.read(self._events, room_id, list(event_ids))

    def auth_difference(
        self, state_sets: Sequence[Mapping], pending: Mapping[str, Sequence[str]]
    ) -> set[str] | None:
        """The auth difference of the state sets, by the index (storage/auth_chains.py);
        `pending`: their events not stored yet, with their auth event IDs. None when one of
        their other events is not indexed."""
        return self.db.read(auth_chains.auth_difference, state_sets, pending)

    def event_in_room(self, room_id: str, event_id: str) -> StoredEvent | None:
        return self.rooms.events_in_room(room_id, [event_id]).get(event_id)

    def auth_chain(self, room_id: str, event_ids: Iterable[str], limit: int) -> list[StoredEvent]:
        """The auth events of `event_ids`, theirs, and so on (not the events themselves),
        oldest first; at most `limit` of them."""

        def walk(tx):
            seen: dict[str, StoredEvent] = {}
            frontier = {
                a for e in self._events(tx, room_id, event_ids) for a in e.event.auth_event_ids
            }
            while frontier and len(seen) < limit:
                layer = self._events(tx, room_id, frontier - seen.keys())
                for stored in layer:
                    seen[stored.event.event_id] = stored
                frontier = {a for s in layer for a in s.event.auth_event_ids} - seen.keys()
            return sorted(seen.values(), key=lambda s: s.stream_ordering)[:limit]

        return self.db.read(walk)

    def walk_back(
        self,
        room_id: str,
        start: Iterable[str],
        limit: int,
        stop: Iterable[str] = (),
        min_depth: int = 0,
    ) -> list[StoredEvent]:
        """Events reached from `start` (included) through prev_events, deepest first, not
        past `stop` nor below `min_depth`; at most `limit`, sorted oldest (least deep) first."""
        stop_ids = set(stop)

        def walk(tx):
            found: dict[str, StoredEvent] = {}
            queue: list[tuple[int, str, StoredEvent]] = []
            for stored in self._events(tx, room_id, set(start) - stop_ids):
                heapq.heappush(queue, (-stored.event.depth, stored.event.event_id, stored))
            while queue and len(found) < limit:
                _, event_id, stored = heapq.heappop(queue)
                if event_id in found or stored.event.depth < min_depth:
                    continue
                found[event_id] = stored
                parents = set(stored.event.prev_event_ids) - stop_ids - found.keys()
                for parent in self._events(tx, room_id, parents):
                    heapq.heappush(queue, (-parent.event.depth, parent.event.event_id, parent))
            return sorted(found.values(), key=lambda s: (s.event.depth, s.stream_ordering))

        return self.db.read(walk)

    def server_memberships(self, room_id: str, server_name: str) -> list[tuple[int, str, str]]:
        """(position, user_id, membership) of every member event in the room about a user
        of `server_name`, oldest first: what a server could see, when, is read from it."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT stream_ordering, state_key, membership FROM events"
                " WHERE room_id = ? AND type = 'm.room.member' AND state_key IS NOT NULL"
                " ORDER BY stream_ordering",
                (room_id,),
            )
        )
        # Matched here, not with LIKE: a server name may hold `_`, a LIKE wildcard; and
        # by the whole server part, not its end (`8448` is no server of `@u:host:8448`).
        return [(r[0], r[1], r[2]) for r in rows if server_of(r[1]) == server_name]
