"""A simplified sliding sync request (MSC4186), checked and read into values: its lists,
room subscriptions, the room config each carries, and the extensions asked for.

Clients on the unstable path send the form Synapse's experimental implementation took
(`ranges`, `is_invite`, `required_state` as `[type, state_key]` pairs with `*`, `$ME` and
`$LAZY`); the MSC's final text renamed some of it (`range`, `is_invited`, `required_state`
as `{include, exclude, lazy_members}`). Both are read.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Callable, Mapping

from marshmallow import INCLUDE, Schema, ValidationError, fields, validate

from homeserver.core.errors import invalid_param
from homeserver.core.identifiers import is_valid_room_id
from homeserver.sync.filters import MAX_TIMELINE_LIMIT

# The MSC's caps on a request's lists and subscriptions (400 M_INVALID_PARAM past them).
MAX_LISTS = 100
MAX_SUBSCRIPTIONS = 100
MAX_RANGES = 10  # per list: clients send one
MAX_REQUIRED_STATE = 100  # pairs per room config
WILDCARD, ME, LAZY = "*", "$ME", "$LAZY"
# Request bodies kept parsed (ParsedRequests), and the largest kept: Element X's are a few KB.
PARSED_KEPT = 256
PARSED_MAX_BYTES = 16 * 1024
# A to-device `since` in a body's bytes, its digits a group (ParsedRequests).
_SINCE = re.compile(rb'"since"\s*:\s*"(\d*)"')

StatePair = tuple[str, str]


@dataclass(frozen=True)
class RequiredState:
    """What state a room's entry carries: `include` pairs (`*` matching any type or key,
    `$ME` the user), less `exclude`, and with `lazy` the members the timeline needs."""

    include: tuple[StatePair, ...] = ()
    exclude: tuple[StatePair, ...] = ()
    lazy: bool = False

    def matches(self, event_type: str, state_key: str, user_id: str) -> bool:
        def hit(pairs: tuple[StatePair, ...]) -> bool:
            for t, k in pairs:
                key = user_id if k == ME else k
                if (t == WILDCARD or t == event_type) and (key == WILDCARD or key == state_key):
                    return True
            return False

        return hit(self.include) and not hit(self.exclude)

    @property
    def has_wildcard(self) -> bool:
        return any(WILDCARD in pair for pair in self.include)

    def keys(self, user_id: str) -> list[StatePair]:
        """The exact keys asked for (no wildcard among them)."""
        return [(t, user_id if k == ME else k) for t, k in self.include]

    def merged(self, other: "RequiredState") -> "RequiredState":
        excluded = tuple(p for p in self.exclude if p in other.exclude)  # in both, or it shows
        return RequiredState(
            tuple(dict.fromkeys(self.include + other.include)), excluded, self.lazy or other.lazy
        )


@dataclass(frozen=True)
class RoomConfig:
    timeline_limit: int
    required_state: RequiredState

    def merged(self, other: "RoomConfig") -> "RoomConfig":
        """The superset of two (the MSC's "Combining room configs")."""
        return RoomConfig(
            max(self.timeline_limit, other.timeline_limit),
            self.required_state.merged(other.required_state),
        )

    @cached_property
    def key(self) -> str:
        """The config as text, to tell whether a room's config changed since it was sent.
        Kept once made: a parsed request's configs are shared (ParsedRequests)."""
        rs = self.required_state
        return json.dumps([sorted(rs.include), sorted(rs.exclude), rs.lazy])

    @cached_property
    def text(self) -> str:
        """`to_json` as JSON text, kept once made: a connection saves it for each room sent."""
        return json.dumps(self.to_json())

    def to_json(self) -> dict:
        rs = self.required_state
        return {
            "timeline_limit": self.timeline_limit,
            "include": [list(p) for p in rs.include],
            "exclude": [list(p) for p in rs.exclude],
            "lazy": rs.lazy,
        }

    @classmethod
    def from_json(cls, data: dict) -> "RoomConfig":
        return cls(
            data["timeline_limit"],
            RequiredState(
                tuple((t, k) for t, k in data["include"]),
                tuple((t, k) for t, k in data["exclude"]),
                data["lazy"],
            ),
        )


@dataclass(frozen=True)
class ListFilters:
    is_dm: bool | None = None
    is_encrypted: bool | None = None
    is_invite: bool | None = None
    room_types: tuple | None = None  # None stands for rooms without a type
    not_room_types: tuple = ()
    spaces: tuple | None = None
    tags: tuple | None = None
    not_tags: tuple = ()


@dataclass(frozen=True)
class ListConfig:
    name: str
    ranges: tuple[tuple[int, int], ...] | None  # None: every room the filters keep
    config: RoomConfig
    filters: ListFilters


@dataclass(frozen=True)
class Extensions:
    to_device: bool = False
    to_device_since: int | None = None
    to_device_limit: int = 100
    e2ee: bool = False
    account_data: bool = False
    receipts: bool = False
    typing: bool = False

    @property
    def any(self) -> bool:
        return self.to_device or self.e2ee or self.account_data or self.receipts or self.typing


@dataclass(frozen=True)
class SlidingRequest:
    conn_id: str
    lists: tuple[ListConfig, ...] = ()
    subscriptions: Mapping[str, RoomConfig] = field(default_factory=dict)
    unsubscribe: tuple[str, ...] = ()
    extensions: Extensions = Extensions()

    def with_to_device_since(self, since: int | None) -> "SlidingRequest":
        """The same request with this to-device `since`: itself when it has it already."""
        if since == self.extensions.to_device_since:
            return self
        return replace(self, extensions=replace(self.extensions, to_device_since=since))


# --- the body ---------------------------------------------------------------------------


class _Filters(Schema):
    is_dm = fields.Boolean()
    is_encrypted = fields.Boolean()
    is_invite = fields.Boolean()
    is_invited = fields.Boolean()
    room_types = fields.List(fields.String(allow_none=True))
    not_room_types = fields.List(fields.String(allow_none=True))
    spaces = fields.List(fields.String())
    tags = fields.List(fields.String())
    not_tags = fields.List(fields.String())

    class Meta:
        unknown = INCLUDE  # filters this server does not know narrow nothing


_Range = fields.List(fields.Integer(validate=validate.Range(0)), validate=validate.Length(2, 2))


class _RoomConfigBody(Schema):
    timeline_limit = fields.Integer(load_default=0, validate=validate.Range(0))
    required_state = fields.Raw(load_default=list)

    class Meta:
        unknown = INCLUDE


class _ListBody(_RoomConfigBody):
    ranges = fields.List(_Range, validate=validate.Length(max=MAX_RANGES))
    range = _Range
    filters = fields.Nested(_Filters, load_default=dict)


class _ExtensionBody(Schema):
    enabled = fields.Boolean(load_default=False)
    since = fields.String()
    limit = fields.Integer(validate=validate.Range(1))

    class Meta:
        unknown = INCLUDE  # lists and rooms: every room of the response is meant


class _Body(Schema):
    conn_id = fields.String(load_default="", validate=validate.Length(max=255))
    lists = fields.Dict(
        keys=fields.String(validate=validate.Length(1, 255)),
        values=fields.Nested(_ListBody),
        load_default=dict,
    )
    room_subscriptions = fields.Dict(
        keys=fields.String(), values=fields.Nested(_RoomConfigBody), load_default=dict
    )
    unsubscribe_rooms = fields.List(fields.String(), load_default=list)
    extensions = fields.Dict(
        keys=fields.String(), values=fields.Nested(_ExtensionBody), load_default=dict
    )

    class Meta:
        unknown = INCLUDE  # pos and timeout may come in the body (the MSC's final form)


# One for every request: a schema's making (its fields copied, its nested schemas made) costs
# more than a request's reading, and every long-poll's next request is read again.
_BODY = _Body()


class ParsedRequests:
    """Bodies parsed before, by their bytes. A client long-polls with one body again and
    again (only the pos in the query moves), and the clients of one app send the same one:
    each is parsed once, and the requests that send it share one parsed body and one
    SlidingRequest, never changed, rather than a copy per parked connection. Bounded:
    distinct bodies only push older ones out.

    A body with a to-device `since` (Element X's, every request after its first) is another
    body each time: it is kept by its bytes without the since's digits, once they were found
    to be `extensions.to_device.since`, and each request takes its own since on the shared
    parse. Decoding and reading a body costs a tenth to half a millisecond."""

    def __init__(self, kept: int = PARSED_KEPT):
        self._kept = kept
        self._parsed: OrderedDict[bytes, tuple[dict, SlidingRequest]] = OrderedDict()
        # (kept bytes, since) -> the kept request with that since: the connections one
        # message wakes mostly share theirs (the to-device stream's position).
        self._sinced: OrderedDict[tuple[bytes, bytes], SlidingRequest] = OrderedDict()

    def parse(self, raw: bytes, decode: Callable[[bytes], dict]) -> tuple[dict, SlidingRequest]:
        """The body `decode` makes of `raw`, and the request read from it."""
        found = self._take(raw)
        if found is not None:
            return found
        since = _one_since(raw)
        if since is None:
            body = decode(raw)
            return self._keep(raw, body, parse_request(body))
        # Never a body's own bytes (a JSON text does not start with NUL): one whose since is
        # empty is refused, not found here.
        key = b"\0" + raw[: since.start(1)] + raw[since.end(1) :]
        found = self._take(key)
        if found is None:
            body = decode(raw)
            shared, text = _without_to_device_since(body)
            if shared is None or text != since.group(1).decode():
                return body, parse_request(body)  # a "since" of something else: not kept
            found = self._keep(key, body, parse_request(shared))
        digits = since.group(1)
        sinced = self._sinced.get((key, digits))
        if sinced is None:
            sinced = found[1].with_to_device_since(_to_device_since(digits.decode()))
            if len(key) <= PARSED_MAX_BYTES:
                self._sinced[key, digits] = sinced
                if len(self._sinced) > self._kept:
                    self._sinced.popitem(last=False)
        return found[0], sinced

    def _take(self, key: bytes) -> tuple[dict, SlidingRequest] | None:
        found = self._parsed.get(key)
        if found is not None:
            self._parsed.move_to_end(key)
        return found

    def _keep(self, key: bytes, body: dict, request: SlidingRequest) -> tuple[dict, SlidingRequest]:
        found = (body, request)
        if len(key) <= PARSED_MAX_BYTES:
            self._parsed[key] = found
            if len(self._parsed) > self._kept:
                self._parsed.popitem(last=False)
        return found


def _one_since(raw: bytes) -> re.Match | None:
    """The body's one `"since": "<digits>"`, if it has exactly one."""
    found = _SINCE.search(raw)
    if found is None or _SINCE.search(raw, found.end()) is not None:
        return None
    return found


def _without_to_device_since(body: dict) -> tuple[dict | None, str]:
    """The body without its to-device `since`, and that `since`; (None, "") when it has
    none that is a string (a since of another type is the schema's to refuse)."""
    extensions = body.get("extensions")
    if not isinstance(extensions, dict):
        return None, ""
    to_device = extensions.get("to_device")
    if not isinstance(to_device, dict) or not isinstance(to_device.get("since"), str):
        return None, ""
    since = to_device["since"]
    rest = {k: v for k, v in to_device.items() if k != "since"}
    return {**body, "extensions": {**extensions, "to_device": rest}}, since


def _to_device_since(since: str | None) -> int | None:
    if since is not None and not since.isdigit():
        raise invalid_param("to_device.since is not a token from this server")
    return int(since) if since else None


def parse_request(body: dict) -> SlidingRequest:
    try:
        loaded = _BODY.load(body)
    except ValidationError as e:
        raise invalid_param(f"Bad sliding sync request: {e.messages}") from e
    if len(loaded["lists"]) > MAX_LISTS:
        raise invalid_param(f"At most {MAX_LISTS} lists")
    if len(loaded["room_subscriptions"]) > MAX_SUBSCRIPTIONS:
        raise invalid_param(f"At most {MAX_SUBSCRIPTIONS} room subscriptions")
    subscriptions = {}
    for room_id, sub in loaded["room_subscriptions"].items():
        if not is_valid_room_id(room_id):
            raise invalid_param(f"Not a room ID: {room_id}")
        subscriptions[room_id] = _room_config(sub)
    return SlidingRequest(
        loaded["conn_id"],
        tuple(_list(name, body) for name, body in sorted(loaded["lists"].items())),
        MappingProxyType(subscriptions),  # shared between requests (ParsedRequests)
        tuple(loaded["unsubscribe_rooms"]),
        _extensions(loaded["extensions"]),
    )


def _list(name: str, body: dict) -> ListConfig:
    ranges = body.get("ranges")
    if ranges is None and "range" in body:
        ranges = [body["range"]]
    if ranges is not None and any(lo > hi for lo, hi in ranges):
        raise invalid_param(f"List {name}: a range starts after its end")
    f = body["filters"]
    room_types = f.get("room_types")
    return ListConfig(
        name,
        None if ranges is None else tuple((lo, hi) for lo, hi in ranges),
        _room_config(body),
        ListFilters(
            is_dm=f.get("is_dm"),
            is_encrypted=f.get("is_encrypted"),
            is_invite=f.get("is_invite", f.get("is_invited")),
            room_types=None if room_types is None else tuple(room_types),
            not_room_types=tuple(f.get("not_room_types", ())),
            spaces=tuple(f["spaces"]) if "spaces" in f else None,
            tags=tuple(f["tags"]) if "tags" in f else None,
            not_tags=tuple(f.get("not_tags", ())),
        ),
    )


def _room_config(body: dict) -> RoomConfig:
    return RoomConfig(
        min(body["timeline_limit"], MAX_TIMELINE_LIMIT), _required_state(body["required_state"])
    )


def _required_state(raw) -> RequiredState:
    """`[[type, state_key], ...]`, or `{include: [{type?, state_key?}], exclude, lazy_members}`."""
    if isinstance(raw, dict):
        include = [_element(e) for e in _items(raw.get("include", []))]
        exclude = [_element(e) for e in _items(raw.get("exclude", []))]
        lazy = raw.get("lazy_members", False)
        if not isinstance(lazy, bool):
            raise invalid_param("required_state.lazy_members must be a boolean")
        return RequiredState(tuple(include), tuple(exclude), lazy)
    pairs = []
    for pair in _items(raw):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        ):
            raise invalid_param("required_state holds [type, state_key] pairs of strings")
        pairs.append((pair[0], pair[1]))
    lazy = ("m.room.member", LAZY) in pairs
    return RequiredState(tuple(p for p in pairs if p[1] != LAZY), (), lazy)


def _items(raw) -> list:
    if not isinstance(raw, list) or len(raw) > MAX_REQUIRED_STATE:
        raise invalid_param(f"required_state: a list of at most {MAX_REQUIRED_STATE} entries")
    return raw


def _element(element) -> StatePair:
    if not isinstance(element, dict) or not all(
        isinstance(element.get(k, ""), str) for k in ("type", "state_key")
    ):
        raise invalid_param("required_state entries are {type?, state_key?} of strings")
    return (element.get("type", WILDCARD), element.get("state_key", WILDCARD))


def _extensions(found: dict) -> Extensions:
    def on(name: str) -> bool:
        return name in found and found[name]["enabled"]

    to_device = found.get("to_device", {})
    return Extensions(
        to_device=on("to_device"),
        to_device_since=_to_device_since(to_device.get("since")),
        to_device_limit=min(to_device.get("limit", 100), 100),
        e2ee=on("e2ee"),
        account_data=on("account_data"),
        receipts=on("receipts"),
        typing=on("typing"),
    )
