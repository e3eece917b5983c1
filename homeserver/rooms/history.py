"""What a user may read of a room: its state, members, single events and /messages, each as
the room's history visibility allows (spec: "History visibility"). Sync reads through here too.
"""

from __future__ import annotations

from typing import Callable, Optional

from homeserver.core.clock import now_ms
from homeserver.core.concurrency import in_turns
from homeserver.core.errors import forbidden, not_found
from homeserver.core.requester import Requester
from homeserver.federation.admission import Caller
from homeserver.rooms.aggregations import Aggregations
from homeserver.rooms.format import client_event
from homeserver.rooms.pagination import (
    EventFilter,
    EventScan,
    MessagesPage,
    parse_stream_token,
    stream_token,
)
from homeserver.rooms.versions import RoomVersion
from homeserver.rooms.visibility import HistoryView
from homeserver.storage.relations import RelationStore
from homeserver.storage.rooms import RoomStore, StoredEvent

# /messages: the most events one request returns, and how many batches it may read while
# skipping events the user may not see, so hidden history cannot make a request unbounded.
MAX_MESSAGES_LIMIT = 1000
# /context: the most events around the one asked for, before and after together.
MAX_CONTEXT_LIMIT = 100
# Events formatted for a client between two pauses: a big room's /state and /members.
FORMATTED_PER_TURN = 500
_MAX_SCAN_ROUNDS = 10
# Below every position: history is stored at negative ones (storage/history.py).
BOTTOM = -(2**62)

# backfill(room_id, caller) -> how many events it stored (rooms/backfill.py).
Backfill = Callable[[str, Caller], int]


class RoomHistory:
    def __init__(
        self,
        store: RoomStore,
        room_version: Callable[[str], RoomVersion],
        backfill: Optional[Backfill] = None,
    ):
        self.store = store
        self.room_version = room_version
        self._backfill = backfill
        # Bundled with the events of /event, /messages, /sync, /relations and /threads.
        self.aggregations = Aggregations(RelationStore(store.db), store.txn_ids_for)

    # --- reading ------------------------------------------------------------------------

    def history_view(self, room_id: str, user_id: str, changes: dict | None = None) -> HistoryView:
        """`changes`: the `state_changes` of `RoomStore.history_keys`, if the caller has read
        them already (a sync's snapshot has, for the rooms it looks into)."""
        member, visibility = RoomStore.history_keys(user_id)
        if changes is None:
            changes = self.store.state_changes(room_id, [member, visibility])
        return HistoryView(user_id, changes[member], changes[visibility])

    def readable_state_position(self, room_id: str, user_id: str, view: HistoryView) -> int | None:
        """Where the state a user may read is taken: None for the current state, or the
        position they left at. Raises 403 when they may read none."""
        if view.current_membership == "join" or view.world_readable_now:
            return None
        if view.leave_position is not None:
            return view.leave_position
        raise forbidden("You aren't a member of the room and weren't previously a member")

    def _readable_state(self, room_id: str, user_id: str, event_type: str | None = None) -> dict:
        self.room_version(room_id)
        position = self.readable_state_position(
            room_id, user_id, self.history_view(room_id, user_id)
        )
        if position is None:
            return self.store.current_state(room_id, event_type=event_type)
        return self.store.state_at(room_id, position, event_type)

    def state(self, requester: Requester, room_id: str) -> list[dict]:
        now = now_ms()
        events = sorted(
            self._readable_state(room_id, requester.user_id).values(),
            key=lambda s: s.stream_ordering,
        )
        return [client_event(s, now) for s in in_turns(events, FORMATTED_PER_TURN)]

    def state_event(
        self, requester: Requester, room_id: str, event_type: str, state_key: str
    ) -> dict:
        stored = self._readable_state(room_id, requester.user_id, event_type).get(
            (event_type, state_key)
        )
        if stored is None:
            raise not_found("Event not found")
        return client_event(stored, now_ms())

    def members(
        self,
        requester: Requester,
        room_id: str,
        at: str | None = None,
        membership: str | None = None,
        not_membership: str | None = None,
    ) -> list[dict]:
        self.room_version(room_id)
        view = self.history_view(room_id, requester.user_id)
        position = self.readable_state_position(room_id, requester.user_id, view)
        if at is not None:
            at_position = parse_stream_token(at, "at")
            position = at_position if position is None else min(position, at_position)
        if position is None:
            state = self.store.current_state(room_id, event_type="m.room.member")
        else:
            state = self.store.state_at(room_id, position, "m.room.member")
        now = now_ms()
        out = []
        by_user = sorted(state.values(), key=lambda s: s.event.state_key or "")
        for stored in in_turns(by_user, FORMATTED_PER_TURN):
            value = stored.event.membership
            if membership is None and not_membership is None:
                wanted = True
            else:
                wanted = (membership is not None and value == membership) or (
                    not_membership is not None and value != not_membership
                )
            if wanted:
                out.append(client_event(stored, now))
        return out

    def event(self, requester: Requester, room_id: str, event_id: str) -> dict:
        self.room_version(room_id)
        stored = self.store.get_event(event_id)
        view = self.history_view(room_id, requester.user_id)
        if stored is None or stored.event.room_id != room_id or not view.can_see(stored):
            raise not_found("Event not found")
        return self.client_chunk(requester, view, [stored])[0]

    def context(
        self,
        requester: Requester,
        room_id: str,
        event_id: str,
        limit: int,
        event_filter: EventFilter,
        lazy_load_members: bool = False,
    ) -> dict:
        """/context: the event, up to `limit` visible events around it (half before, as
        Synapse splits them), tokens /messages pages on from, and the state at the last
        event returned. 404 when the reader may not see the event, as /event."""
        self.room_version(room_id)
        view = self.history_view(room_id, requester.user_id)
        stored = self.store.get_event(event_id)
        if stored is None or stored.event.room_id != room_id or not view.can_see(stored):
            raise not_found("Event not found")
        if event_filter.limit is not None:
            limit = min(limit, event_filter.limit)
        limit = max(0, min(limit, MAX_CONTEXT_LIMIT))
        position = stored.stream_ordering
        current = self.store.stream_position()
        if view.current_membership != "join" and view.leave_position is not None:
            current = view.leave_position
        before = self.visible_events(
            room_id, view, BOTTOM, position - 1, True, limit // 2, event_filter
        )
        after = self.visible_events(
            room_id, view, position, current, False, limit - limit // 2, event_filter
        )
        chunk = self.client_chunk(requester, view, [stored, *before.events, *after.events])
        last = after.events[-1] if after.events else stored
        senders = {s.event.sender for s in (stored, *before.events, *after.events)}
        return {
            "event": chunk[0],
            "events_before": chunk[1 : 1 + len(before.events)],
            "events_after": chunk[1 + len(before.events) :],
            "start": stream_token(before.position),
            "end": stream_token(after.position),
            "state": self._context_state(room_id, last, event_filter, lazy_load_members, senders),
        }

    def _context_state(
        self,
        room_id: str,
        last: StoredEvent,
        event_filter: EventFilter,
        lazy_load_members: bool,
        senders: set[str],
    ) -> list[dict]:
        """The state after `last`, as Synapse gives it: kept by the filter, and with
        lazy_load_members only the members who sent the events returned."""
        state = self.store.state_at(room_id, last.stream_ordering)
        now = now_ms()
        return [
            client_event(s, now)
            for (event_type, state_key), s in sorted(
                state.items(), key=lambda item: item[1].stream_ordering
            )
            if event_filter.keeps(s)
            and not (
                lazy_load_members and event_type == "m.room.member" and state_key not in senders
            )
        ]

    def visible_events(
        self,
        room_id: str,
        view: HistoryView,
        after: int,
        up_to: int,
        backwards: bool,
        limit: int,
        event_filter: EventFilter,
    ) -> EventScan:
        """Up to `limit` events with `after < position <= up_to` that `view` may see and the
        filter keeps, newest first when `backwards`. It reads at most _MAX_SCAN_ROUNDS
        batches, so history hidden from the user cannot make one call unbounded."""
        position = up_to if backwards else after
        found: list[StoredEvent] = []
        for _ in range(_MAX_SCAN_ROUNDS):
            low, high = (after, position) if backwards else (position, up_to)
            if low >= high:
                return EventScan(found, position, True)
            wanted = limit - len(found)
            batch = self.store.room_events(
                room_id,
                low,
                high,
                backwards,
                wanted,
                event_filter.types,
                event_filter.not_types,
                event_filter.senders,
                event_filter.not_senders,
            )
            for stored in batch:
                position = stored.stream_ordering - 1 if backwards else stored.stream_ordering
                if view.can_see(stored) and event_filter.keeps_content(stored.event.content):
                    found.append(stored)
            if len(batch) < wanted:
                return EventScan(found, position, True)
            if len(found) >= limit:
                break
        return EventScan(found, position, False)

    def client_chunk(
        self, requester: Requester, view: HistoryView, visible: list[StoredEvent]
    ) -> list[dict]:
        """Events as the client sees them: its own transaction IDs, the membership the
        user had at each event (for the spec's `unsigned.membership`) and their bundled
        aggregations."""
        now = now_ms()
        own = [s.event.event_id for s in visible if s.event.sender == requester.user_id]
        txn_ids = self.store.txn_ids_for(requester.user_id, requester.device_id, own)
        chunk = [
            client_event(
                s,
                now,
                txn_ids.get(s.event.event_id),
                view.membership_after(s.stream_ordering) or "leave",
            )
            for s in visible
        ]
        self.aggregations.add_to(requester, view, visible, chunk, now)
        return chunk

    def _history_ends(
        self, scan: EventScan, bound: int | None, limit: int, caller: Caller | None, room_id: str
    ) -> bool:
        """Did a backward scan reach the oldest event we have, and a backfill store more?"""
        if self._backfill is None or caller is None or bound is not None:
            return False
        if not scan.exhausted or len(scan.events) >= limit:
            return False
        return self._backfill(room_id, caller) > 0

    def messages(
        self,
        requester: Requester,
        room_id: str,
        from_token: str | None,
        to_token: str | None,
        backwards: bool,
        limit: int,
        event_filter: EventFilter,
        caller: Caller | None = None,
    ) -> MessagesPage:
        """A page of /messages. Going back past the oldest event we have, `caller` (the
        client's admission) lets us backfill from a server in the room first."""
        self.room_version(room_id)
        view = self.history_view(room_id, requester.user_id)
        self.readable_state_position(room_id, requester.user_id, view)  # 403 if none
        if event_filter.limit is not None:
            limit = min(limit, event_filter.limit)
        limit = max(1, min(limit, MAX_MESSAGES_LIMIT))
        current = self.store.stream_position()
        if view.current_membership != "join" and view.leave_position is not None:
            current = view.leave_position  # a past member reads up to where they left
        if from_token is None:
            position = current if backwards else BOTTOM
        else:
            position = min(parse_stream_token(from_token, "from"), current)
        start = stream_token(position)
        bound = parse_stream_token(to_token, "to") if to_token is not None else None

        if backwards:
            low = BOTTOM if bound is None else bound
            scan = self.visible_events(room_id, view, low, position, True, limit, event_filter)
            if self._history_ends(scan, bound, limit, caller, room_id):
                more = self.visible_events(
                    room_id, view, low, scan.position, True, limit - len(scan.events), event_filter
                )
                scan = EventScan(scan.events + more.events, more.position, more.exhausted)
        else:
            scan = self.visible_events(
                room_id,
                view,
                position,
                current if bound is None else min(bound, current),
                False,
                limit,
                event_filter,
            )
        visible, position, exhausted = scan.events, scan.position, scan.exhausted

        chunk = self.client_chunk(requester, view, visible)
        # Going back, running out means the start of the room (no `end`), unless it was
        # the `to` token that stopped us: older events remain. Going forward, more may come
        # later, so a page with events always says where to resume.
        reached_start = backwards and not bound
        end = None if (exhausted and (reached_start or not chunk)) else stream_token(position)
        return MessagesPage(chunk, start, end)
