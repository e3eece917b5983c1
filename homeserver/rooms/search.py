"""Server-side search of room events (`POST /search`, client-server spec "Server Side
Search"): the events of the user's joined rooms whose text matches the search term
(storage/search.py), best match or newest first, as far as history visibility lets the user
see each, with bundled aggregations, and optionally the events around each result, its
senders' profiles, the rooms' current state and the results grouped by room or sender.

Pages go by offset in the match list (`next_batch`); the events a page may not show are
skipped, at most _MAX_SCAN_ROUNDS reads a request."""

from __future__ import annotations

import re
from dataclasses import dataclass

from homeserver.core.errors import invalid_param
from homeserver.core.requester import Requester
from homeserver.rooms.history import BOTTOM, RoomHistory
from homeserver.rooms.pagination import EventFilter, stream_token
from homeserver.rooms.visibility import HistoryView
from homeserver.storage.rooms import StoredEvent
from homeserver.storage.search import SearchQuery, SearchStore, search_words

DEFAULT_LIMIT = 10
MAX_LIMIT = 50
MAX_CONTEXT = 20  # events before and after a result, each
_MAX_SCAN_ROUNDS = 5
_TOP = 2**62
_BATCH_TOKEN = re.compile(r"^o(\d{1,9})$")


@dataclass(frozen=True)
class Context:
    before_limit: int
    after_limit: int
    include_profile: bool


@dataclass(frozen=True)
class SearchRequest:
    term: str
    keys: tuple[str, ...]
    event_filter: EventFilter
    rooms: tuple | None
    not_rooms: tuple
    recent: bool
    context: Context | None
    include_state: bool
    group_by: tuple[str, ...]  # "room_id", "sender"
    next_batch: str | None


def _offset(token: str | None) -> int:
    if token is None:
        return 0
    m = _BATCH_TOKEN.match(token)
    if m is None:
        raise invalid_param("Unknown next_batch token")
    return int(m.group(1))


class RoomSearch:
    def __init__(self, history: RoomHistory):
        self.history = history
        self.store = SearchStore(history.store.db)

    def search(self, requester: Requester, req: SearchRequest) -> dict:
        rooms = [
            r
            for r in self.history.store.rooms_for_user(requester.user_id)
            if (req.rooms is None or r in req.rooms) and r not in req.not_rooms
        ]
        limit = max(1, min(req.event_filter.limit or DEFAULT_LIMIT, MAX_LIMIT))
        words = search_words(req.term)
        query = SearchQuery(rooms, words, list(req.keys), req.recent, _offset(req.next_batch), 0)
        views: dict[str, HistoryView] = {}
        found, offset, count = self._scan(requester, req, query, limit, views)
        results = self._results(requester, req, found, views)
        body: dict = {"results": results, "count": count, "highlights": sorted(set(words))}
        # Hidden hits may fill a whole read: the token still moves on past them.
        next_batch = f"o{offset}" if offset < count else None
        if next_batch is not None:
            body["next_batch"] = next_batch
        if req.include_state:
            body["state"] = {r: self.history.state(requester, r) for r in _rooms_of(found)}
        if req.group_by:
            body["groups"] = _groups(found, req.group_by, next_batch)
        return {"search_categories": {"room_events": body}}

    def _scan(
        self,
        requester: Requester,
        req: SearchRequest,
        query: SearchQuery,
        limit: int,
        views: dict[str, HistoryView],
    ) -> tuple[list[tuple[StoredEvent, float]], int, int]:
        """Up to `limit` matches the user may see and the filter keeps, the offset after the
        last one read, and the count of all matches."""
        found: list[tuple[StoredEvent, float]] = []
        offset, count = query.offset, 0
        for _ in range(_MAX_SCAN_ROUNDS):
            wanted = limit - len(found)
            q = SearchQuery(query.room_ids, query.words, query.keys, query.recent, offset, wanted)
            hits, count = self.store.search(q)
            for hit in hits:
                offset += 1
                room_id = hit.stored.event.room_id
                if room_id not in views:
                    views[room_id] = self.history.history_view(room_id, requester.user_id)
                if req.event_filter.keeps(hit.stored) and views[room_id].can_see(hit.stored):
                    found.append((hit.stored, hit.rank))
                    if len(found) == limit:
                        return found, offset, count
            if len(hits) < wanted:
                break
        return found, offset, count

    def _results(
        self,
        requester: Requester,
        req: SearchRequest,
        found: list[tuple[StoredEvent, float]],
        views: dict[str, HistoryView],
    ) -> list[dict]:
        """The results in their order, each room's events formatted together (one set of
        aggregation queries a room)."""
        formatted: dict[str, dict] = {}
        for room_id in _rooms_of(found):
            events = [s for s, _ in found if s.event.room_id == room_id]
            chunk = self.history.client_chunk(requester, views[room_id], events)
            formatted.update(zip((s.event.event_id for s in events), chunk))
        results = []
        for stored, rank in found:
            result: dict = {"rank": rank, "result": formatted[stored.event.event_id]}
            if req.context is not None:
                view = views[stored.event.room_id]
                result["context"] = self._context(requester, view, stored, req.context)
            results.append(result)
        return results

    def _context(
        self, requester: Requester, view: HistoryView, stored: StoredEvent, ctx: Context
    ) -> dict:
        """The events the user may see just before and after a result, and (if asked) the
        profiles of their senders as the room's current state has them."""
        room_id, position = stored.event.room_id, stored.stream_ordering
        everything = EventFilter()
        before = self.history.visible_events(
            room_id, view, BOTTOM, position - 1, True, ctx.before_limit, everything
        )
        after = self.history.visible_events(
            room_id, view, position, _TOP, False, ctx.after_limit, everything
        )
        body: dict = {
            "events_before": self.history.client_chunk(requester, view, before.events),
            "events_after": self.history.client_chunk(requester, view, after.events),
            "start": stream_token(before.position),
            "end": stream_token(after.position),
        }
        if ctx.include_profile:
            senders = {s.event.sender for s in [stored, *before.events, *after.events]}
            members = self.history.store.current_state(
                room_id, [("m.room.member", u) for u in sorted(senders)]
            )
            profiles = {}
            for (_, user_id), member in members.items():
                content = member.event.content
                profiles[user_id] = {
                    k: content[k]
                    for k in ("displayname", "avatar_url")
                    if isinstance(content.get(k), str)
                }
            body["profile_info"] = profiles
        return body


def _rooms_of(found: list[tuple[StoredEvent, float]]) -> list[str]:
    return list(dict.fromkeys(s.event.room_id for s, _ in found))


def _groups(
    found: list[tuple[StoredEvent, float]], group_by: tuple[str, ...], next_batch: str | None
) -> dict:
    """The spec's `groups`: per grouping key, each value's result IDs and its order (the
    place of its first result)."""
    groups: dict = {}
    for key in group_by:
        by_value: dict[str, dict] = {}
        for stored, _ in found:
            value = stored.event.room_id if key == "room_id" else stored.event.sender
            group = by_value.setdefault(value, {"order": len(by_value) + 1, "results": []})
            group["results"].append(stored.event.event_id)
        if next_batch is not None:
            for group in by_value.values():
                group["next_batch"] = next_batch
        groups[key] = by_value
    return groups
