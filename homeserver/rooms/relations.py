"""An event's children (`GET /relations`) and a room's threads (`GET /threads`), client-server
spec "Relationships", each a page at a time in stream order, with the events' bundled
aggregations (rooms/aggregations.py) and only what the reader may see of the room's history.

A reader who is not in the room and never was, of a room whose history is not world
readable, is refused (403, as Synapse does); a parent event they may not see is unknown
(404). Events hidden from the reader are skipped, at most _MAX_SCAN_ROUNDS batches a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.core.errors import not_found
from homeserver.core.requester import Requester
from homeserver.rooms.history import BOTTOM, RoomHistory
from homeserver.rooms.pagination import parse_stream_token, stream_token
from homeserver.rooms.visibility import HistoryView
from homeserver.storage.relations import MAX_RECURSION_DEPTH, ChildQuery, RelationStore
from homeserver.storage.rooms import StoredEvent

DEFAULT_LIMIT = 50
MAX_LIMIT = 100
THREADS_DEFAULT_LIMIT = 10
_MAX_SCAN_ROUNDS = 10
_TOP = 2**62


@dataclass(frozen=True)
class RelationsRequest:
    room_id: str
    parent_id: str
    rel_type: str | None
    event_type: str | None
    from_token: str | None
    to_token: str | None
    backwards: bool
    limit: int
    recurse: bool | None  # None: not asked, and no recursion_depth in the answer


class Relations:
    def __init__(self, history: RoomHistory):
        self.history = history
        self.store = RelationStore(history.store.db)

    def _view(self, requester: Requester, room_id: str) -> HistoryView:
        self.history.room_version(room_id)  # 404 for a room we do not know
        view = self.history.history_view(room_id, requester.user_id)
        self.history.readable_state_position(room_id, requester.user_id, view)  # 403 if none
        return view

    def relations(self, requester: Requester, req: RelationsRequest) -> dict:
        view = self._view(requester, req.room_id)
        parent = self.history.store.events_in_room(req.room_id, [req.parent_id])
        if req.parent_id not in parent or not view.can_see(parent[req.parent_id]):
            raise not_found("Unknown parent event")
        limit = max(1, min(req.limit, MAX_LIMIT))
        if req.from_token is not None:
            start = parse_stream_token(req.from_token, "from")
        else:
            start = self.history.store.stream_position() if req.backwards else BOTTOM
        bound = parse_stream_token(req.to_token, "to") if req.to_token is not None else None
        if req.backwards:
            low, high = (BOTTOM if bound is None else bound), start
        else:
            low, high = start, (_TOP if bound is None else bound)
        found, more_at = self._scan(req, view, low, high, limit)
        body: dict = {"chunk": self.history.client_chunk(requester, view, found)}
        if more_at is not None:
            body["next_batch"] = stream_token(more_at)
        if req.from_token is not None:
            body["prev_batch"] = req.from_token
        if req.recurse is not None:
            body["recursion_depth"] = MAX_RECURSION_DEPTH if req.recurse else 1
        return body

    def _scan(
        self, req: RelationsRequest, view: HistoryView, low: int, high: int, limit: int
    ) -> tuple[list[StoredEvent], int | None]:
        """Up to `limit` children the reader may see with `low < position <= high`, and the
        position to go on from if more may follow (None: the end)."""
        position = high if req.backwards else low
        found: list[StoredEvent] = []
        for _ in range(_MAX_SCAN_ROUNDS):
            lo, hi = (low, position) if req.backwards else (position, high)
            wanted = limit + 1 - len(found)  # one more tells whether a next page exists
            batch = self.store.children(
                ChildQuery(
                    req.room_id,
                    req.parent_id,
                    req.rel_type,
                    req.event_type,
                    bool(req.recurse),
                    lo,
                    hi,
                    req.backwards,
                    wanted,
                )
            )
            for stored in batch:
                position = stored.stream_ordering - (1 if req.backwards else 0)
                if view.can_see(stored):
                    found.append(stored)
            if len(found) > limit:
                last = found[limit - 1].stream_ordering
                return found[:limit], last - 1 if req.backwards else last
            if len(batch) < wanted:
                return found, None
        return found, position

    def threads(
        self,
        requester: Requester,
        room_id: str,
        participated: bool,
        limit: int,
        from_token: str | None,
    ) -> dict:
        """The room's thread roots the reader may see, latest thread activity first."""
        view = self._view(requester, room_id)
        limit = max(1, min(limit, MAX_LIMIT))
        below = _TOP if from_token is None else parse_stream_token(from_token, "from")
        participant = requester.user_id if participated else None
        found: list[tuple[StoredEvent, int]] = []
        more = False
        for _ in range(_MAX_SCAN_ROUNDS):
            wanted = limit + 1 - len(found)
            rows = self.store.threads(room_id, below, wanted, participant)
            for root, latest in rows:
                below = latest
                if root is not None and view.can_see(root):
                    found.append((root, latest))
            more = len(rows) == wanted  # the room's rows, before any was kept out
            if len(found) > limit or not more:
                break
        body: dict = {
            "chunk": self.history.client_chunk(requester, view, [r for r, _ in found[:limit]])
        }
        if len(found) > limit:
            body["next_batch"] = stream_token(found[limit - 1][1])
        elif more:
            body["next_batch"] = stream_token(below)
        return body
