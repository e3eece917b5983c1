"""Filters (client-server spec, "Filtering"): parsing, the stored filter API, and what /sync
and /messages apply.

A filter is validated once, when it is uploaded or passed inline, into frozen objects; the
type and sender tests themselves are `rooms.pagination.EventFilter`'s, so /messages and /sync
match events the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from homeserver.core.clock import now_ms
from homeserver.core.errors import (
    Codes,
    MatrixError,
    bad_json,
    forbidden,
    invalid_param,
    not_found,
)
from homeserver.rooms.pagination import EventFilter

# Timeline events per room when the filter gives no limit, and the most a filter may ask for:
# an initial sync reads this many events for every room the user is in.
DEFAULT_TIMELINE_LIMIT = 10
MAX_TIMELINE_LIMIT = 250
# A stored or inline filter is a small JSON object; this bounds what we parse and keep.
MAX_FILTER_BYTES = 16 * 1024
_FILTER_ID = re.compile(r"^[0-9]{1,18}$")
_FIELD_SEPARATOR = re.compile(r"(?<!\\)\.")  # event_fields: `\.` is a literal dot
_PARSED_FILTERS = 10_000
# Parsed inline filters, kept by their text: every client of one kind sends the same one.
# Fewer: each may be up to MAX_FILTER_BYTES, and anyone may send new ones.
_INLINE_FILTERS = 256


class _Strings(fields.List):
    def __init__(self, **kw):
        super().__init__(fields.String(), **kw)


class EventFilterBody(Schema):
    class Meta:
        unknown = EXCLUDE

    limit = fields.Integer(strict=True, validate=validate.Range(min=1))
    types = _Strings()
    not_types = _Strings()
    senders = _Strings()
    not_senders = _Strings()


class RoomEventFilterBody(EventFilterBody):
    rooms = _Strings()
    not_rooms = _Strings()
    contains_url = fields.Boolean()
    lazy_load_members = fields.Boolean()
    include_redundant_members = fields.Boolean()
    unread_thread_notifications = fields.Boolean()


class RoomFilterBody(Schema):
    class Meta:
        unknown = EXCLUDE

    rooms = _Strings()
    not_rooms = _Strings()
    include_leave = fields.Boolean()
    timeline = fields.Nested(RoomEventFilterBody)
    state = fields.Nested(RoomEventFilterBody)
    ephemeral = fields.Nested(RoomEventFilterBody)
    account_data = fields.Nested(RoomEventFilterBody)


class FilterBody(Schema):
    class Meta:
        unknown = EXCLUDE

    event_fields = _Strings()
    event_format = fields.String(validate=validate.OneOf(["client", "federation"]))
    account_data = fields.Nested(EventFilterBody)
    presence = fields.Nested(EventFilterBody)
    room = fields.Nested(RoomFilterBody)


@dataclass(frozen=True)
class RoomEventFilter(EventFilter):
    """An EventFilter that also picks rooms, and says how member state is sent."""

    rooms: tuple | None = None
    not_rooms: tuple = ()
    lazy_load_members: bool = False
    # Unread counts split by thread in /sync (storage/push.py), as the timeline filter asks.
    unread_thread_notifications: bool = False

    def keeps_room(self, room_id: str) -> bool:
        if self.rooms is not None and room_id not in self.rooms:
            return False
        return room_id not in self.not_rooms


@dataclass(frozen=True)
class RoomFilter:
    rooms: tuple | None = None
    not_rooms: tuple = ()
    include_leave: bool = False
    timeline: RoomEventFilter = field(default_factory=RoomEventFilter)
    state: RoomEventFilter = field(default_factory=RoomEventFilter)
    ephemeral: RoomEventFilter = field(default_factory=RoomEventFilter)
    account_data: RoomEventFilter = field(default_factory=RoomEventFilter)

    def keeps_room(self, room_id: str) -> bool:
        if self.rooms is not None and room_id not in self.rooms:
            return False
        return room_id not in self.not_rooms

    @property
    def timeline_limit(self) -> int:
        return min(self.timeline.limit or DEFAULT_TIMELINE_LIMIT, MAX_TIMELINE_LIMIT)


@dataclass(frozen=True)
class SyncFilter:
    event_fields: tuple | None = None
    event_format: str = "client"
    account_data: EventFilter = field(default_factory=EventFilter)
    presence: EventFilter = field(default_factory=EventFilter)
    room: RoomFilter = field(default_factory=RoomFilter)


# Frozen, so one instance serves every sync without a filter.
NO_FILTER = SyncFilter()


def _tuple(body: dict, name: str) -> tuple | None:
    return tuple(body[name]) if name in body else None


_Filter = TypeVar("_Filter", bound=EventFilter)


def _event_filter(body: dict, cls: type[_Filter], **extra: Any) -> _Filter:
    return cls(
        types=_tuple(body, "types"),
        not_types=tuple(body.get("not_types", ())),
        senders=_tuple(body, "senders"),
        not_senders=tuple(body.get("not_senders", ())),
        limit=body.get("limit"),
        **extra,
    )


def _room_event_filter(body: dict) -> RoomEventFilter:
    return _event_filter(
        body,
        RoomEventFilter,
        contains_url=body.get("contains_url"),
        rooms=_tuple(body, "rooms"),
        not_rooms=tuple(body.get("not_rooms", ())),
        lazy_load_members=body.get("lazy_load_members", False),
        unread_thread_notifications=body.get("unread_thread_notifications", False),
    )


def _load(schema: Schema, data, what: str) -> dict:
    if not isinstance(data, dict):
        raise bad_json(f"{what} must be a JSON object")
    try:
        return schema.load(data)
    except ValidationError as e:
        raise bad_json(f"{what}: {e.messages}") from None


def parse_room_event_filter(data) -> RoomEventFilter:
    """A RoomEventFilter, as /messages takes it."""
    return _room_event_filter(_load(RoomEventFilterBody(), data, "filter"))


def parse_filter(data) -> SyncFilter:
    body = _load(FilterBody(), data, "filter")
    room = body.get("room", {})
    return SyncFilter(
        event_fields=_tuple(body, "event_fields"),
        event_format=body.get("event_format", "client"),
        account_data=_event_filter(body.get("account_data", {}), EventFilter),
        presence=_event_filter(body.get("presence", {}), EventFilter),
        room=RoomFilter(
            rooms=_tuple(room, "rooms"),
            not_rooms=tuple(room.get("not_rooms", ())),
            include_leave=room.get("include_leave", False),
            timeline=_room_event_filter(room.get("timeline", {})),
            state=_room_event_filter(room.get("state", {})),
            ephemeral=_room_event_filter(room.get("ephemeral", {})),
            account_data=_room_event_filter(room.get("account_data", {})),
        ),
    )


def decode_filter_json(text: str):
    """An inline filter from a query parameter."""
    if len(text.encode("utf-8")) > MAX_FILTER_BYTES:
        raise MatrixError(413, Codes.TOO_LARGE, f"A filter is at most {MAX_FILTER_BYTES} bytes")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        raise bad_json("filter is not valid JSON") from None


class Filters:
    """The filter API: stored filters belong to one user, who alone may read them."""

    def __init__(self, store):
        self.store = store
        # Parsed stored filters: clients name the same one at every sync, and a stored filter
        # never changes. Oldest first, at most _PARSED_FILTERS.
        self._parsed: dict[tuple[str, str], SyncFilter] = {}
        # One parse, and one object that every parked sync with it shares.
        self._inline: dict[str, SyncFilter] = {}

    def _check_owner(self, requester, user_id: str) -> None:
        if requester.user_id != user_id:
            raise forbidden("You can only use your own filters")

    def create(self, requester, user_id: str, body: dict) -> str:
        self._check_owner(requester, user_id)
        parse_filter(body)  # refuse what /sync could not use, now rather than at every sync
        return self.store.add_filter(
            user_id, json.dumps(body, sort_keys=True, separators=(",", ":")), now_ms()
        )

    def get(self, requester, user_id: str, filter_id: str) -> dict:
        self._check_owner(requester, user_id)
        text = self._stored(user_id, filter_id)
        if text is None:
            raise not_found("No such filter")
        return json.loads(text)

    def _stored(self, user_id: str, filter_id: str) -> str | None:
        if not _FILTER_ID.match(filter_id):
            return None  # not one of ours: IDs are the numbers add_filter hands out
        return self.store.get_filter(user_id, int(filter_id))

    def resolve(self, user_id: str, param: str | None) -> SyncFilter:
        """/sync's `filter` parameter: inline JSON when it starts with `{`, else a filter ID."""
        if not param:
            return NO_FILTER
        if param.startswith("{"):
            inline = self._inline.get(param)
            if inline is None:
                inline = self._inline[param] = parse_filter(decode_filter_json(param))
                if len(self._inline) > _INLINE_FILTERS:
                    del self._inline[next(iter(self._inline))]
            return inline
        parsed = self._parsed.get((user_id, param))
        if parsed is None:
            text = self._stored(user_id, param)
            if text is None:
                raise invalid_param(f"Unknown filter {param!r}")
            parsed = self._parsed[(user_id, param)] = parse_filter(json.loads(text))
            if len(self._parsed) > _PARSED_FILTERS:
                del self._parsed[next(iter(self._parsed))]
        return parsed


def project(event: dict, paths: tuple) -> dict:
    """The filter's event_fields: only the named dot-separated paths (`\\.` is a literal
    dot in a key) of the event."""
    out: dict = {}
    for path in paths:
        keys = [k.replace("\\.", ".") for k in _FIELD_SEPARATOR.split(path)]
        value = event
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            target = out
            for key in keys[:-1]:
                target = target.setdefault(key, {})
            target[keys[-1]] = value
    return out
