"""A woken sync's answer from the events that woke it, without a database read for rooms.

Most wake-ups are one new message in a room the user is in, and one message wakes every
member at once. Computing each member's whole answer again (its rooms, their history views,
the timeline) costs as much as the user's rooms; this costs as much as what changed.

The notifier keeps the events stream's latest positions as they were persisted
(`RecentEvents`). Positions are dense: `streams.advance` takes every one inside the write that
stores it, and a rolled-back write takes none. So a run of known positions with no gap, from
the position a sync last read up to the newest heard of, is everything stored after it. A
sync woken only by room events (notifier.Waiter.recompute unset) answers from that run when:

- its last computation found nothing new (`Seen`), with a filter that hides no events, and
  without full_state or use_state_after;
- the run has no state event in a room the user has any membership in, and no member event
  about the user anywhere: memberships, room state and device lists are as they were;
- none of the user's rooms has more new events than the timeline limit.

The user's own messages are answered too: their transaction IDs, which only the device that
sent them is given, are read for the device asking (one read), and the rooms they are in
are formatted for it alone.

Then every joined room the filter keeps gets its new events, visible to a member that has
been joined throughout (with lazy-loaded members, the member events of their senders and the
user's own, read as the whole computation reads them), and nothing else of the answer
changed: the account data, receipts, typing, to-device and device list positions of the
token stay as they were. Otherwise the sync computes its whole answer as before
(service.py), so this never decides what a client sees, only how fast it sees it.

The answer goes out as it is put together, encoded. Each event is encoded once, by the first
sync it wakes, in two parts around its age (each reader's own). A joined room's whole entry is
kept too, as the text between its events' ages: every sync one message wakes with the plain
client format shares it, and its answer costs the ages, its token and its key counts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Callable

from homeserver.core.json_text import EncodedJson, encode, object_text
from homeserver.core.requester import Requester
from homeserver.e2ee.sync_part import E2eeSync, E2eeSyncPart, KeyCounts
from homeserver.rooms.format import client_event, client_event_fields, client_unsigned
from homeserver.rooms.pagination import stream_token
from homeserver.rooms.redactions import REDACTION
from homeserver.storage.rooms import StoredEvent
from homeserver.sync.filters import SyncFilter, project
from homeserver.sync.tokens import SyncToken

# Positions kept. A parked sync is usually a few positions behind the newest; one further
# back than this computes its answer from the database.
RECENT_EVENTS = 1024
# Room entries kept (RoomEntry): one per room and run of new events in it.
ROOM_ENTRIES = 256
# Key count parts kept, one per distinct set of counts.
KEY_COUNT_TEXTS = 1024
# Parts of every woken answer, encoded.
NO_EVENTS = '{"events":[]}'
NOT_JOINED = ("invite", "knock", "leave")
# Stands for what each answer fills in, in text encoded once for many: never in encoded JSON,
# whose encoder escapes every control character.
BLANK = "\x00"
# The answer around its token, its joined rooms and its end-to-end encryption part.
_ANSWER = object_text(
    [
        ("next_batch", BLANK),
        ("account_data", NO_EVENTS),
        (
            "rooms",
            object_text([("join", "{" + BLANK + "}"), *((k, "{}") for k in NOT_JOINED)]),
        ),
    ]
)[:-1].split(BLANK)


class RecentEvents:
    """The events stream's latest positions: this instance's as the persist listener heard
    of them, other instances' as read when their NOTIFY arrived or before a local write
    woke anyone (sync/cluster.py). `newest` is the newest kept, never one only heard of:
    positions past it are not claimed, so a sync woken while another instance's range is
    being read answers up to what is kept, and the rest wakes it again once read. A
    redaction forgets its target (its content must not be served again), which leaves a gap
    that sends syncs reaching back over it to the database."""

    def __init__(self, capacity: int = RECENT_EVENTS):
        self._capacity = capacity
        self._events: dict[int, StoredEvent] = {}
        self._order: deque[int] = deque()
        self._position_of: dict[str, int] = {}
        # Each event as a member sees it, encoded once for every sync it wakes: the text
        # before its age and the text after it.
        self._client_parts: dict[int, tuple[str, str]] = {}
        self.newest = 0

    def add(self, stored: list[StoredEvent]) -> list[StoredEvent]:
        """Keeps the events; returns those it did not have (each was woken for when added)."""
        fresh = []
        for s in stored:
            if s.stream_ordering in self._events:  # ours, read again with others' range
                continue
            fresh.append(s)
            if s.event.type == REDACTION:
                self._forget_targets_of(s)
            self._events[s.stream_ordering] = s
            self._position_of[s.event.event_id] = s.stream_ordering
            self._order.append(s.stream_ordering)
            self.newest = max(self.newest, s.stream_ordering)
        while len(self._order) > self._capacity:
            position = self._order.popleft()
            self._client_parts.pop(position, None)
            gone = self._events.pop(position, None)
            if gone is not None:
                self._position_of.pop(gone.event.event_id, None)
        return fresh

    def has_all(self, after: int, upto: int) -> bool:
        """Whether every position in (after, upto] is kept."""
        return all(at in self._events for at in range(after + 1, upto + 1))

    def after(self, position: int) -> list[StoredEvent] | None:
        """Every event stored after `position`, oldest first; None when a position between
        it and the newest heard of is unknown."""
        run = []
        for at in range(position + 1, self.newest + 1):
            stored = self._events.get(at)
            if stored is None:
                return None
            run.append(stored)
        return run

    def client_json(self, stored: StoredEvent, now: int) -> str:
        """The event as a member of its room that is joined throughout sees it, encoded: as
        rooms/format.py's client_event gives it, without the room ID (a sync answer implies
        it)."""
        before, after = self.client_parts(stored)
        return before + str(_age(stored.event.pdu["origin_server_ts"], now)) + after

    def client_parts(self, stored: StoredEvent) -> tuple[str, str]:
        """client_json's text before the event's age, and after it."""
        position = stored.stream_ordering
        parts = self._client_parts.get(position)
        if parts is None:
            fields = client_event_fields(stored)
            del fields["room_id"]
            # The age comes first in `unsigned` (client_unsigned), then the rest of it.
            unsigned = client_unsigned(stored, 0, None, "join")
            del unsigned["age"]
            parts = (encode(fields)[:-1] + ',"unsigned":{"age":', "," + encode(unsigned)[1:] + "}")
            if position in self._events:
                self._client_parts[position] = parts
        return parts

    def _forget_targets_of(self, redaction: StoredEvent) -> None:
        # Before room version 11 the target is at the top level, from 11 in the content.
        for target in (redaction.event.pdu.get("redacts"), redaction.event.content.get("redacts")):
            position = self._position_of.pop(target, None) if isinstance(target, str) else None
            if position is not None:
                self._events.pop(position, None)
                self._client_parts.pop(position, None)


class RoomEntry:
    """A joined room's entry in a woken answer (`"room_id":{...}`), encoded once for every
    sync woken with the same events in it: the text between the events' ages."""

    __slots__ = ("texts", "stamps")

    def __init__(self, blanked: str, events: list[StoredEvent]):
        self.texts = blanked.split(BLANK)
        self.stamps = [stored.event.pdu["origin_server_ts"] for stored in events]

    def text(self, now: int) -> str:
        texts = self.texts
        if len(texts) == 2:  # one event, the usual wake-up
            return texts[0] + str(_age(self.stamps[0], now)) + texts[1]
        parts = [texts[0]]
        for stamp, after in zip(self.stamps, texts[1:]):
            parts += (str(_age(stamp, now)), after)
        return "".join(parts)


def keep(cache: dict, key, value, limit: int) -> None:
    """Remembers `value`, forgetting the oldest entry once `limit` are kept."""
    if len(cache) >= limit:
        del cache[next(iter(cache))]
    cache[key] = value


def _age(origin_server_ts: int, now: int) -> int:
    # As client_unsigned's (rooms/format.py).
    return max(0, now - origin_server_ts)


@dataclass(frozen=True, slots=True)  # one per parked sync
class Seen:
    """What a sync's last whole computation found nothing new in."""

    token: SyncToken  # the token it was given, which that computation would answer again
    events: int  # the events position it read up to
    joined: frozenset[str]  # the rooms the user was joined to there, that the filter keeps
    rooms: frozenset[str]  # every room the user had a membership in there
    keys: KeyCounts | None = None  # the device's key counts it read


def answers_from_events(sync_filter: SyncFilter, full_state: bool, state_after: bool) -> bool:
    """Whether a sync with these options may answer from recent events at all."""
    room_filter = sync_filter.room
    return not (full_state or state_after or room_filter.timeline.may_hide_events)


# (requester, filter, room_id, the room's new events, now) -> the state section's events
# when the filter lazy-loads members (RoomEntries.lazy_members).
LazyMembers = Callable[[Requester, SyncFilter, str, list[StoredEvent], int], list[dict]]
# (user_id, room IDs, by thread) -> {room_id: the unread count fields of its entry}
# (notifications.py, GatheredUnread): each user's own, read together for syncs woken together.
UnreadCounts = Callable[[str, list[str], bool], dict[str, dict]]
# (user_id, device_id, event IDs) -> {event_id: txn_id} of those that device sent
# (storage/rooms.py `txn_ids_for`).
TxnIds = Callable[[str, str, list[str]], dict[str, str]]


class WokenAnswers:
    def __init__(
        self,
        recent: RecentEvents,
        e2ee: E2eeSync | None,
        lazy_members: LazyMembers,
        unread: UnreadCounts | None = None,
        txn_ids: TxnIds | None = None,
    ):
        """Without `txn_ids`, a run with the user's own message computes whole."""
        self.recent = recent
        self.e2ee = e2ee
        self.lazy_members = lazy_members
        self.unread = unread
        self.txn_ids = txn_ids
        # (room ID, first and last position, events) -> its entry in the plain client format.
        # A redacted event's entry is never served: its run has a gap (RecentEvents).
        self._entries: dict[tuple[str, int, int, int], RoomEntry] = {}
        # A device's key counts, as its answer's end-to-end encryption part.
        self._key_texts: dict[tuple, str] = {}

    def answer(
        self, requester: Requester, sync_filter: SyncFilter, seen: Seen, now: int
    ) -> tuple[EncodedJson | None, Seen] | None:
        """(the answer, or None when nothing is new for the user; what is seen now), or
        None when this sync must compute its whole answer."""
        run = self.recent.after(seen.events)
        if run is None:
            return None
        if not run:
            return None, seen
        found = _events_by_room(requester.user_id, seen, run)
        if found is None:
            return None
        by_room, own = found
        txn_ids: dict[str, str] = {}
        if own:
            if self.txn_ids is None:
                return None
            txn_ids = self.txn_ids(requester.user_id, requester.device_id, own)
        up_to = run[-1].stream_ordering
        rooms = self._joined_rooms(requester, sync_filter, by_room, now, txn_ids)
        if rooms is None:
            return None
        if not rooms:
            return None, Seen(seen.token, up_to, seen.joined, seen.rooms, seen.keys)
        keys = seen.keys
        e2ee = ""
        if self.e2ee is not None:
            keys = self.e2ee.key_counts(requester, keys)
            e2ee = self._key_text(keys)
        token = encode(str(seen.token.with_events(up_to)))
        entries = self._with_unread(requester.user_id, sync_filter, rooms)
        text = _ANSWER[0] + token + _ANSWER[1] + ",".join(entries) + _ANSWER[2] + e2ee + "}"
        return EncodedJson(text), Seen(seen.token, up_to, seen.joined, seen.rooms, keys)

    def _with_unread(
        self, user_id: str, sync_filter: SyncFilter, rooms: list[tuple[str, str]]
    ) -> list[str]:
        """The entries' texts, each with its unread counts before its closing brace."""
        if self.unread is None:
            return [text for _, text in rooms]
        by_thread = sync_filter.room.timeline.unread_thread_notifications
        counts = self.unread(user_id, [room_id for room_id, _ in rooms], by_thread)
        return [
            text[:-1] + "," + object_text((k, encode(v)) for k, v in counts[room_id].items())[1:]
            for room_id, text in rooms
        ]

    def _joined_rooms(
        self,
        requester: Requester,
        sync_filter: SyncFilter,
        by_room: dict,
        now: int,
        txn_ids: dict[str, str],
    ) -> list[tuple[str, str]] | None:
        """Each entry (`"room_id":{...}`) of the rooms the timeline filter keeps; None if one
        needs the whole computation. `txn_ids`: of the requesting device's own events."""
        timeline_filter = sync_filter.room.timeline
        lazy = sync_filter.room.state.lazy_load_members
        plain = sync_filter.event_format != "federation" and sync_filter.event_fields is None
        rooms = []
        for room_id, events in by_room.items():
            if not timeline_filter.keeps_room(room_id):
                continue
            if len(events) > sync_filter.room.timeline_limit:
                return None  # a limited timeline comes with state: the whole computation
            sent_here = any(stored.event.event_id in txn_ids for stored in events)
            if plain and not lazy and not sent_here:
                rooms.append((room_id, self._room_entry(room_id, events).text(now)))
                continue
            state: list[dict] = []
            if lazy:
                state = self.lazy_members(requester, sync_filter, room_id, events, now)
            formatted = self._formatted(sync_filter, plain and not sent_here, events, now, txn_ids)
            text = _entry_text(formatted, events, state)
            rooms.append((room_id, encode_basestring(room_id) + ":" + text))
        return rooms

    def _room_entry(self, room_id: str, events: list[StoredEvent]) -> RoomEntry:
        key = (room_id, events[0].stream_ordering, events[-1].stream_ordering, len(events))
        entry = self._entries.get(key)
        if entry is None:
            blanked = [
                before + BLANK + after for before, after in map(self.recent.client_parts, events)
            ]
            entry = RoomEntry(
                encode_basestring(room_id) + ":" + _entry_text(blanked, events, []), events
            )
            keep(self._entries, key, entry, ROOM_ENTRIES)
        return entry

    def _formatted(
        self,
        sync_filter: SyncFilter,
        shared: bool,
        events: list[StoredEvent],
        now: int,
        txn_ids: dict[str, str],
    ) -> list[str]:
        """`shared`: in the plain client format, with no transaction ID among them."""
        if shared:
            return [self.recent.client_json(stored, now) for stored in events]
        # As room_entries.py's _format: the format first, then the filter's fields of it.
        shown = []
        for stored in events:
            if sync_filter.event_format == "federation":
                event = dict(stored.event.pdu)
            else:
                event = client_event(stored, now, txn_ids.get(stored.event.event_id), "join")
                del event["room_id"]  # implied by where the event is in the response
            if sync_filter.event_fields is not None:
                event = project(event, sync_filter.event_fields)
            shown.append(event)
        return [encode(event) for event in shown]

    def _key_text(self, keys: KeyCounts) -> str:
        """The answer's end-to-end encryption part for these key counts, encoded, with the
        comma before it."""
        key = (tuple(keys.one_time.items()), tuple(keys.unused_fallback))
        text = self._key_texts.get(key)
        if text is None:
            part = E2eeSyncPart(
                one_time_key_counts=keys.one_time, unused_fallback_key_types=keys.unused_fallback
            )
            text = "," + object_text((k, encode(v)) for k, v in part.fields().items())[1:-1]
            keep(self._key_texts, key, text, KEY_COUNT_TEXTS)
        return text


def _entry_text(formatted: list[str], events: list[StoredEvent], state: list[dict]) -> str:
    """A joined room's entry: its new events (`formatted`, encoded), and `state`."""
    timeline = [
        ("events", "[" + ",".join(formatted) + "]"),
        ("limited", "false"),
        ("prev_batch", encode(stream_token(events[0].stream_ordering - 1))),
    ]
    return object_text(
        [
            ("timeline", object_text(timeline)),
            ("ephemeral", NO_EVENTS),
            ("account_data", NO_EVENTS),
            ("summary", "{}"),
            ("state", object_text([("events", encode(state))])),
        ]
    )


def _events_by_room(
    user_id: str, seen: Seen, run: list[StoredEvent]
) -> tuple[dict[str, list[StoredEvent]], list[str]] | None:
    """The run's events a member of each joined room sees, and the IDs of those the user
    sent; None if the run changes what the whole computation would decide from (see the
    module's docstring)."""
    by_room: dict[str, list[StoredEvent]] = {}
    own: list[str] = []
    for stored in run:
        event = stored.event
        if event.type == "m.room.member" and event.state_key == user_id:
            return None
        if event.room_id not in seen.rooms:
            continue
        if event.is_state:
            return None
        if stored.soft_failed or event.room_id not in seen.joined:
            continue
        if event.sender == user_id:
            own.append(event.event_id)
        by_room.setdefault(event.room_id, []).append(stored)
    return by_room, own
