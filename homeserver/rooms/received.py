"""PDUs received over federation: the authorisation a PDU must pass before
`RoomService.receive_event` stores it, and the refusal the sender is told about."""

from __future__ import annotations

from homeserver.core.events import Event
from homeserver.rooms.auth import (
    AuthError,
    auth_event_ids_to_check,
    auth_types_for_event,
    check_against_state,
    check_auth_events,
)
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.rooms import RoomStore, StoredEvent


class ReceivedEventRefused(Exception):
    """A PDU received over federation that was not stored; the message says why, and is
    what the sender is told for it."""


def authorise_received_event(
    store: RoomStore,
    version: RoomVersion,
    event: Event,
    known: dict[str, StoredEvent],
    signed_by: frozenset[str],
) -> None:
    """Steps 4 to 6 of the spec's "Checks performed on receipt of a PDU", kept minimal: the
    event must pass the auth rules against its auth_events, against the state before it,
    and against the current state; else `ReceivedEventRefused`. Run under the room's lock;
    `known` are those of the event's prev_events and `auth_event_ids_to_check` that are
    stored, and
    `signed_by` the servers whose signatures on it were verified.

    Missing prev_events or auth_events are not fetched from other servers (no backfill):
    such an event is refused. There is no state resolution: the state before an event is
    the current state when its prev_events are the room's forward extremities (the linear
    case), else the state at the newest of them in stream order."""
    room_id = event.room_id
    auth_ids = auth_event_ids_to_check(version, event)
    missing = [e for e in event.prev_event_ids + auth_ids if e not in known]
    if missing:
        raise ReceivedEventRefused(
            f"unknown prev_events or auth_events ({', '.join(missing[:3])}); "
            "missing events are not fetched"
        )

    def signed(ev: Event, server: str) -> bool:
        return server in signed_by

    try:
        check_auth_events(version, event, [known[e].event for e in auth_ids], signed)
    except AuthError as e:
        raise ReceivedEventRefused(f"rejected by its auth events: {e}") from None
    keys = auth_types_for_event(version, event.type, event.sender, event.state_key, event.content)
    extremities = {e.event_id for e in store.forward_extremities(room_id)}
    linear = set(event.prev_event_ids) == extremities
    if not linear:
        position = max(known[e].stream_ordering for e in event.prev_event_ids)
        before = {k: s.event for k, s in store.state_at(room_id, position).items()}
        try:
            check_against_state(version, event, before, signed)
        except AuthError as e:
            raise ReceivedEventRefused(f"rejected by the state before it: {e}") from None
    current = {k: s.event for k, s in store.current_state(room_id, keys).items()}
    try:
        check_against_state(version, event, current, signed)
    except AuthError as e:
        # In the linear case the current state is the state before the event.
        raise ReceivedEventRefused(
            f"rejected by the state before it: {e}"
            if linear
            else f"soft-failed against the current state: {e}"
        ) from None
