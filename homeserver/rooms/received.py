"""PDUs received over federation: the authorisation a PDU must pass before
`RoomService.receive_event` stores it, and the refusal the sender is told about.

Steps 4 to 6 of the spec's "Checks performed on receipt of a PDU": the auth rules against
the event's auth events, then against the state before it (the resolution of the states
after its prev_events, `resolution.py`), then against the current state. Each check reads
only the few keys the rules look at, so a PDU costs the same in a room of any size unless
it forks the room. Failing either of
the first two rejects the event, and the rejection is remembered (a retry is refused from
the record, without fetching or checking anything) with the state after it, which is the
state before it: a later event may build on a rejected one, as the spec allows. Failing
only the third soft-fails it: stored, never shown to clients, never a forward extremity.
"""

from __future__ import annotations

from homeserver.core.clock import now_ms
from homeserver.core.events import Event
from homeserver.rooms.auth import (
    CREATE,
    AuthError,
    auth_event_ids_to_check,
    auth_types_for_event,
    check_against_state,
    check_auth_events,
)
from homeserver.rooms.resolution import RoomResolver
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.rooms import ResolvedPersist, StoredEvent


class ReceivedEventRefused(Exception):
    """A PDU received over federation that was not stored; the message says why, and is
    what the sender is told for it."""


class MissingEventsRefused(ReceivedEventRefused):
    """Refused only because some of its prev_events or auth_events are neither stored nor
    could be fetched: not the event's fault, so it is held and tried again (rooms/held.py)."""


def authorise_received_event(
    resolver: RoomResolver,
    version: RoomVersion,
    event: Event,
    known: dict[str, StoredEvent],
    signed_by: frozenset[str],
) -> ResolvedPersist:
    """What storing a received event takes (the state before it, whether it is
    soft-failed, and if not the room's current state after it), once it passes the rules.
    Run under the room's lock; `known` are those of the event's prev_events and
    `auth_event_ids_to_check` that are stored, and `signed_by` the servers whose signatures
    on it were verified. Missing prev_events or auth_events are fetched before this, if
    they can be (rooms/gaps.py); an event still missing some is refused
    (`MissingEventsRefused`: held and tried again, rooms/held.py), and not remembered as
    rejected."""
    auth_ids, rejections = _auth_ids_and_rejections(resolver, version, event, known)

    def signed(ev: Event, server: str) -> bool:
        return server in signed_by

    def reject(reason: str, before=None) -> ReceivedEventRefused:
        # With the state after it (the state before it), it may stand as a prev_event.
        before = before if before is not None else resolver.before_of(event)
        resolver.states.reject(event, reason, now_ms(), before)
        return ReceivedEventRefused(reason)

    rejected = [e for e in auth_ids if e in rejections]
    if rejected:  # rule 3.3
        raise reject(f"auth event {next(iter(rejected))} was rejected")
    try:
        check_auth_events(version, event, [known[e].event for e in auth_ids], signed)
    except AuthError as e:
        raise reject(f"rejected by its auth events: {e}") from None
    # Only the keys the rules read: in a big room the states are thousands of events.
    keys = [
        (CREATE, ""),
        *auth_types_for_event(version, event.type, event.sender, event.state_key, event.content),
    ]
    before = resolver.before_of(event)
    try:
        check_against_state(version, event, resolver.events_at(before, keys), signed)
    except AuthError as e:
        raise reject(f"rejected by the state before it: {e}", before) from None
    current = {k: s.event for k, s in resolver.store.current_state(event.room_id, keys).items()}
    try:
        check_against_state(version, event, current, signed)
    except AuthError:
        return ResolvedPersist({event.event_id: before}, soft_failed=True)
    after = resolver.current_after(event, before)
    return ResolvedPersist({event.event_id: before}, False, after.state, after.change)


def _auth_ids_and_rejections(
    resolver: RoomResolver, version: RoomVersion, event: Event, known: dict[str, StoredEvent]
) -> tuple[list[str], dict[str, str]]:
    """The event's auth event IDs, and the rejections among it and them (one read). Refuses
    an event rejected before, and one whose prev_events or auth_events are not all stored."""
    auth_ids = auth_event_ids_to_check(version, event)
    # The event's own rejection, its auth events' and prev_events', in one read.
    prevs = [p for p in event.prev_event_ids if p not in known]
    rejections = resolver.states.rejections([event.event_id, *auth_ids, *prevs])
    refused = rejections.get(event.event_id)
    if refused is not None:
        raise ReceivedEventRefused(f"already rejected: {refused}")
    # A rejected prev_event stands for the state before it, when that was kept.
    rejected_prevs = [p for p in prevs if p in rejections]
    standing = set(resolver.states.state_after(rejected_prevs)) if rejected_prevs else set()
    # Not stored yet: a resolution that meets it (the current state beside the other
    # forward extremities) must find it here, or it would drop it from the state as an
    # event it does not know. A join arriving beside other joins was lost that way.
    resolver.add([event])
    # Read already: the state's events are mostly its auth events.
    resolver.add(stored.event for stored in known.values())
    missing = [e for e in event.prev_event_ids + auth_ids if e not in known and e not in standing]
    if missing:
        raise MissingEventsRefused(
            f"unknown prev_events or auth_events ({', '.join(missing[:3])}); "
            "they could not be fetched"
        )
    return auth_ids, rejections
