"""A /sync response's rooms: the entry of a room the user is in, left, is invited to or
knocked on (client-server spec, "Syncing"), made from what one computation read
(`SyncBatch`, service.py). Timelines and state are read as of the positions the computation
reads up to, and formatted as the filter says.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from homeserver.core.concurrency import in_turns
from homeserver.core.requester import Requester
from homeserver.rooms.format import client_event
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.pagination import stream_token
from homeserver.rooms.service import RoomService
from homeserver.rooms.visibility import HistoryView
from homeserver.storage.rooms import StoredEvent
from homeserver.storage.sync import StreamPositions, SyncSnapshot
from homeserver.sync.filters import SyncFilter, project
from homeserver.sync.side_streams import ephemeral_events, room_account_data
from homeserver.sync.tokens import SyncToken

# Members named in a room summary when the room has no name (the spec's "first 5").
HEROES = 5
# Events formatted between two pauses for the hub (about 10 ms of work).
FORMATTED_PER_PAUSE = 500
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
class SyncBatch:
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
class Timeline:
    events: list[StoredEvent]  # oldest first
    limited: bool
    prev_batch: str
    start: int  # the stream position of the first event, or just past the range if none


class RoomEntries:
    def __init__(self, rooms: RoomService, history: RoomHistory):
        self.rooms = rooms
        self.history = history

    # --- rooms --------------------------------------------------------------------------

    def joined(
        self,
        request: SyncRequest,
        batch: SyncBatch,
        room_id: str,
        membership_changed: bool,
        has_events: bool,
    ) -> dict | None:
        since = request.since
        up_to = batch.positions.events
        view, newly_joined = self._newly_joined(request, room_id, membership_changed, up_to)
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
        timeline = self.timeline(request, room_id, view, timeline_after, up_to)
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
            "timeline": self._timeline_section(request, batch.now, view, timeline),
            "ephemeral": {"events": ephemeral},
            "account_data": {"events": account_data},
            "summary": {},
        }
        self._put_state(request, batch.now, view, room_id, entry, state, timeline, up_to)
        touched = [s.event.type for s in timeline.events] + [k[0] for k in state]
        if newly_joined or request.full_state or _SUMMARY_TYPES.intersection(touched):
            entry["summary"] = self._summary(request.user_id, room_id)
        return entry

    def _newly_joined(
        self, request: SyncRequest, room_id: str, membership_changed: bool, up_to: int
    ) -> tuple[HistoryView | None, bool]:
        """Whether the room is sent whole (joined since the token, or an initial sync), and
        the user's history view if that took reading it."""
        since = request.since
        if since is None:
            return None, True
        if not membership_changed:
            return None, False
        view = self.history.history_view(room_id, request.user_id)
        newly_joined = view.membership_after(since.events) != "join" or any(
            m != "join" for m in view.memberships_between(since.events, up_to)
        )
        return view, newly_joined

    def _timeline_section(
        self, request: SyncRequest, now: int, view: HistoryView, timeline: Timeline
    ) -> dict:
        return {
            "events": self.format_events(request, now, view, timeline.events, bundle=True),
            "limited": timeline.limited,
            "prev_batch": timeline.prev_batch,
        }

    def left(
        self, request: SyncRequest, batch: SyncBatch, room_id: str, left_at: int
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
        timeline = self.timeline(request, room_id, view, after, left_at)
        state = {}
        if "join" in view.memberships_between(0, left_at):
            # State is for those who were members; an invitee who declined sees only their
            # own membership, in the timeline. full_state asks for all of it here too.
            joined_at_token = view.membership_after(after) == "join"
            state_after = after if joined_at_token and not request.full_state else 0
            state = self._state(request, room_id, timeline, state_after, left_at)
        entry = {
            "timeline": self._timeline_section(request, batch.now, view, timeline),
            "account_data": {
                "events": room_account_data(
                    request.filter.room.account_data, batch.account_data, room_id
                )
            },
        }
        self._put_state(request, batch.now, view, room_id, entry, state, timeline, left_at)
        return entry

    def stripped(self, request: SyncRequest, room_id: str, membership: str) -> dict:
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

    def timeline(
        self,
        request: SyncRequest,
        room_id: str,
        view: HistoryView,
        after: int,
        up_to: int,
        limit: int | None = None,
    ) -> Timeline:
        """The latest events with `after < position <= up_to` the user may see and the
        filter keeps, up to `limit` (by default the filter's); `limited` when some were
        left out. A sliding sync's room (sliding_rooms.py) may ask for none."""
        room_filter = request.filter.room
        timeline_filter = room_filter.timeline
        if not timeline_filter.keeps_room(room_id):
            return Timeline([], False, stream_token(up_to), up_to + 1)
        limit = room_filter.timeline_limit if limit is None else limit
        scan = self.history.visible_events(
            room_id, view, after, up_to, True, limit + 1, timeline_filter
        )
        limited = len(scan.events) > limit or not scan.exhausted
        events = scan.events[:limit]
        events.reverse()
        if events:
            return Timeline(
                events,
                limited,
                stream_token(events[0].stream_ordering - 1),
                events[0].stream_ordering,
            )
        start = scan.position if limited else up_to
        return Timeline([], limited, stream_token(start), start + 1)

    def _state(
        self,
        request: SyncRequest,
        room_id: str,
        timeline: Timeline,
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

    def lazy_members(
        self, requester: Requester, sync_filter: SyncFilter, room_id: str, events: list, now: int
    ) -> list[dict]:
        """A woken answer's state section when its filter lazy-loads members (woken.py):
        what `_put_state` sends for a timeline of `events` and no state change."""
        request = SyncRequest(requester, None, sync_filter)
        view = self.history.history_view(room_id, requester.user_id)
        timeline = Timeline(events, False, "", events[0].stream_ordering)
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
        timeline: Timeline,
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
        entry[key] = {"events": self.format_events(request, now, view, kept)}

    def _summary(self, user_id: str, room_id: str) -> dict:
        counts = self.rooms.store.member_counts(room_id)
        summary: dict[str, int | list[str]] = {
            "m.joined_member_count": counts.joined_members,
            "m.invited_member_count": counts.invited_members,
        }
        if not counts.name and not counts.canonical_alias:
            summary["m.heroes"] = self.rooms.store.heroes(room_id, user_id, HEROES)
        return summary

    def format_events(
        self,
        request: SyncRequest,
        now: int,
        view: HistoryView,
        events: list[StoredEvent],
        bundle: bool = False,
    ) -> list[dict]:
        """Events as the filter's format says; `bundle`: with their bundled aggregations
        (a timeline's, not a state section's)."""
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
            # A big room's first sync is thousands of state events.
            for stored in in_turns(events, FORMATTED_PER_PAUSE):
                event = client_event(
                    stored,
                    now,
                    txn_ids.get(stored.event.event_id),
                    view.membership_after(stored.stream_ordering) or "leave",
                )
                del event["room_id"]  # implied by where the event is in the response
                out.append(event)
            if bundle and events:
                self.history.aggregations.add_to(requester, view, events, out, now)
        if sync_filter.event_fields is not None:
            out = [project(event, sync_filter.event_fields) for event in out]
        return out
