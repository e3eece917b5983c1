"""State resolution v2 (room versions 2 to 11) and v2.1 (room version 12), as pure functions;
`resolve_state` hands room version 1 to state resolution v1 (`state_res_v1.py`).

The spec's algorithm (room version 2 page, "State resolution"; the v12 page for v2.1): split
the state sets into the unconflicted state map and the conflicted state set, widen the latter
into the full conflicted set with the auth difference (and, in v2.1, the conflicted state
subgraph), replay its power events in reverse topological power order, then the rest in
mainline order, each through the iterative auth checks, and let unconflicted state win.

Nothing here does I/O: the caller passes state sets as {(type, state_key): event_id}, an
event lookup and an auth chain lookup, and gets the resolved {(type, state_key): event_id}.
The auth rules are `auth.py`'s.
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable, Mapping, Sequence

from homeserver.core.events import Event
from homeserver.rooms.auth import (
    CREATE,
    MEMBER,
    POWER_LEVELS,
    AuthError,
    StateKey,
    auth_event_ids_to_check,
    auth_types_for_event,
    check_against_state,
)
from homeserver.rooms.power_levels import user_power_level
from homeserver.rooms.state_res_v1 import resolve_state_v1
from homeserver.rooms.versions import RoomVersion

JOIN_RULES = "m.room.join_rules"

StateIds = Mapping[StateKey, str]
# get_event(event_id) -> the event, or None when it is not known (it is then left out).
EventLookup = Callable[[str], "Event | None"]
# auth_chain(event_ids) -> every event reachable from them through auth_events, not
# themselves.
AuthChainLookup = Callable[[Iterable[str]], set[str]]
# rejected(event_id) -> was the event rejected? Rejected auth events are not used.
RejectedCheck = Callable[[str], bool]


def _never_rejected(event_id: str) -> bool:
    return False


def _signed(event: Event, server: str) -> bool:
    # Events being resolved were checked (signatures included) when they were received.
    return True


# --- the algorithm ----------------------------------------------------------------------


def resolve_state(
    version: RoomVersion,
    state_sets: Sequence[StateIds],
    get_event: EventLookup,
    auth_chain: AuthChainLookup,
    rejected: RejectedCheck = _never_rejected,
    difference: set[str] | None = None,
    split: tuple[dict[StateKey, str], set[str]] | None = None,
) -> dict[StateKey, str]:
    """The resolution of `state_sets` (spec, "Algorithm", steps 1 to 5). `difference`: their
    auth difference when an index gave it (storage/auth_chains.py), else it is walked;
    `split`: their `split_conflicted`, when the caller made it already. Room version 1
    resolves by state resolution v1 (`state_res_v1.py`), which needs neither."""
    if version.state_resolution_v1:
        return resolve_state_v1(version, state_sets, get_event, rejected)
    if not state_sets:
        return {}
    unconflicted, conflicted = split or split_conflicted(state_sets)
    if not conflicted:
        return unconflicted
    if difference is None:
        difference = auth_difference(state_sets, auth_chain)
    full = full_conflicted_set(version, conflicted, difference, get_event)
    power = power_events_and_auth(full, get_event, auth_chain)  # 1
    ordered_power = reverse_topological_power_order(version, power, get_event, auth_chain)
    start = {} if version.state_resolution_v2_1 else unconflicted  # 2 (v2.1: empty)
    partial = iterative_auth_checks(version, ordered_power, start, get_event, rejected)
    rest = mainline_order(full - power, partial.get((POWER_LEVELS, "")), get_event)  # 3
    resolved = iterative_auth_checks(version, rest, partial, get_event, rejected)  # 4
    resolved.update(unconflicted)  # 5
    return resolved


def split_conflicted(state_sets: Sequence[StateIds]) -> tuple[dict[StateKey, str], set[str]]:
    """(the unconflicted state map, the conflicted state set): a key present in every set
    with one value is unconflicted; every value of any other key is conflicted."""
    # A big room's states are 10,000 keys each and differ in a few: find those keys with
    # one cheap pass per set, then look only at them (a set of values per key, or of the
    # items, cost the hub some 10 ms a resolution).
    first = state_sets[0]
    differing: set[StateKey] = set()
    for state in state_sets[1:]:
        differing.update(k for k, v in state.items() if first.get(k) != v)
        differing.update(first.keys() - state.keys())
    unconflicted = dict(first)
    for key in differing:
        unconflicted.pop(key, None)
    conflicted = {s[k] for s in state_sets for k in differing if k in s}
    return unconflicted, conflicted


def full_conflicted_set(
    version: RoomVersion, conflicted: set[str], difference: set[str], get_event: EventLookup
) -> set[str]:
    """The conflicted state set with the auth difference (and in v2.1 the conflicted state
    subgraph); events the lookup does not know are left out."""
    full = conflicted | difference
    if version.state_resolution_v2_1:
        full |= conflicted_subgraph(conflicted, get_event)
    return {e for e in full if get_event(e) is not None}


def auth_difference(state_sets: Sequence[StateIds], auth_chain: AuthChainLookup) -> set[str]:
    """Events in some state set's full auth chain but not in all of them. A set's chain here
    holds its own events too (as Synapse computes it): an event in every state set is then
    never in the difference, and one in only some of them is conflicted anyway."""
    chains: list[set[str]] = []
    for state in state_sets:
        ids = set(state.values())
        chains.append(ids | auth_chain(ids))
    return set[str]().union(*chains) - chains[0].intersection(*chains[1:])


def conflicted_subgraph(conflicted: set[str], get_event: EventLookup) -> set[str]:
    """v2.1: the events on some auth_events path from one conflicted event to another,
    endpoints included."""
    # reaches[e]: does some path from e through auth_events end at a conflicted event
    # other than e? Filled in depth first, without recursion (auth chains can be long).
    reaches: dict[str, bool] = {}
    stack: list[tuple[str, bool]] = [(e, False) for e in conflicted]
    while stack:
        event_id, expanded = stack.pop()
        if event_id in reaches and not expanded:
            continue
        parents = _auth_ids(get_event, event_id)
        if not expanded:
            reaches[event_id] = False  # in progress: the graph is a DAG, no cycle back
            stack.append((event_id, True))
            stack.extend((p, False) for p in parents if p not in reaches)
            continue
        reaches[event_id] = any(p in conflicted or reaches.get(p, False) for p in parents)
    below = {e for e, r in reaches.items() if r}
    # A conflicted event a path ends at is an auth event of one on the path.
    ends = {p for e in below for p in _auth_ids(get_event, e) if p in conflicted}
    return below | ends


def _auth_ids(get_event: EventLookup, event_id: str) -> list[str]:
    event = get_event(event_id)
    return list(event.auth_event_ids) if event is not None else []


# --- power events and their order -------------------------------------------------------


def is_power_event(event: Event) -> bool:
    """Power levels, join rules, and a kick or ban (a leave or ban sent by someone else);
    the create event too, as Synapse counts it."""
    if event.state_key is None:
        return False
    if event.type in (POWER_LEVELS, JOIN_RULES, CREATE):
        return event.state_key == ""
    return (
        event.type == MEMBER
        and event.membership in ("leave", "ban")
        and event.sender != event.state_key
    )


def power_events_and_auth(
    full: set[str], get_event: EventLookup, auth_chain: AuthChainLookup
) -> set[str]:
    """Step 1's set X: the power events of the full conflicted set, and the events of their
    auth chains that are in the full conflicted set too."""
    power = {e for e in full if (ev := get_event(e)) is not None and is_power_event(ev)}
    return power | (auth_chain(power) & full) if power else set()


def sender_power_level(version: RoomVersion, event: Event, get_event: EventLookup) -> int:
    """The sender's power level by the event's own auth events (v12: and the create event
    its room ID names, which makes creators infinitely powerful)."""
    auth: dict[StateKey, Event] = {}
    for auth_id in auth_event_ids_to_check(version, event):
        auth_event = get_event(auth_id)
        if auth_event is not None and auth_event.state_key is not None:
            auth[(auth_event.type, auth_event.state_key)] = auth_event
    return user_power_level(version, event.sender, auth)


def reverse_topological_power_order(
    version: RoomVersion, event_ids: set[str], get_event: EventLookup, auth_chain: AuthChainLookup
) -> list[str]:
    """Kahn's algorithm on the auth DAG among `event_ids`, an event's auth ancestors first,
    taking at each step the event whose sender has the highest power, then the oldest
    origin_server_ts, then the smallest event ID."""
    events = {e: ev for e in event_ids if (ev := get_event(e)) is not None}
    # Ancestry through events outside the set still orders two events of it.
    parents = {e: auth_chain([e]) & events.keys() for e in events}
    children: dict[str, list[str]] = {e: [] for e in events}
    for event_id, ancestors in parents.items():
        for ancestor in ancestors:
            children[ancestor].append(event_id)
    waiting = {e: len(p) for e, p in parents.items()}

    def key(event_id: str) -> tuple[int, int, str]:
        event = events[event_id]
        return (-sender_power_level(version, event, get_event), event.origin_server_ts, event_id)

    ready = [key(e) for e, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    ordered: list[str] = []
    while ready:
        event_id = heapq.heappop(ready)[2]
        ordered.append(event_id)
        for child in children[event_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, key(child))
    return ordered


# --- mainline order ---------------------------------------------------------------------


def _power_levels_in_auth(event: Event, get_event: EventLookup) -> Event | None:
    for auth_id in event.auth_event_ids:
        auth_event = get_event(auth_id)
        if auth_event is not None and (auth_event.type, auth_event.state_key) == (
            POWER_LEVELS,
            "",
        ):
            return auth_event
    return None


def mainline(power_levels_id: str | None, get_event: EventLookup) -> list[str]:
    """[P0, P1, ...]: the power levels event, the one in its auth events, and so on."""
    chain: list[str] = []
    event = get_event(power_levels_id) if power_levels_id is not None else None
    while event is not None and event.event_id not in chain:
        chain.append(event.event_id)
        event = _power_levels_in_auth(event, get_event)
    return chain


def mainline_position(event: Event, positions: Mapping[str, int], get_event: EventLookup) -> float:
    """The index in the mainline of the first power levels event met walking back from the
    event's own (the event itself is not looked at); infinity if none is on the mainline."""
    seen: set[str] = set()
    current = _power_levels_in_auth(event, get_event)
    while current is not None and current.event_id not in seen:
        if current.event_id in positions:
            return positions[current.event_id]
        seen.add(current.event_id)
        current = _power_levels_in_auth(current, get_event)
    return float("inf")


def mainline_order(
    event_ids: Iterable[str], power_levels_id: str | None, get_event: EventLookup
) -> list[str]:
    """The mainline ordering based on `power_levels_id`: greatest mainline position (the
    oldest base) first, then the oldest origin_server_ts, then the smallest event ID."""
    positions = {e: i for i, e in enumerate(mainline(power_levels_id, get_event))}
    keyed = []
    for event_id in event_ids:
        event = get_event(event_id)
        if event is not None:
            position = mainline_position(event, positions, get_event)
            keyed.append((-position, event.origin_server_ts, event_id))
    return [k[2] for k in sorted(keyed)]


# --- iterative auth checks --------------------------------------------------------------


def iterative_auth_checks(
    version: RoomVersion,
    event_ids: Iterable[str],
    state: StateIds,
    get_event: EventLookup,
    rejected: RejectedCheck = _never_rejected,
) -> dict[StateKey, str]:
    """Applies each state event, in order, that the auth rules allow against the state so
    far, falling back to its own (not rejected) auth events for keys the state lacks."""
    resolved = dict(state)
    for event_id in event_ids:
        event = get_event(event_id)
        if event is None or event.state_key is None:
            continue
        auth: dict[StateKey, Event] = {}
        for auth_id in auth_event_ids_to_check(version, event):
            auth_event = get_event(auth_id)
            if auth_event is not None and auth_event.state_key is not None:
                if not rejected(auth_id):
                    auth[(auth_event.type, auth_event.state_key)] = auth_event
        for key in auth_types_for_event(
            version, event.type, event.sender, event.state_key, event.content
        ):
            current = get_event(resolved[key]) if key in resolved else None
            if current is not None:
                auth[key] = current
        try:
            check_against_state(version, event, auth, _signed)
        except AuthError:
            continue
        resolved[(event.type, event.state_key)] = event_id
    return resolved


# --- auth chains from a lookup ----------------------------------------------------------


def auth_chain_from_lookup(get_event: EventLookup) -> AuthChainLookup:
    """An auth chain lookup that walks `get_event`'s auth_events, remembering each event's
    chain: for events already in memory (tests, or a batch read from the store)."""
    memo: dict[str, frozenset[str]] = {}

    def chain_of(event_id: str) -> frozenset[str]:
        stack = [event_id]
        while stack:
            current = stack[-1]
            if current in memo:
                stack.pop()
                continue
            parents = _auth_ids(get_event, current)
            todo = [p for p in parents if p not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            found: set[str] = set(parents)
            for parent in parents:
                found |= memo[parent]
            memo[current] = frozenset(found)
        return memo[event_id]

    def auth_chain(event_ids: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for event_id in event_ids:
            found |= chain_of(event_id)
        return found

    return auth_chain
