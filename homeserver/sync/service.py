"""Long-poll /sync (client-server spec, "Syncing").

A sync reads the streams' positions first and computes everything up to them, so the
next_batch it returns covers exactly what it sent. An initial sync (no `since`) gives each
room's state and its latest timeline events; an incremental one what changed after the
token. When nothing did, the sync waits on the notifier (see notifier.py) until something
concerning the user happens or `timeout` passes (a `WaitingSync`, which the HTTP layer waits
for once Flask is done with the request); a sync that times out returns an empty response
whose next_batch is the `since` it was given.

Rooms are read at the position the sync reads up to: the user's membership there decides
the section (join, invite, knock, leave). A room the user joined since the token is sent
whole (full state, latest events); one they left gets its events up to the leave.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from homeserver.core.clock import now_ms
from homeserver.core.json_text import EncodedJson
from homeserver.core.requester import Requester
from homeserver.e2ee.sync_part import E2eeSync, E2eeSyncPart, Range
from homeserver.rooms.format import client_event
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.pagination import stream_token
from homeserver.rooms.service import RoomService
from homeserver.rooms.visibility import HistoryView
from homeserver.storage.rooms import StoredEvent
from homeserver.storage.sync import StreamPositions, SyncSnapshot, SyncStore
from homeserver.sync.filters import Filters, SyncFilter, project
from homeserver.sync.notifier import Notifier, Waiter
from homeserver.sync.out_of_room import out_of_room
from homeserver.sync.side_streams import ephemeral_events, global_account_data, room_account_data
from homeserver.sync.tokens import SyncToken
from homeserver.sync.typing import TypingNotifications
from homeserver.sync.woken import Seen, WokenAnswers, answers_from_events

# The longest a sync may wait. Each waiting sync holds a greenlet and a connection (no
# main-pool place: the HTTP layer gives it back while it waits); clients ask for 30 s and
# reconnect at once, so a longer wait saves nothing worth the risk of connections held past
# what proxies in between allow.
MAX_TIMEOUT_MS = 5 * 60 * 1000
# Members named in a room summary when the room has no name (the spec's "first 5").
HEROES = 5
# What an invitee or a knocker sees of a room (the spec's "stripped state").
STRIPPED_STATE_KEYS = [
    (t, "")
    for t in (
        "m.room.create",
        "m.room.join_rules",
        "m.room.name",
        "m.room.avatar",
        "m.room.canonical_alias",
        "m.room.encryption",
        "m.room.topic",
    )
]
# A room summary is sent again when an event of one of these types is sent with the room.
_SUMMARY_TYPES = frozenset({"m.room.member", "m.room.name", "m.room.canonical_alias"})


@dataclass(frozen=True)
class SyncRequest:
    requester: Requester
    since: SyncToken | None
    filter: SyncFilter
    full_state: bool = False
    use_state_after: bool = False

    @property
    def user_id(self) -> str:
        return self.requester.user_id


@dataclass
class _Batch:
    """What one response covers: the positions it reads up to, and what changed since the
    token outside rooms' timelines (account data, receipts, typing), by room."""

    positions: StreamPositions
    now: int
    read_ahead: SyncSnapshot  # where the positions come from: member moves, history views
    account_data: dict = field(default_factory=lambda: defaultdict(list))
    receipts: dict = field(default_factory=lambda: defaultdict(list))
    typing: dict = field(default_factory=dict)
    typing_position: int = 0


@dataclass(frozen=True)
class _Timeline:
    events: list[StoredEvent]  # oldest first
    limited: bool
    prev_batch: str
    start: int  # the stream position of the first event, or just past the range if none


class WaitingSync:
    """A sync with nothing to send yet. It is registered with the notifier from before its
    first computation (SyncService.begin), so whatever is stored meanwhile wakes it, until
    `close`, on every way out. `answer` waits until something concerning its user happens or
    its timeout passes. The HTTP layer waits for it once the application has returned
    (api/client/sync.py), so a parked sync holds its registration, what it last saw and its
    socket, and nothing of the web framework's."""

    __slots__ = ("_service", "_request", "_deadline", "_waiter", "_seen")

    def __init__(self, service: "SyncService", request: SyncRequest, deadline: float):
        self._service = service
        self._request = request
        self._deadline = deadline
        self._waiter: Waiter | None = service.notifier.registered(request.user_id).__enter__()
        self._seen: Seen | None = None  # what a computation found nothing new in, if usable

    def answer(self, while_waiting=contextlib.nullcontext) -> dict | EncodedJson:
        """Waits, then the answer. `while_waiting()` is entered around each wait: the HTTP
        layer gives its work place back there, and watches for the client hanging up."""
        try:
            while True:
                waiter = self._waiter
                assert waiter is not None, "answered after close"
                with while_waiting():
                    woken = waiter.woken.wait(max(0.0, self._deadline - time.monotonic()))
                body = self.step(woken)
                if body is not None:
                    return body
        finally:
            self.close()

    def step(self, woken: bool) -> dict | EncodedJson | None:
        """One computation: the answer to send now, or None to wait again."""
        service, request, waiter, seen = self._service, self._request, self._waiter, self._seen
        assert waiter is not None, "computed after close"
        quick = woken and seen is not None and not waiter.recompute
        waiter.clear()
        found = None
        if quick and seen is not None:
            found = service.woken.answer(request.requester, request.filter, seen, now_ms())
        if woken:
            service.on_wake("database" if found is None else "recent_events")
        body: dict | EncodedJson | None
        if found is None:
            body, has_updates, self._seen = service._respond(request)
        else:
            body, self._seen = found
            has_updates = body is not None
        if has_updates or self._deadline <= time.monotonic() or service.notifier.closed:
            return body if body is not None else service._respond(request)[0]
        return None

    def close(self) -> None:
        """Ends the registration; once is enough, and more are harmless."""
        if self._waiter is not None:
            self._waiter.__exit__(None, None, None)
            self._waiter = None


class SyncService:
    def __init__(
        self,
        rooms: RoomService,
        history: RoomHistory,
        store: SyncStore,
        notifier: Notifier,
        typing: TypingNotifications,
        filters: Filters,
        e2ee: E2eeSync | None = None,
        on_wake: Callable[[str], None] = lambda answered_from: None,
    ):
        self.rooms = rooms
        self.history = history
        self.store = store
        self.notifier = notifier
        self.typing = typing
        self.filters = filters
        self.e2ee = e2ee
        self.woken = WokenAnswers(notifier.recent, e2ee, self._lazy_members)
        self.on_wake = on_wake  # "recent_events" or "database", for each woken sync

    def sync(self, *args, **kwargs) -> dict | EncodedJson:
        """`begin`'s /sync response, waited for here when there is nothing to send yet, as
        in-process callers want it (the HTTP layer waits outside Flask: api/client/sync.py)."""
        found = self.begin(*args, **kwargs)
        return found.answer() if isinstance(found, WaitingSync) else found

    def begin(
        self,
        requester: Requester,
        since: str | None,
        timeout_ms: int,
        full_state: bool,
        filter_param: str | None,
        use_state_after: bool = False,
    ) -> dict | EncodedJson | WaitingSync:
        """The /sync response, encoded already when a woken sync answers from the events
        that woke it (woken.py); or, when there is nothing to send yet and the client asked
        to wait, a WaitingSync, registered with the notifier, whose caller waits for it."""
        request = SyncRequest(
            requester,
            SyncToken.parse(since) if since else None,
            self.filters.resolve(requester.user_id, filter_param),
            full_state,
            use_state_after,
        )
        timeout = min(timeout_ms, MAX_TIMEOUT_MS) / 1000
        if request.since is None or full_state or timeout <= 0:
            return self._respond(request)[0]
        waiting = WaitingSync(self, request, time.monotonic() + timeout)
        try:
            body = waiting.step(woken=False)
        except BaseException:
            waiting.close()
            raise
        if body is None:
            return waiting
        waiting.close()
        return body

    # --- one computation ----------------------------------------------------------------

    def _respond(self, request: SyncRequest) -> tuple[dict, bool, Seen | None]:
        """(the answer, whether it has anything new, what a woken sync may answer on from
        recent events when it has not: see woken.py)."""
        since = request.since
        incremental_from = since.events if since is not None and not request.full_state else None
        snapshot = self.store.snapshot(
            request.user_id, incremental_from, request.filter.room.keeps_room
        )
        batch = _Batch(snapshot.positions, now_ms(), snapshot)
        memberships, raced = self._memberships_at(request, snapshot)
        joined = [
            room_id for room_id, (membership, _) in memberships.items() if membership == "join"
        ]
        self._read_side_streams(request, batch, joined)

        rooms: dict = {"join": {}, "invite": {}, "knock": {}, "leave": {}}
        for room_id, (membership, changed_at) in memberships.items():
            changed = since is None or changed_at > since.events
            if membership == "join":
                has_events = (
                    snapshot.rooms_with_events is None
                    or room_id in raced
                    or room_id in snapshot.rooms_with_events
                )
                entry = self._joined_room(request, batch, room_id, changed, has_events)
                section = "join"
            elif room_id in snapshot.out_of_room:
                shown = snapshot.out_of_room[room_id]
                section, entry = out_of_room(request.filter, since, membership, shown, changed_at)
            elif membership in ("invite", "knock"):
                entry = self._stripped_room(request, room_id, membership) if changed else None
                section = membership
            else:  # leave or ban
                entry = self._left_room(request, batch, room_id, changed_at) if changed else None
                section = "leave"
            if entry is not None:
                rooms[section][room_id] = entry

        account_data = global_account_data(
            request.filter.account_data, batch.account_data, request.user_id, since is None
        )
        e2ee = self._e2ee_part(request, batch)
        has_updates = bool(account_data or any(rooms.values()) or e2ee.has_updates)
        next_batch = since
        if since is None or has_updates:
            positions = batch.positions
            next_batch = SyncToken(
                positions.events,
                positions.account_data,
                positions.receipts,
                batch.typing_position,
                self.typing.epoch,
                e2ee.to_device_position,
                positions.device_lists,
            )
        body = {
            "next_batch": str(next_batch),
            "account_data": {"events": account_data},
            "rooms": rooms,
            **e2ee.fields(),
        }
        seen = None
        if (
            not has_updates
            and since is not None
            and answers_from_events(request.filter, request.full_state, request.use_state_after)
        ):
            seen = Seen(
                since,
                batch.positions.events,
                *_joined_and_all(joined, snapshot.memberships),
                e2ee.key_counts,
            )
        return body, has_updates, seen

    def _e2ee_part(self, request: SyncRequest, batch: _Batch) -> E2eeSyncPart:
        """To-device messages and device lists (e2ee/sync_part.py)."""
        if self.e2ee is None:
            return E2eeSyncPart()
        since, positions = request.since, batch.positions
        span = Range(
            since.events if since else None,
            positions.events,
            since.device_lists if since else 0,
            positions.device_lists,
            since.to_device if since else 0,
            positions.to_device,
        )
        return self.e2ee.part(request.requester, span, batch.read_ahead.member_moves)

    def _memberships_at(
        self, request: SyncRequest, snapshot: SyncSnapshot
    ) -> tuple[dict, set[str]]:
        """{room_id: (membership, where it was set)} as of the snapshot's event position,
        for the rooms the filter keeps; and the rooms whose membership changed after that
        position was read (their other reads are not in the snapshot)."""
        out, raced = {}, set()
        position = snapshot.positions.events
        for room_id, membership, changed_at in snapshot.memberships:
            if not request.filter.room.keeps_room(room_id):
                continue
            if changed_at > position:
                view = self.history.history_view(room_id, request.user_id)
                membership_then = view.membership_after(position)
                changed_then = view.last_membership_change(position)
                if membership_then is None or changed_then is None:
                    continue
                membership, changed_at = membership_then, changed_then
                raced.add(room_id)
            out[room_id] = (membership, changed_at)
        return out, raced

    def _read_side_streams(self, request: SyncRequest, batch: _Batch, joined: list[str]) -> None:
        """Account data, receipts and typing changed since the token, by room."""
        since = request.since
        positions = batch.positions
        after = since.account_data if since else 0
        if positions.account_data > after:
            for item in self.store.account_data_changes(
                request.user_id, after, positions.account_data
            ):
                batch.account_data[item.room_id].append(item)
        after = since.receipts if since else 0
        if positions.receipts > after and joined:
            for receipt in self.store.receipt_changes(joined, after, positions.receipts):
                if receipt.receipt_type == "m.read.private" and receipt.user_id != request.user_id:
                    continue
                batch.receipts[receipt.room_id].append(receipt)
        # No yield between these two lines: the position covers exactly these changes.
        batch.typing = self.typing.changes(
            joined, since.typing_since(self.typing.epoch) if since else 0
        )
        batch.typing_position = self.typing.position

    # --- rooms --------------------------------------------------------------------------

    def _joined_room(
        self,
        request: SyncRequest,
        batch: _Batch,
        room_id: str,
        membership_changed: bool,
        has_events: bool,
    ) -> dict | None:
        since = request.since
        up_to = batch.positions.events
        view = None
        newly_joined = since is None
        if membership_changed and since is not None:
            view = self.history.history_view(room_id, request.user_id)
            newly_joined = view.membership_after(since.events) != "join" or any(
                m != "join" for m in view.memberships_between(since.events, up_to)
            )
        ephemeral = ephemeral_events(
            request.filter.room.ephemeral, batch.typing, batch.receipts, room_id
        )
        account_data = room_account_data(
            request.filter.room.account_data, batch.account_data, room_id
        )
        if not (
            newly_joined
            or has_events
            or request.full_state
            or ephemeral
            or account_data
            or membership_changed
        ):
            return None
        read = batch.read_ahead.history.get(room_id)
        view = view or self.history.history_view(room_id, request.user_id, read)
        # Not newly joined means an incremental sync: `since` is set.
        timeline_after = 0 if newly_joined or since is None else since.events
        state_after = 0 if (newly_joined or request.full_state or since is None) else since.events
        timeline = self._timeline(request, room_id, view, timeline_after, up_to)
        state = self._state(request, room_id, timeline, state_after, up_to)
        if not (
            timeline.events
            or state
            or ephemeral
            or account_data
            or newly_joined
            or request.full_state
        ):
            return None
        entry = {
            "timeline": {
                "events": self._format(request, batch.now, view, timeline.events),
                "limited": timeline.limited,
                "prev_batch": timeline.prev_batch,
            },
            "ephemeral": {"events": ephemeral},
            "account_data": {"events": account_data},
            "summary": {},
        }
        self._put_state(request, batch.now, view, room_id, entry, state, timeline, up_to)
        touched = [s.event.type for s in timeline.events] + [k[0] for k in state]
        if newly_joined or request.full_state or _SUMMARY_TYPES.intersection(touched):
            entry["summary"] = self._summary(request.user_id, room_id)
        return entry

    def _left_room(
        self, request: SyncRequest, batch: _Batch, room_id: str, left_at: int
    ) -> dict | None:
        """A room the user left or was banned from: its events up to the leave. Rooms left
        before the token are not sent again; on an initial sync only with include_leave."""
        since = request.since
        if since is None and not request.filter.room.include_leave:
            return None
        view = self.history.history_view(room_id, request.user_id)
        after = since.events if since else 0
        before = [view.membership_after(after)] + view.memberships_between(after, left_at)
        if not {"join", "invite", "knock"}.intersection(before):
            return None  # they were never in it in this range: nothing to tell them
        timeline = self._timeline(request, room_id, view, after, left_at)
        state = {}
        if "join" in view.memberships_between(0, left_at):
            # State is for those who were members; an invitee who declined sees only their
            # own membership, in the timeline. full_state asks for all of it here too.
            joined_at_token = view.membership_after(after) == "join"
            state_after = after if joined_at_token and not request.full_state else 0
            state = self._state(request, room_id, timeline, state_after, left_at)
        entry = {
            "timeline": {
                "events": self._format(request, batch.now, view, timeline.events),
                "limited": timeline.limited,
                "prev_batch": timeline.prev_batch,
            },
            "account_data": {
                "events": room_account_data(
                    request.filter.room.account_data, batch.account_data, room_id
                )
            },
        }
        self._put_state(request, batch.now, view, room_id, entry, state, timeline, left_at)
        return entry

    def _stripped_room(self, request: SyncRequest, room_id: str, membership: str) -> dict:
        """An invite or a knock: the room as the spec's stripped state, with the user's own
        member event last."""
        keys = STRIPPED_STATE_KEYS + [("m.room.member", request.user_id)]
        state = self.rooms.store.current_state(room_id, keys)
        events = [
            {
                "type": s.event.type,
                "state_key": s.event.state_key,
                "content": s.event.content,
                "sender": s.event.sender,
            }
            for s in sorted(state.values(), key=lambda s: s.stream_ordering)
        ]
        key = "invite_state" if membership == "invite" else "knock_state"
        return {key: {"events": events}}

    def _timeline(
        self, request: SyncRequest, room_id: str, view: HistoryView, after: int, up_to: int
    ) -> _Timeline:
        """The latest events with `after < position <= up_to` the user may see and the
        filter keeps, up to the filter's limit; `limited` when some were left out."""
        room_filter = request.filter.room
        timeline_filter = room_filter.timeline
        if not timeline_filter.keeps_room(room_id):
            return _Timeline([], False, stream_token(up_to), up_to + 1)
        limit = room_filter.timeline_limit
        scan = self.history.visible_events(
            room_id, view, after, up_to, True, limit + 1, timeline_filter
        )
        limited = len(scan.events) > limit or not scan.exhausted
        events = scan.events[:limit]
        events.reverse()
        if events:
            return _Timeline(
                events,
                limited,
                stream_token(events[0].stream_ordering - 1),
                events[0].stream_ordering,
            )
        start = scan.position if limited else up_to
        return _Timeline([], limited, stream_token(start), start + 1)

    def _state(
        self,
        request: SyncRequest,
        room_id: str,
        timeline: _Timeline,
        changed_after: int,
        up_to: int,
    ) -> dict:
        """{(type, state_key): event} for the state section: the state at the start of the
        timeline that changed after `changed_after` (0: all of it), or, with
        use_state_after, the state at its end."""
        if request.use_state_after:
            return self.rooms.store.state_at(room_id, up_to, changed_after=changed_after)
        timeline_filter = request.filter.room.timeline
        hides_events = timeline_filter.may_hide_events
        state: dict = {}
        if changed_after == 0 or timeline.limited or hides_events:
            state = self.rooms.store.state_at(
                room_id, timeline.start - 1, changed_after=changed_after
            )
        if hides_events and timeline.start <= up_to:
            # State events the filter kept out of the timeline would otherwise never reach
            # the client: send the latest of each, unless the timeline sets the same key.
            in_timeline = {
                (s.event.type, s.event.state_key) for s in timeline.events if s.event.is_state
            }
            later = self.rooms.store.state_at(room_id, up_to, changed_after=timeline.start - 1)
            state.update({k: s for k, s in later.items() if k not in in_timeline})
        return state

    def _lazy_members(
        self, requester: Requester, sync_filter: SyncFilter, room_id: str, events: list, now: int
    ) -> list[dict]:
        """A woken answer's state section when its filter lazy-loads members (woken.py):
        what `_put_state` sends for a timeline of `events` and no state change."""
        request = SyncRequest(requester, None, sync_filter)
        view = self.history.history_view(room_id, requester.user_id)
        timeline = _Timeline(events, False, "", events[0].stream_ordering)
        entry: dict = {}
        up_to = events[-1].stream_ordering
        self._put_state(request, now, view, room_id, entry, {}, timeline, up_to)
        return entry["state"]["events"]

    def _put_state(
        self,
        request: SyncRequest,
        now: int,
        view: HistoryView,
        room_id: str,
        entry: dict,
        state: dict,
        timeline: _Timeline,
        up_to: int,
    ) -> None:
        """Fills the entry's state section from `state`, as the state filter says. With
        lazy-loaded members, the member events are those of the timeline's senders (sent
        every time: the server does not track what each client already holds) and the
        user's own, as of where `state` is (never later: a left room's are as they were at
        the leave)."""
        state_filter = request.filter.room.state
        kept: list[StoredEvent] = []
        if state_filter.keeps_room(room_id):
            wanted_members = None
            if state_filter.lazy_load_members:
                wanted_members = {s.event.sender for s in timeline.events}
                wanted_members.add(request.user_id)
                missing = [
                    ("m.room.member", u)
                    for u in wanted_members
                    if ("m.room.member", u) not in state
                ]
                if missing and timeline.events:
                    in_timeline = {s.event.event_id for s in timeline.events}
                    at = up_to if request.use_state_after else timeline.start - 1
                    loaded = self.rooms.store.state_at(room_id, at, keys=missing)
                    state = {
                        **{k: s for k, s in loaded.items() if s.event.event_id not in in_timeline},
                        **state,
                    }
            for (event_type, state_key), stored in state.items():
                if not state_filter.keeps(stored):
                    continue
                if (
                    wanted_members is not None
                    and event_type == "m.room.member"
                    and state_key not in wanted_members
                ):
                    continue
                kept.append(stored)
        kept.sort(key=lambda s: s.stream_ordering)
        key = "state_after" if request.use_state_after else "state"
        entry[key] = {"events": self._format(request, now, view, kept)}

    def _summary(self, user_id: str, room_id: str) -> dict:
        counts = self.rooms.store.member_counts(room_id)
        summary: dict[str, int | list[str]] = {
            "m.joined_member_count": counts.joined_members,
            "m.invited_member_count": counts.invited_members,
        }
        if not counts.name and not counts.canonical_alias:
            summary["m.heroes"] = self.rooms.store.heroes(room_id, user_id, HEROES)
        return summary

    # --- formatting ---------------------------------------------------------------------

    def _format(
        self, request: SyncRequest, now: int, view: HistoryView, events: list[StoredEvent]
    ) -> list[dict]:
        sync_filter = request.filter
        if sync_filter.event_format == "federation":
            out = [dict(s.event.pdu) for s in events]
        else:
            requester = request.requester
            # Only a message sent through /send has a transaction ID (RoomService.send_message):
            # a state section, the user's own member event in it, needs no read for them.
            own = [
                s.event.event_id
                for s in events
                if s.event.sender == requester.user_id and not s.event.is_state
            ]
            txn_ids = (
                self.rooms.store.txn_ids_for(requester.user_id, requester.device_id, own)
                if own
                else {}
            )
            out = []
            for stored in events:
                event = client_event(
                    stored,
                    now,
                    txn_ids.get(stored.event.event_id),
                    view.membership_after(stored.stream_ordering) or "leave",
                )
                del event["room_id"]  # implied by where the event is in the response
                out.append(event)
        if sync_filter.event_fields is not None:
            out = [project(event, sync_filter.event_fields) for event in out]
        return out


def _joined_and_all(joined: list[str], memberships: list) -> tuple[frozenset, frozenset]:
    """The joined rooms, and every room with a membership: one set when they are the same,
    as they are for most users (a parked sync keeps them)."""
    kept, every = frozenset(joined), frozenset(room_id for room_id, _, _ in memberships)
    return kept, (kept if kept == every else every)
