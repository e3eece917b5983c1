"""State resolution v1 (room version 1), as pure functions.

The spec's algorithm (room version 1 page, "State resolution"): the resolved state R starts
as the union of the state sets without their conflicting events; the conflicts are then
settled in passes, `m.room.power_levels` first, then `m.room.join_rules`, then
`m.room.member`, each by the "auth events" walk (oldest first, each event must be allowed
in R with the one before it; the first refused ends the walk), and every other conflict by
picking the newest event allowed in R, or the oldest if none is.

Where the spec leaves room, Synapse's `synapse/state/v1.py` decides, and this follows it:
a key some sets lack is not a conflict; R, for the checks, is the unconflicted state at the
keys the conflicted events' auth rules read (never those events' own auth_events), plus what
each pass resolved; the events of one pass are checked against R as it was before that pass;
a create event is always allowed. Rejected events count as unknown, as Synapse's store reads
them, and unknown events are left out: a conflict with one known event is settled by it.

Nothing here does I/O. State sets are {(type, state_key): event_id}, as in `state_res.py`;
the auth rules are `auth.py`'s.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Mapping, Sequence

from homeserver.core.events import Event
from homeserver.rooms.auth import (
    CREATE,
    JOIN_RULES,
    MEMBER,
    POWER_LEVELS,
    AuthError,
    StateKey,
    auth_types_for_event,
    check_against_state,
)
from homeserver.rooms.versions import RoomVersion

StateIds = Mapping[StateKey, str]
EventLookup = Callable[[str], "Event | None"]
RejectedCheck = Callable[[str], bool]

# The passes that use the "auth events" walk, in order: which conflicted keys each takes.
_AUTH_PASSES: tuple[Callable[[StateKey], bool], ...] = (
    lambda key: key == (POWER_LEVELS, ""),
    lambda key: key[0] == JOIN_RULES,
    lambda key: key[0] == MEMBER,
)


def _never_rejected(event_id: str) -> bool:
    return False


def _signed(event: Event, server: str) -> bool:
    # Events being resolved were checked (signatures included) when they were received.
    return True


def resolve_state_v1(
    version: RoomVersion,
    state_sets: Sequence[StateIds],
    get_event: EventLookup,
    rejected: RejectedCheck = _never_rejected,
) -> dict[StateKey, str]:
    """The resolution of `state_sets` by state resolution v1."""
    if not state_sets:
        return {}
    unconflicted, conflicted_ids = split_conflicted_v1(state_sets)
    if not conflicted_ids:
        return unconflicted

    def known(event_id: str) -> Event | None:
        return None if rejected(event_id) else get_event(event_id)

    conflicted: dict[StateKey, list[Event]] = {}
    for key, ids in conflicted_ids.items():
        conflicted[key] = [e for e in map(known, sorted(ids)) if e is not None]
    auth = auth_state(version, unconflicted, conflicted.values(), known)
    resolved = dict(unconflicted)
    for key, events in conflicted.items():
        if len(events) == 1:
            resolved[key] = events[0].event_id  # the others unknown: nothing to settle
    settled = resolve_conflicts(version, {k: v for k, v in conflicted.items() if len(v) > 1}, auth)
    resolved.update((key, event.event_id) for key, event in settled.items())
    return resolved


def split_conflicted_v1(
    state_sets: Sequence[StateIds],
) -> tuple[dict[StateKey, str], dict[StateKey, set[str]]]:
    """(the unconflicted state, the conflicted event IDs of each conflicted key): a key is
    conflicted when two sets give it different events; one that some sets lack is not."""
    unconflicted = dict(state_sets[0])
    conflicted: dict[StateKey, set[str]] = {}
    for state in state_sets[1:]:
        for key, event_id in state.items():
            if key in conflicted:
                conflicted[key].add(event_id)
            elif key not in unconflicted:
                unconflicted[key] = event_id
            elif unconflicted[key] != event_id:
                conflicted[key] = {unconflicted.pop(key), event_id}
    return unconflicted, conflicted


def auth_state(
    version: RoomVersion,
    unconflicted: StateIds,
    conflicted: Iterable[list[Event]],
    known: EventLookup,
) -> dict[StateKey, Event]:
    """R for the first pass's checks: the unconflicted state's known events at the keys the
    auth rules read for any conflicted event (only those are read, not the whole state)."""
    auth: dict[StateKey, Event] = {}
    for group in conflicted:
        for event in group:
            for key in auth_types_for_event(
                version, event.type, event.sender, event.state_key, event.content
            ):
                if key not in auth and key in unconflicted:
                    found = known(unconflicted[key])
                    if found is not None:
                        auth[key] = found
    return auth


def resolve_conflicts(
    version: RoomVersion,
    conflicted: Mapping[StateKey, list[Event]],
    auth: Mapping[StateKey, Event],
) -> dict[StateKey, Event]:
    """The winner of each conflict (two known events or more): power levels, join rules and
    members by the auth events walk, each pass against R as the passes before left it; the
    rest by the normal events rule, against R once all three passes are done."""
    state = dict(auth)
    resolved: dict[StateKey, Event] = {}
    for takes in _AUTH_PASSES:
        for key, events in conflicted.items():
            if key not in resolved and takes(key):
                resolved[key] = walk_auth_events(version, events, state)
        state.update(resolved)
    for key, events in conflicted.items():
        if key not in resolved:
            resolved[key] = first_allowed(version, events, state)
    return resolved


def walk_auth_events(
    version: RoomVersion, events: list[Event], state: Mapping[StateKey, Event]
) -> Event:
    """The spec's walk for power levels, join rules and members: from the oldest event (by
    `ordered`, reversed), taken unchecked, each next one must be allowed in R with the
    previous winner in it; the first refused ends the walk, and the previous winner wins."""
    walk = list(reversed(ordered(events)))
    current = dict(state)
    winner = walk[0]
    for event in walk[1:]:
        current[(winner.type, winner.state_key or "")] = winner
        if not allowed(version, event, current):
            break
        winner = event
    return winner


def first_allowed(
    version: RoomVersion, events: list[Event], state: Mapping[StateKey, Event]
) -> Event:
    """The spec's rule for every other conflict: the first event in `ordered` order that
    is allowed in R, or, if none is, the last (the oldest)."""
    candidates = ordered(events)
    for event in candidates:
        if allowed(version, event, state):
            return event
    return candidates[-1]


def ordered(events: list[Event]) -> list[Event]:
    """Highest depth first, then the lowest SHA-1 (hex) of the event ID: newest first."""
    return sorted(
        events, key=lambda e: (-int(e.depth), hashlib.sha1(e.event_id.encode()).hexdigest())
    )


def allowed(version: RoomVersion, event: Event, state: Mapping[StateKey, Event]) -> bool:
    """Would the auth rules allow the event in this state? A create event has no rule that
    depends on the state, so it always is (as Synapse has it)."""
    if event.type == CREATE:
        return True
    try:
        check_against_state(version, event, state, _signed)
    except AuthError:
        return False
    return True
