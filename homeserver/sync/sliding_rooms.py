"""A sliding sync's room results (MSC4186, "Room results"): for a room a rule matched, what
changed since the connection last sent it, or the whole room (`initial`) when it never
did, when the user's membership changed since, or when its config asks for more than was
sent (a longer timeline, more state).

Timelines and event formatting are /sync's (room_entries.py), read as of the position the
request reads up to; a room the user is no longer in is read up to their membership event.
A joined room already sent, whose new events the kept list brought in, is made from them
with no read (`live_result`), when that gives what the reads would; its start (timeline,
prev_batch, limited) is encoded once for every connection the events wake, as woken.py's
RoomEntry is for /sync, each connection's ages, counts and lists filled in (`live_text`).

A room's `bump_stamp` is the position of its latest event of a type that counts as activity
(BUMP_TYPES, the MSC's list), not its place in the lists (any event: sliding_lists.py), so
that a client sorting by it does not move a room for a reaction, an edit or a member
change. Omitted when unchanged (the MSC), as the new events of a room sent before show.
"""

from __future__ import annotations

from json.encoder import encode_basestring

from homeserver.core.json_text import encode
from homeserver.core.requester import Requester
from homeserver.rooms.format import client_event
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.pagination import stream_token
from homeserver.rooms.redactions import REDACTION
from homeserver.rooms.service import RoomService
from homeserver.storage.rooms import StoredEvent
from homeserver.storage.sliding_sync import SlidingSyncStore
from homeserver.sync.filters import NO_FILTER
from homeserver.sync.room_entries import HEROES, RoomEntries, SyncRequest, Timeline
from homeserver.sync.sliding_connections import SentRoom
from homeserver.sync.sliding_lists import ListedRoom
from homeserver.sync.sliding_request import RoomConfig
from homeserver.sync.woken import BLANK, ROOM_ENTRIES, RecentEvents, RoomEntry, keep

# Event types whose change the room's header (name, avatar, heroes) follows.
_HEADER_TYPES = frozenset(
    {"m.room.name", "m.room.avatar", "m.room.canonical_alias", "m.room.member"}
)
# MSC4186 `bump_stamp`: the "proper" activity a client sorts its room list by.
BUMP_TYPES = frozenset(
    {
        "m.room.create",
        "m.room.message",
        "m.room.encrypted",
        "m.sticker",
        "m.call.invite",
        "m.poll.start",
        "m.beacon_info",
    }
)


class SlidingRooms:
    def __init__(
        self,
        rooms: RoomService,
        history: RoomHistory,
        entries: RoomEntries,
        store: SlidingSyncStore,
        recent: RecentEvents,
    ):
        self.rooms = rooms
        self.history = history
        self.entries = entries
        self.store = store
        self.recent = recent
        # (room ID, first and last position, events) -> the start of its live result
        # (LIVE_PREFIX), encoded once for every connection the events wake (`live_result`).
        self._live: dict[tuple[str, int, int, int], RoomEntry] = {}

    def result(
        self,
        requester: Requester,
        room: ListedRoom,
        config: RoomConfig,
        sent: SentRoom | None,
        since: int | None,
        up_to: int,
        now: int,
    ) -> tuple[dict | None, SentRoom]:
        """(the room's result, or None when nothing changed; what is now sent of it).
        `since`: the events position of the request's pos (None on a new connection)."""
        if room.membership in ("invite", "knock"):
            return self._stripped(requester, room, config, sent)
        if room.facts is None:
            return _remote_end(room, config, sent)
        room_up_to = up_to if room.membership == "join" else room.membership_at
        initial = _is_initial(room, config, sent)
        if not initial and sent is not None and room.activity <= sent.position:
            return None, SentRoom(sent.position, config)
        after = 0 if initial or sent is None else sent.position
        request = SyncRequest(requester, None, NO_FILTER)
        view = self.history.history_view(room.room_id, requester.user_id)
        timeline = self.entries.timeline(
            request, room.room_id, view, after, room_up_to, config.timeline_limit
        )
        state = self._required_state(requester.user_id, room.room_id, config, after, room_up_to)
        if config.required_state.lazy:
            state.update(self._lazy_members(room.room_id, timeline, room_up_to, state))
        events = self.entries.format_events(request, now, view, timeline.events, bundle=True)
        result: dict = {
            "timeline": events,
            "required_state": self.entries.format_events(
                request, now, view, sorted(state.values(), key=lambda s: s.stream_ordering)
            ),
            "prev_batch": timeline.prev_batch,
            "limited": timeline.limited,
            "num_live": (
                sum(1 for s in timeline.events if s.stream_ordering > since) if since else 0
            ),
            "membership": room.membership,
            "notification_count": 0,  # the joined rooms': sliding.py, _add_counts
            "highlight_count": 0,
        }
        bump_stamp = self._bump_stamp(room, timeline, initial, room_up_to)
        if bump_stamp is not None:
            result["bump_stamp"] = bump_stamp
        if initial:
            result["initial"] = True
            if sent is not None and config.timeline_limit > sent.config.timeline_limit:
                result["expanded_timeline"] = result["unstable_expanded_timeline"] = True
        touched = {s.event.type for s in timeline.events} | {t for t, _ in state}
        if initial or _HEADER_TYPES.intersection(touched):
            result.update(self._header(requester.user_id, room))
        return result, SentRoom(room_up_to, config)

    def live_result(
        self,
        user_id: str,
        room: ListedRoom,
        stamp_before: int,
        config: RoomConfig,
        sent: SentRoom,
        events: list[StoredEvent],
        since: int,
        up_to: int,
        now: int,
    ) -> tuple[dict, SentRoom] | None:
        """A joined room's result from its new events alone, as the notifier heard them
        (sync/woken.py's RecentEvents): `events`, all it has after the kept list's
        position, none of them state (sliding_lists.py `advance`); `stamp_before`, its
        place in the kept list. None when `result`'s reads are needed: the room not sent up
        to that place, more events than its timeline takes, lazy members, a relation among
        them (bundled aggregations), or one of the user's own (its transaction ID)."""
        if (
            room.membership != "join"
            or room.facts is None
            or _is_initial(room, config, sent)
            or stamp_before > sent.position
            or len(events) > config.timeline_limit
            or config.required_state.lazy
        ):
            return None
        ids = {s.event.event_id for s in events}
        for stored in events:
            if stored.event.sender == user_id or stored.event.type == REDACTION:
                return None
            relates = stored.event.content.get("m.relates_to")
            if isinstance(relates, dict) and relates.get("event_id") in ids:
                return None
        result = {
            # Stands for this start of the result, up to num_live (`live_text`).
            "timeline": LiveTimeline(self._live_entry(room.room_id, events), events),
            "required_state": [],
            "prev_batch": stream_token(events[0].stream_ordering - 1),
            "limited": False,
            "num_live": sum(1 for s in events if s.stream_ordering > since) if since else 0,
            "membership": "join",
            "notification_count": 0,
            "highlight_count": 0,
        }
        bump_stamp = _last_bump(events)
        if bump_stamp is not None:
            result["bump_stamp"] = bump_stamp
        return result, SentRoom(up_to, config)

    def _live_entry(self, room_id: str, events: list[StoredEvent]) -> RoomEntry:
        """A live result's start, encoded: a member joined throughout sees the events
        (woken.py's RecentEvents), each with its own age filled in as it is sent."""
        key = (room_id, events[0].stream_ordering, events[-1].stream_ordering, len(events))
        entry = self._live.get(key)
        if entry is None:
            timeline = ",".join(a + BLANK + b for a, b in map(self.recent.client_parts, events))
            prefix = [
                ("timeline", "[" + timeline + "]"),
                ("required_state", "[]"),
                ("prev_batch", encode(stream_token(events[0].stream_ordering - 1))),
                ("limited", "false"),
            ]
            members = "".join(f"{encode_basestring(k)}:{v}," for k, v in prefix)
            entry = RoomEntry("{" + members + '"num_live":', events)
            keep(self._live, key, entry, ROOM_ENTRIES)
        return entry

    def _stripped(
        self, requester: Requester, room: ListedRoom, config: RoomConfig, sent: SentRoom | None
    ) -> tuple[dict | None, SentRoom]:
        """An invite or a knock: the stripped state its event carried, once."""
        now_sent = SentRoom(room.membership_at, config)
        if sent is not None and sent.position >= room.membership_at:
            return None, now_sent
        events = room.stripped
        if events is None:
            request = SyncRequest(requester, None, NO_FILTER)
            found = self.entries.stripped(request, room.room_id, room.membership)
            events = next(iter(found.values()))["events"]
        result = {
            "initial": True,
            "membership": room.membership,
            "bump_stamp": room.membership_at,
            # invite_state is what clients of the unstable path read; stripped_state the
            # MSC's final name for it.
            "stripped_state": events,
            ("invite_state" if room.membership == "invite" else "knock_state"): events,
            "timeline": [],
            "required_state": [],
            "notification_count": 0,
            "highlight_count": 0,
        }
        for event in events:
            content = event.get("content", {})
            if event.get("type") == "m.room.name" and isinstance(content.get("name"), str):
                result["name"] = content["name"]
            elif event.get("type") == "m.room.avatar" and isinstance(content.get("url"), str):
                result["avatar"] = content["url"]
        return result, now_sent

    def _bump_stamp(
        self, room: ListedRoom, timeline: Timeline, initial: bool, up_to: int
    ) -> int | None:
        """The room's `bump_stamp` as of `up_to`; a room the user is not joined to has their
        membership's. None (unchanged) for a room sent before whose new events, all in the
        timeline, have no activity."""
        if room.membership != "join":
            return room.membership_at
        found = _last_bump(timeline.events)
        if found is None and (initial or timeline.limited):
            found = self.store.latest_of_types(room.room_id, up_to, BUMP_TYPES)
            # None: its activity is not stored here (a remote room's joined since).
            return room.membership_at if found is None else found
        return found

    def _required_state(
        self, user_id: str, room_id: str, config: RoomConfig, after: int, up_to: int
    ) -> dict:
        """The state `required_state` asks for as of `up_to`: changed after `after` (0: all
        of it)."""
        wanted = config.required_state
        if not wanted.include:
            return {}
        store = self.rooms.store
        if wanted.has_wildcard:
            state = store.state_at(room_id, up_to, changed_after=after)
        else:
            state = store.state_at(room_id, up_to, changed_after=after, keys=wanted.keys(user_id))
        return {k: s for k, s in state.items() if wanted.matches(k[0], k[1], user_id)}

    def _lazy_members(self, room_id: str, timeline: Timeline, up_to: int, have: dict) -> dict:
        """The member events of the timeline's senders and of the members it changes."""
        users = {s.event.sender for s in timeline.events}
        users.update(
            s.event.state_key
            for s in timeline.events
            if s.event.type == "m.room.member" and s.event.state_key
        )
        keys = [("m.room.member", u) for u in users if ("m.room.member", u) not in have]
        return self.rooms.store.state_at(room_id, up_to, keys=keys) if keys else {}

    def _header(self, user_id: str, room: ListedRoom) -> dict:
        """Name, avatar, member counts, and heroes when the room has no name."""
        facts = room.facts
        if facts is None:
            return {}
        header: dict = {"joined_count": facts.joined, "invited_count": facts.invited}
        if facts.name:
            header["name"] = facts.name
        if facts.avatar_url:
            header["avatar"] = facts.avatar_url
        if not facts.name and not facts.canonical_alias:
            header["heroes"] = self._heroes(user_id, room.room_id)
        return header

    def _heroes(self, user_id: str, room_id: str) -> list[dict]:
        store = self.rooms.store
        hero_ids = store.heroes(room_id, user_id, HEROES)
        members = store.current_state(room_id, [("m.room.member", u) for u in hero_ids])
        heroes = []
        for hero in hero_ids:
            found: StoredEvent | None = members.get(("m.room.member", hero))
            content = found.event.content if found is not None else {}
            entry = {"user_id": hero}
            for key in ("displayname", "avatar_url"):
                if isinstance(content.get(key), str):
                    entry[key] = content[key]
            heroes.append(entry)
        return heroes


# The members of a live result its LiveTimeline stands for, in its order.
LIVE_PREFIX = frozenset({"timeline", "required_state", "prev_batch", "limited", "num_live"})


class LiveTimeline:
    """A live result's timeline (`live_result`), standing for the start of its result
    encoded once for every connection its events wake."""

    __slots__ = ("entry", "events")

    def __init__(self, entry: RoomEntry, events: list[StoredEvent]):
        self.entry = entry
        self.events = events

    def decoded(self, now: int) -> list[dict]:
        """The events as format_events gives them to a member joined throughout."""
        timeline = []
        for stored in self.events:
            event = client_event(stored, now, None, "join")
            del event["room_id"]
            timeline.append(event)
        return timeline


def is_live(result: dict) -> bool:
    return isinstance(result.get("timeline"), LiveTimeline)


def live_text(result: dict, now: int) -> str:
    """A live result encoded: its start shared, its events' ages as of `now`, and the
    rest of it its own."""
    own = [
        f"{encode_basestring(key)}:{_member_text(value)}"
        for key, value in result.items()
        if key not in LIVE_PREFIX
    ]
    rest = "," + ",".join(own) if own else ""
    return f"{result['timeline'].entry.text(now)}{result['num_live']}{rest}}}"


def _member_text(value) -> str:
    """`encode(value)`, without the encoder's cost for each call for the plain values a
    result's own members are (membership, counts, bump_stamp, its lists' names)."""
    if isinstance(value, str):
        return encode_basestring(value)
    if type(value) is int:
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ",".join(map(encode_basestring, value)) + "]"
    return encode(value)


def _last_bump(events: list[StoredEvent]) -> int | None:
    for stored in reversed(events):
        if stored.event.type in BUMP_TYPES:
            return stored.stream_ordering
    return None


def _is_initial(room: ListedRoom, config: RoomConfig, sent: SentRoom | None) -> bool:
    """Whether the room goes whole: never sent on the connection, the user's membership
    changed since, or its config asks for more than was sent."""
    return (
        sent is None
        or room.membership_at > sent.position
        or (config is not sent.config and config.key != sent.config.key)
        or config.timeline_limit > sent.config.timeline_limit
    )


def _remote_end(
    room: ListedRoom, config: RoomConfig, sent: SentRoom | None
) -> tuple[dict | None, SentRoom]:
    """The end of a remote invite or knock (a rejection, a rescinded knock): nothing more
    to show of a room this server holds nothing of."""
    if sent is not None and sent.position >= room.membership_at:
        return None, sent
    gone = {"initial": True, "membership": room.membership, "bump_stamp": room.membership_at}
    return {**gone, "timeline": [], "required_state": []}, SentRoom(room.membership_at, config)
