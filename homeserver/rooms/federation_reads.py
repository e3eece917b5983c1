"""What other servers may read of our rooms: `/event`, `/state`, `/state_ids`,
`/event_auth`, `/backfill` and `/get_missing_events` (server-server spec, "Retrieving events"
and "Backfilling and retrieving missing events").

Who may read: a server the room's server ACL allows (rooms/server_acl.py) with a member
joined to the room now, or any such server when the room's history is world_readable now;
anyone else is told 403, as Synapse does ("Host not in room"). Which events: those whose
history visibility, at the event, lets the server see them (spec, history visibility
"server behaviour": world_readable and shared to every such server, invited to a server
that had a user invited or joined then, joined to one that had a user joined then). An
event it may not see is sent redacted where a list holds it (the graph stays whole) and is
not found on its own.

What is returned is capped: `limit`s by the constants below, state and auth chains by the
room itself.
"""

from __future__ import annotations

import bisect

from homeserver.core.clock import now_ms
from homeserver.core.errors import forbidden, not_found
from homeserver.core.identifiers import server_of
from homeserver.rooms.events import redact
from homeserver.rooms.federation_membership import MAX_AUTH_CHAIN
from homeserver.rooms.resolution import RoomResolver
from homeserver.rooms.server_acl import ServerAcls
from homeserver.rooms.service import RoomService
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.room_graph import RoomGraphStore
from homeserver.storage.rooms import StoredEvent

# Synapse serves at most 100 events for a backfill, and its own requests ask for fewer.
MAX_BACKFILL = 100
# get_missing_events is for filling small gaps (the spec's default limit is 10); a server
# missing more should backfill.
MAX_MISSING_EVENTS = 20
# backfill may start from several events; a handful is all a real gap needs.
MAX_BACKFILL_FROM = 20


class _ServerView:
    """What one server may see of one room, from its users' memberships and the room's
    history visibility, both over stream positions."""

    def __init__(
        self, memberships: list[tuple[int, str, str]], visibilities: list[tuple[int, str]]
    ):
        self._memberships = memberships
        self._visibility_positions = [p for p, _ in visibilities]
        self._visibilities = [v for _, v in visibilities]

    def _visibility_at(self, position: int) -> str:
        i = bisect.bisect_left(self._visibility_positions, position)
        return self._visibilities[i - 1] if i else "shared"

    def can_see(self, stored: StoredEvent) -> bool:
        visibility = self._visibility_at(stored.stream_ordering)
        if visibility in ("world_readable", "shared"):
            return True
        members: dict[str, str] = {}
        for position, user_id, membership in self._memberships:
            if position > stored.stream_ordering:
                break
            members[user_id] = membership
        allowed = {"join", "invite"} if visibility == "invited" else {"join"}
        return any(m in allowed for m in members.values())


class FederationReads:
    def __init__(self, rooms: RoomService, graph: RoomGraphStore, acls: ServerAcls):
        self.rooms = rooms
        self.graph = graph
        self.acls = acls

    def _admit(self, origin: str, room_id: str) -> tuple[RoomVersion, _ServerView]:
        """The room, if `origin` may read it at all."""
        version = self.rooms.room_version(room_id)
        self.acls.check(room_id, origin)
        store = self.rooms.store
        joined = any(server_of(u) == origin for u in store.joined_users(room_id))
        changes = store.state_changes(room_id, [("m.room.history_visibility", "")])
        visibilities = [
            (p, s.event.content.get("history_visibility") or "shared")
            for p, s in changes[("m.room.history_visibility", "")]
        ]
        world_readable = bool(visibilities) and visibilities[-1][1] == "world_readable"
        if not joined and not world_readable:
            raise forbidden("Host not in room.")
        view = _ServerView(self.graph.server_memberships(room_id, origin), visibilities)
        return version, view

    def _event(self, room_id: str, event_id: str) -> StoredEvent:
        stored = self.graph.event_in_room(room_id, event_id)
        if stored is None:
            raise not_found("Unknown event")
        return stored

    @staticmethod
    def _shown(version: RoomVersion, view: _ServerView, events: list[StoredEvent]) -> list[dict]:
        return [s.event.pdu if view.can_see(s) else redact(version, s.event.pdu) for s in events]

    def event(self, origin: str, event_id: str) -> dict:
        """`/event/{eventId}`: the PDU, if `origin` may see it."""
        stored = self.rooms.store.get_event(event_id)
        if stored is None:
            raise not_found("Unknown event")
        _, view = self._admit(origin, stored.event.room_id)
        if not view.can_see(stored):
            raise not_found("Unknown event")
        return stored.event.pdu

    def state(self, origin: str, room_id: str, event_id: str, ids_only: bool) -> dict:
        """`/state` and `/state_ids`: the state before `event_id` and its auth chain."""
        version, _ = self._admit(origin, room_id)
        stored = self._event(room_id, event_id)
        resolver = RoomResolver(self.rooms.store, version, room_id)
        before = resolver.stored_state_before(stored.event)
        state = sorted(before.values(), key=lambda s: s.stream_ordering)
        state_ids = [s.event.event_id for s in state]
        chain = self.graph.auth_chain(room_id, state_ids, MAX_AUTH_CHAIN)
        if ids_only:
            return {
                "pdu_ids": state_ids,
                "auth_chain_ids": [s.event.event_id for s in chain],
            }
        return {"pdus": [s.event.pdu for s in state], "auth_chain": [s.event.pdu for s in chain]}

    def event_auth(self, origin: str, room_id: str, event_id: str) -> dict:
        """`/event_auth`: the event's full auth chain."""
        self._admit(origin, room_id)
        self._event(room_id, event_id)
        chain = self.graph.auth_chain(room_id, [event_id], MAX_AUTH_CHAIN)
        return {"auth_chain": [s.event.pdu for s in chain]}

    def backfill(self, origin: str, room_id: str, from_ids: list[str], limit: int) -> dict:
        """`/backfill`: up to `limit` events from `from_ids` back, deepest first."""
        version, view = self._admit(origin, room_id)
        limit = max(0, min(limit, MAX_BACKFILL))
        events = self.graph.walk_back(room_id, from_ids[:MAX_BACKFILL_FROM], limit)
        events.reverse()
        return {
            "origin": self.rooms.server_name,
            "origin_server_ts": now_ms(),
            "pdus": self._shown(version, view, events),
        }

    def timestamp_to_event(self, origin: str, room_id: str, ts: int, forward: bool) -> dict:
        """`/timestamp_to_event`: our timeline's event closest to `ts` in that direction."""
        self._admit(origin, room_id)
        stored = self.rooms.store.event_near_ts(room_id, ts, forward)
        if stored is None:
            raise not_found("No event found")
        return {
            "event_id": stored.event.event_id,
            "origin_server_ts": stored.event.origin_server_ts,
        }

    def missing_events(
        self,
        origin: str,
        room_id: str,
        earliest: list[str],
        latest: list[str],
        limit: int,
        min_depth: int,
    ) -> dict:
        """`/get_missing_events`: the events between `earliest` and `latest`, oldest first
        (neither end included)."""
        version, view = self._admit(origin, room_id)
        limit = max(0, min(limit, MAX_MISSING_EVENTS))
        latest_events = self.graph.rooms.events_in_room(room_id, latest[:MAX_BACKFILL_FROM])
        parents = [p for s in latest_events.values() for p in s.event.prev_event_ids]
        events = self.graph.walk_back(
            room_id, parents, limit, stop=[*earliest, *latest], min_depth=min_depth
        )
        return {"events": self._shown(version, view, events)}
