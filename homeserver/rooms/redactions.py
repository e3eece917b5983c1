"""Redactions (client-server spec, "Redactions"; room version pages, "Redactions" and, from
version 3, "Handling redactions"): where a redaction names its target, who may redact what,
and the write that applies redactions as events are stored.

A redaction is an ordinary event for the auth rules (its sender needs the
`m.room.redaction` event level). Whether it applies to its target is decided apart, as the
spec says for room versions 3 and later: it applies when its sender had the room's `redact`
level in the state before the redaction, as this server resolved it (never by the
redaction's own auth events, which its sender chose), or when the target was sent from the
redaction sender's server. A received redaction whose target is not here is stored and applies when
the target arrives. A local user is held to more: without the `redact` level they may
redact only their own events (as Synapse does), and a server admin those of users here.

Applying rewrites the target's stored PDU to the room version's redacted form, in the
transaction that stores the redaction or the target, and the original is not kept: every
reader, federation included, then serves the redacted event, whose hashes and signatures the
algorithm keeps. The content hash was checked when the event arrived; a server that fetches
the redacted event from us finds the hash no longer matches and keeps it redacted, which is
what the spec asks of it. Synapse keeps originals for a week for moderators; we do not,
so a redaction here removes the content at once, and nothing can undo it.

Not done: the spec asks that a redaction not reach clients until it has applied; ours are
served like any event, applied or not (a client given one whose target it lacks, or one
that did not apply, still shows the target as this server serves it).
"""

from __future__ import annotations

from dataclasses import replace

from homeserver.core.errors import bad_json, forbidden, not_found
from homeserver.core.events import Event
from homeserver.core.identifiers import server_of
from homeserver.core.requester import Requester
from homeserver.rooms.events import redact
from homeserver.rooms.format import client_event
from homeserver.rooms.planned import PlannedEvent
from homeserver.rooms.power_levels import (
    CREATE,
    POWER_LEVELS,
    StateKey,
    named_level,
    user_power_level,
)
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS, RoomVersion
from homeserver.storage import event_state
from homeserver.storage.redactions import PendingRedaction, RedactionStore
from homeserver.storage.rooms import RoomStore, StoredEvent

REDACTION = "m.room.redaction"
# The spec's default `redact` level when the power levels do not set one.
DEFAULT_REDACT_LEVEL = 50
# Events a client may not redact, as Synapse refuses them: a redacted create event loses
# what defines the room (before v11), a redacted server ACL lets every server in.
_NOT_REDACTABLE = (CREATE, "m.room.server_acl")


def redacts_of(version: RoomVersion, event: Event) -> str | None:
    """The event a redaction names: `content.redacts` from v11, the top-level `redacts`
    before. None if it names none (such a redaction is stored and never applies)."""
    if version.updated_redaction_rules:
        value = event.content.get("redacts")
    else:
        value = event.pdu.get("redacts")
    return value if isinstance(value, str) else None


def may_redact_any(version: RoomVersion, user_id: str, state: dict[StateKey, Event]) -> bool:
    """Has `user_id` the room's `redact` level in `state`?"""
    level = named_level(state, "redact", DEFAULT_REDACT_LEVEL)
    return user_power_level(version, user_id, state) >= level


# --- a local user's redaction -----------------------------------------------------------


def local_redaction(
    store: RoomStore,
    version: RoomVersion,
    requester: Requester,
    room_id: str,
    event_id: str | None,
    content: dict,
) -> PlannedEvent:
    """The redaction `requester` may send, or the error they are told. `event_id` is the
    /redact path's; from /send it is `content.redacts`."""
    content = dict(content)
    if event_id is None:
        event_id = content.get("redacts")
        if not isinstance(event_id, str):
            raise bad_json("content.redacts must be the ID of the event to redact")
    if "reason" in content and not isinstance(content["reason"], str):
        raise bad_json("reason must be a string")
    _check_may_redact(store, version, requester, room_id, event_id)
    if version.updated_redaction_rules:
        content["redacts"] = event_id
        return PlannedEvent(requester.user_id, REDACTION, content)
    content.pop("redacts", None)  # before v11 it is a top-level key
    return PlannedEvent(requester.user_id, REDACTION, content, redacts=event_id)


def _check_may_redact(
    store: RoomStore, version: RoomVersion, requester: Requester, room_id: str, event_id: str
) -> None:
    user_id = requester.user_id
    keys = [(CREATE, ""), (POWER_LEVELS, ""), ("m.room.member", user_id)]
    state = {k: s.event for k, s in store.current_state(room_id, keys).items()}
    member = state.get(("m.room.member", user_id))
    if member is None or member.membership != "join":
        raise forbidden(f"{user_id} is not joined to this room")
    target = store.events_in_room(room_id, [event_id]).get(event_id)
    moderator = may_redact_any(version, user_id, state)
    if target is None:
        if moderator:
            return  # stored; it applies if the event ever reaches us
        raise not_found("Unknown event in this room")
    if target.event.type in _NOT_REDACTABLE:
        raise forbidden(f"Redacting {target.event.type} events is not permitted")
    sender = target.event.sender
    if sender == user_id or moderator:
        return
    if requester.is_admin and server_of(sender) == server_of(user_id):
        return  # the spec lets server admins redact their users' events
    raise forbidden("You may only redact your own events")


# --- applying, as events are stored -----------------------------------------------------


class RedactionWrites:
    """Two writes for the persist transaction of `events`. `record`, before the events take
    their stream positions (storage/streams.py: every other writer waits from then to the
    commit), records the redactions among them and looks for a recorded redaction naming
    one of them or of their targets. `apply`, once the events are in, applies every
    redaction that now has its target: those among `events`, and earlier ones naming one of
    `events`; it reads nothing when `record` found none. `applied` gets
    {event_id: (redacted PDU, unsigned)} for every event it redacted."""

    def __init__(self, events: list[Event], now_ms: int, applied: dict | None = None):
        self.events = events
        self.now_ms = now_ms
        self.applied = applied
        self.room_id = events[0].room_id
        self.targets = [e.event_id for e in events]
        self.named = True  # until `record` looked
        self._version: RoomVersion | None = None

    def version(self, tx) -> RoomVersion:
        if self._version is None:
            self._version = KNOWN_ROOM_VERSIONS[RedactionStore.room_version(tx, self.room_id)]
        return self._version

    def record(self, tx) -> None:
        for event in self.events:
            if event.type == REDACTION and (target := redacts_of(self.version(tx), event)):
                by_power = _by_power(tx, self.version(tx), event)
                RedactionStore.record(tx, event, target, by_power)
                self.targets.append(target)
        self.named = RedactionStore.names_any(tx, self.room_id, self.targets)

    def apply(self, tx) -> None:
        if not self.named:
            return
        done: set[str] = set()
        for pending in RedactionStore.pending(tx, self.room_id, self.targets):
            target = pending.target
            if target.event_id in done or not _applies(pending):
                continue
            done.add(target.event_id)
            redacted = redact(self.version(tx), target.pdu)
            unsigned = _redacted_unsigned(pending)
            redaction_id = pending.redaction.event_id
            RedactionStore.apply(tx, target, redacted, unsigned, redaction_id, self.now_ms)
            if self.applied is not None:
                self.applied[target.event_id] = (redacted, unsigned)


def as_redacted(stored: list[StoredEvent], applied: dict) -> list[StoredEvent]:
    """`stored` as the store holds them once `RedactionWrites` has redacted some of them
    (`applied`): an earlier redaction named them, and clients must never see their content."""
    if not applied:
        return stored
    return [
        replace(
            s,
            event=Event(s.event.event_id, applied[s.event.event_id][0]),
            unsigned=applied[s.event.event_id][1],
        )
        if s.event.event_id in applied
        else s
        for s in stored
    ]


def _by_power(tx, version: RoomVersion, redaction: Event) -> bool:
    """Had the redaction's sender the `redact` level in the state before the redaction?

    That state is the redaction's own state group (a redaction is no state event, so the
    state after it is the state before it), written in this transaction: for a received
    event the resolution of the states after its prev_events, for ours the current state.
    The redaction's auth events are not read: a hostile server may name a power levels
    event of its own making there, which only its own auth events allow."""
    keys = [(CREATE, ""), (POWER_LEVELS, "")]
    state_ids = event_state.state_of(tx, redaction.event_id, keys)
    if state_ids is None:
        return False
    ids = [state_ids[k] for k in keys if k in state_ids]
    pdus = RedactionStore.event_pdus(tx, redaction.room_id, ids)
    state = {k: Event(state_ids[k], pdus[state_ids[k]]) for k in keys if state_ids.get(k) in pdus}
    return may_redact_any(version, redaction.sender, state)


def _applies(pending: PendingRedaction) -> bool:
    """The spec's rule for room versions 3 and later: the `redact` level, or the same
    server as the target's sender."""
    return pending.by_power or (
        server_of(pending.redaction.sender) == server_of(pending.target.sender)
    )


def _redacted_unsigned(pending: PendingRedaction) -> dict:
    """A redacted event's unsigned: `redacted_because` (the redaction, as clients see events)
    and `replaces_state`; the replaced content goes, as Synapse drops it."""
    because = client_event(StoredEvent(pending.redaction, 0), pending.redaction.origin_server_ts)
    del because["unsigned"]  # its age is from when we stored it, not when it is read
    unsigned = {"redacted_because": because}
    if "replaces_state" in pending.target_unsigned:
        unsigned["replaces_state"] = pending.target_unsigned["replaces_state"]
    return unsigned
