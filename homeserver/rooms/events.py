"""PDUs: building, hashing, signing, redaction and size limits (server-server spec,
"Signing Events"; room versions pages, "Redactions" and "Event IDs").

A PDU is kept as the dict that goes over federation. For room versions 4 and later it has no
`event_id` field: the ID is derived from the reference hash, so an `Event` carries both.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
from typing import Any

from canonicaljson import encode_canonical_json
from signedjson.sign import sign_json
from unpaddedbase64 import encode_base64

from homeserver.core.events import Event
from homeserver.core.identifiers import (
    create_event_id_for_room,
    is_hash_room_id,
    is_server_event_id,
    is_valid_room_id,
    is_valid_user_id,
    room_id_for_create_event,
)
from homeserver.rooms.versions import RoomVersion

MAX_PDU_BYTES = 65536
MAX_KEY_BYTES = 255  # sender, room_id, state_key, type, event_id
MAX_AUTH_EVENTS = 10
MAX_PREV_EVENTS = 20
MAX_DEPTH = 2**53 - 1
CANONICAL_INT_RANGE = (-(2**53) + 1, 2**53 - 1)


class InvalidEvent(ValueError):
    """An event that breaks the format rules; `too_large` when it is only over the size limit."""

    def __init__(self, reason: str, too_large: bool = False):
        super().__init__(reason)
        self.too_large = too_large


# --- redaction --------------------------------------------------------------------------

_KEPT_TOP_LEVEL = frozenset(
    {
        "event_id",
        "type",
        "room_id",
        "sender",
        "state_key",
        "content",
        "hashes",
        "signatures",
        "depth",
        "prev_events",
        "auth_events",
        "origin_server_ts",
    }
)
# Kept before v11 only.
_KEPT_TOP_LEVEL_OLD = frozenset({"prev_state", "origin", "membership"})

_KEPT_CONTENT = {
    "m.room.member": ("membership", "join_authorised_via_users_server"),
    "m.room.create": ("creator",),
    "m.room.join_rules": ("join_rule", "allow"),
    "m.room.power_levels": (
        "ban",
        "events",
        "events_default",
        "kick",
        "redact",
        "state_default",
        "users",
        "users_default",
    ),
    "m.room.history_visibility": ("history_visibility",),
    "m.room.aliases": ("aliases",),
}


def redact(version: RoomVersion, pdu: dict) -> dict:
    """The event with everything the redaction algorithm strips removed (a new dict)."""
    kept = (
        _KEPT_TOP_LEVEL
        if version.updated_redaction_rules
        else (_KEPT_TOP_LEVEL | _KEPT_TOP_LEVEL_OLD)
    )
    out = {k: copy.deepcopy(v) for k, v in pdu.items() if k in kept}
    content = pdu.get("content")
    if not isinstance(content, dict):
        return out
    event_type: Any = pdu.get("type")  # `pdu` is any dict: no type is assumed
    if version.updated_redaction_rules and event_type == "m.room.create":
        out["content"] = copy.deepcopy(content)
        return out
    keys = [k for k in _KEPT_CONTENT.get(event_type, ()) if _kept_in(version, event_type, k)]
    if version.updated_redaction_rules:
        if event_type == "m.room.power_levels":
            keys.append("invite")
        elif event_type == "m.room.redaction":
            keys.append("redacts")
    new_content = {k: copy.deepcopy(content[k]) for k in keys if k in content}
    if (
        version.updated_redaction_rules
        and event_type == "m.room.member"
        and isinstance(content.get("third_party_invite"), dict)
        and "signed" in content["third_party_invite"]
    ):
        new_content["third_party_invite"] = {
            "signed": copy.deepcopy(content["third_party_invite"]["signed"])
        }
    out["content"] = new_content
    return out


def _kept_in(version: RoomVersion, event_type: str, key: str) -> bool:
    """Whether the version's redaction keeps this content key: `allow` from v8,
    `join_authorised_via_users_server` from v9, m.room.aliases' `aliases` before v6."""
    if key == "allow":
        return version.redaction_keeps_allow
    if key == "join_authorised_via_users_server":
        return version.redaction_keeps_join_authoriser
    if event_type == "m.room.aliases":
        return version.special_case_aliases
    return True


# --- hashes, IDs and signatures ---------------------------------------------------------


def compute_content_hash(pdu: dict) -> bytes:
    """sha256 of the canonical JSON of the whole event minus unsigned, signatures, hashes."""
    stripped = {k: v for k, v in pdu.items() if k not in ("unsigned", "signatures", "hashes")}
    return hashlib.sha256(encode_canonical_json(stripped)).digest()


def compute_reference_hash(version: RoomVersion, pdu: dict) -> bytes:
    """sha256 of the redacted event's canonical JSON, without signatures and unsigned."""
    redacted = redact(version, pdu)
    redacted.pop("signatures", None)
    redacted.pop("unsigned", None)
    return hashlib.sha256(encode_canonical_json(redacted)).digest()


def event_id_for(version: RoomVersion, pdu: dict) -> str:
    """v3 and later: `$` and the reference hash (v3 standard base64, v4 on URL-safe). v1 and
    v2: the event's own `event_id` (its server's signature vouches for it, pdu_checks.py),
    or "" when it has none, which `check_pdu_format` refuses."""
    if not version.event_id_is_reference_hash:
        event_id = pdu.get("event_id")
        return event_id if isinstance(event_id, str) and is_server_event_id(event_id) else ""
    reference = compute_reference_hash(version, pdu)
    return "$" + encode_base64(reference, urlsafe=version.url_safe_event_ids)


def new_event_id(server_name: str) -> str:
    """A v1 or v2 event's ID: `$opaque:server`, as unguessable as a room ID."""
    return f"${secrets.token_urlsafe(18)}:{server_name}"


def event_references(version: RoomVersion, events: list[Event]) -> list:
    """How an event names its prev or auth events: by ID (v3 and later); in v1 and v2 as
    [ID, {"sha256": the event's content hash}] pairs, the hash as the event carries it."""
    if version.event_id_is_reference_hash:
        return [e.event_id for e in events]
    return [[e.event_id, {"sha256": e.pdu.get("hashes", {}).get("sha256", "")}] for e in events]


def room_id_of(version: RoomVersion, pdu: dict) -> str:
    """The room a PDU belongs to: its `room_id`, or for the create event of a room whose ID
    is its create event's (v12), the ID its reference hash gives."""
    if version.room_id_is_create_event_id and _is_create(pdu) and "room_id" not in pdu:
        return room_id_for_create_event(event_id_for(version, pdu))
    return pdu["room_id"]


def _is_create(pdu: dict) -> bool:
    return pdu.get("type") == "m.room.create" and pdu.get("state_key") == ""


def add_hashes_and_signatures(
    version: RoomVersion, pdu: dict, server_name: str, signing_key
) -> None:
    """Sets `hashes.sha256` over the full event, then signs the redacted event with our key
    and copies the signature back (so it stays valid if the event is later redacted)."""
    pdu["hashes"] = {"sha256": encode_base64(compute_content_hash(pdu))}
    signed = sign_json(redact(version, pdu), server_name, signing_key)
    pdu.setdefault("signatures", {}).update(signed["signatures"])


# --- format checks ----------------------------------------------------------------------


def check_canonical_values(value: Any, path: str = "content") -> None:
    """Room versions 6+ reject floats and integers outside the canonical JSON range."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not CANONICAL_INT_RANGE[0] <= value <= CANONICAL_INT_RANGE[1]:
            raise InvalidEvent(f"{path}: integer out of the canonical JSON range")
        return
    if isinstance(value, float):
        raise InvalidEvent(f"{path}: floats are not allowed in events")
    if isinstance(value, dict):
        for k, v in value.items():
            check_canonical_values(v, f"{path}.{k}")
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_canonical_values(v, f"{path}[{i}]")
        return
    raise InvalidEvent(f"{path}: not a JSON value")


def check_size_limits(event: Event) -> None:
    pdu = event.pdu
    for key in ("sender", "room_id", "type", "state_key"):
        value = pdu.get(key)
        if value is not None and len(value.encode("utf-8")) > MAX_KEY_BYTES:
            raise InvalidEvent(f"{key} is longer than {MAX_KEY_BYTES} bytes", too_large=True)
    if len(event.event_id.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidEvent("event_id is too long", too_large=True)
    if len(encode_canonical_json(pdu)) > MAX_PDU_BYTES:
        raise InvalidEvent(f"event is larger than {MAX_PDU_BYTES} bytes", too_large=True)


# --- building ---------------------------------------------------------------------------


def build_event(
    version: RoomVersion,
    *,
    room_id: str | None,
    sender: str,
    event_type: str,
    content: dict,
    state_key: str | None,
    prev_events: list[Event],
    auth_events: list[Event],
    origin_server_ts: int,
    server_name: str,
    signing_key,
    redacts: str | None = None,
) -> Event:
    """A signed event of ours. `prev_events` are the room's forward extremities. `room_id`
    is None only for the create event of a room whose ID it will give (v12). `redacts` is a
    redaction's top-level target (room versions before 11)."""
    if len(prev_events) > MAX_PREV_EVENTS or len(auth_events) > MAX_AUTH_EVENTS:
        raise InvalidEvent("too many prev_events or auth_events")
    if (room_id is None) != (version.room_id_is_create_event_id and event_type == "m.room.create"):
        raise InvalidEvent("only a v12 create event, and every one, has no room_id")
    if version.strict_canonical_json:
        check_canonical_values(content)
    depth = min(max((e.depth for e in prev_events), default=0) + 1, MAX_DEPTH)
    pdu: dict[str, Any] = {
        "sender": sender,
        "type": event_type,
        "content": copy.deepcopy(content),
        "prev_events": event_references(version, prev_events),
        "auth_events": event_references(version, auth_events),
        "depth": depth,
        "origin_server_ts": origin_server_ts,
    }
    if not version.event_id_is_reference_hash:
        pdu["event_id"] = new_event_id(server_name)
    if room_id is not None:
        pdu["room_id"] = room_id
    if state_key is not None:
        pdu["state_key"] = state_key
    if redacts is not None:
        pdu["redacts"] = redacts
    add_hashes_and_signatures(version, pdu, server_name, signing_key)
    event = Event(event_id_for(version, pdu), pdu)
    check_size_limits(event)
    return event


# Fields a make_join/make_leave/make_knock template may carry into the event we sign; the
# resident server chose prev_events, auth_events and depth, we choose the rest.
_TEMPLATE_FIELDS = (
    "room_id",
    "sender",
    "type",
    "state_key",
    "content",
    "prev_events",
    "auth_events",
    "depth",
    "origin",
)


def event_from_template(
    version: RoomVersion,
    template: dict,
    *,
    content: dict,
    origin_server_ts: int,
    server_name: str,
    signing_key,
) -> Event:
    """Our membership event from another server's make_* template: its graph position,
    our content, hashes and signature. Raises `InvalidEvent` for a template that does not
    make a valid event."""
    pdu = {k: copy.deepcopy(template[k]) for k in _TEMPLATE_FIELDS if k in template}
    pdu["content"] = copy.deepcopy(content)
    pdu["origin_server_ts"] = origin_server_ts
    if not version.event_id_is_reference_hash:
        pdu["event_id"] = new_event_id(server_name)
    pdu["hashes"] = {"sha256": ""}  # replaced below; the format check wants the field
    pdu["signatures"] = {}
    event = Event(event_id_for(version, pdu), pdu)
    check_pdu_format(version, event)
    del pdu["hashes"], pdu["signatures"]
    add_hashes_and_signatures(version, pdu, server_name, signing_key)
    event = Event(event_id_for(version, pdu), pdu)
    check_size_limits(event)
    return event


# --- received PDUs ----------------------------------------------------------------------

_PDU_FIELDS = {
    "auth_events": list,
    "content": dict,
    "depth": int,
    "hashes": dict,
    "origin_server_ts": int,
    "prev_events": list,
    "sender": str,
    "signatures": dict,
    "type": str,
}


def check_pdu_format(version: RoomVersion, event: Event) -> None:
    """A PDU received over federation has the event format of its room version (v3 and
    later: no `event_id`, events named by reference hash), within the size limits.
    Raises `InvalidEvent`."""
    pdu = event.pdu
    if not event.event_id:
        raise InvalidEvent("event_id is missing or not a valid event ID")
    for name, kind in _PDU_FIELDS.items():
        value = pdu.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidEvent(f"{name} is missing or not a {kind.__name__}")
    if not is_valid_user_id(pdu["sender"]):
        raise InvalidEvent("sender is not a valid user ID")
    _check_room_id(version, pdu)
    if "state_key" in pdu and not isinstance(pdu["state_key"], str):
        raise InvalidEvent("state_key is not a string")
    if not isinstance(pdu["hashes"].get("sha256"), str):
        raise InvalidEvent("hashes.sha256 is missing")
    if not 0 <= pdu["depth"] <= MAX_DEPTH:
        raise InvalidEvent("depth is out of range")
    _check_event_references(version, pdu)
    if version.strict_canonical_json:
        check_canonical_values(pdu, "event")
    check_size_limits(event)


def _is_reference(version: RoomVersion, ref: Any) -> bool:
    if version.event_id_is_reference_hash:
        return isinstance(ref, str) and ref.startswith("$")
    return (
        isinstance(ref, list)
        and len(ref) == 2
        and isinstance(ref[0], str)
        and is_server_event_id(ref[0])
        and isinstance(ref[1], dict)
    )


def _check_room_id(version: RoomVersion, pdu: dict) -> None:
    """v12: the create event has no room_id (auth rule 1.2 rejects one that has), every other
    event names its room by hash and does not list the create event in auth_events (the room
    ID implies it). Before v12: a `!localpart:server` room ID on every event."""
    room_id = pdu.get("room_id")
    if not version.room_id_is_create_event_id:
        if not isinstance(room_id, str) or ":" not in room_id or not is_valid_room_id(room_id):
            raise InvalidEvent("room_id is missing or not a valid room ID")
        return
    if room_id is None and _is_create(pdu):
        return
    if not isinstance(room_id, str) or not is_hash_room_id(room_id):
        raise InvalidEvent("room_id is missing or not a room version 12 room ID")
    if create_event_id_for_room(room_id) in pdu["auth_events"]:
        raise InvalidEvent("auth_events must not list the create event")


def _check_event_references(version: RoomVersion, pdu: dict) -> None:
    """`prev_events` and `auth_events` are lists of event IDs (v1, v2: of [ID, hashes]
    pairs), no longer than an event may name; only the create event, which starts the
    room, has no prev_events."""
    for name, limit in (("prev_events", MAX_PREV_EVENTS), ("auth_events", MAX_AUTH_EVENTS)):
        refs = pdu[name]
        if len(refs) > limit or not all(_is_reference(version, r) for r in refs):
            raise InvalidEvent(f"{name} must be at most {limit} event IDs")
    if not pdu["prev_events"] and pdu["type"] != "m.room.create":
        raise InvalidEvent("prev_events is empty")
