"""State resolution against the store: the state before a received event (the resolution
of the states after its prev_events) and the room's current state (the resolution of the
states at its forward extremities). The algorithm is `state_res.py`'s, pure; this module
reads the events, auth chains and state groups it needs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from homeserver.core.concurrency import let_io_run
from homeserver.core.events import Event
from homeserver.rooms.auth import POWER_LEVELS, StateKey, auth_types_for_event
from homeserver.rooms.state_res import auth_chain_from_lookup, resolve_state, split_conflicted
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.event_state import Delta, EventStateStore, GroupRef
from homeserver.storage.room_graph import RoomGraphStore
from homeserver.storage.rooms import RoomStore, StoredEvent

StateIds = dict[StateKey, str]

# How far back an auth chain is read into memory for one resolution.
_AUTH_CHAIN_CAP = 10_000
# The longest a resolution runs on the hub between two pauses.
_RUN_SECONDS = 0.01


@dataclass(frozen=True)
class CurrentAfter:
    """The room's current state once a received event is stored: as a change (`change`)
    when the event follows exactly the room's forward extremities, so the state before it
    is the current state; else whole (`state`), as a resolution made it."""

    state: StateIds | None = None
    change: Delta | None = None


class RoomResolver:
    """One room's events and states, read as a resolution needs them (under its lock)."""

    def __init__(self, store: RoomStore, version: RoomVersion, room_id: str):
        self.store = store
        self.version = version
        self.room_id = room_id
        self.states = EventStateStore(store.db)
        self._graph = RoomGraphStore(store.db, store)
        self._events: dict[str, Event | None] = {}
        self._ran_since = time.monotonic()

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            self._events[event.event_id] = event

    def get(self, event_id: str) -> Event | None:
        # The algorithm looks events up all through its work: where it pauses for the hub,
        # so that a big room's resolution holds no request for long.
        if time.monotonic() - self._ran_since > _RUN_SECONDS:
            let_io_run()
            self._ran_since = time.monotonic()
        if event_id not in self._events:
            found = self.store.events_in_room(self.room_id, [event_id]).get(event_id)
            self._events[event_id] = found.event if found else None
        return self._events[event_id]

    def state_after(self, event_ids: list[str]) -> list[StateIds]:
        """The state after each event: its state group, or for an event stored without one,
        the state by stream order just after it (how rooms were read before)."""
        grouped = self.states.state_after(event_ids)
        sets = []
        for event_id in event_ids:
            if event_id in grouped:
                sets.append(grouped[event_id])
                continue
            stored = self.store.events_in_room(self.room_id, [event_id]).get(event_id)
            position = stored.stream_ordering if stored else 0
            at = self.store.state_at(self.room_id, position)
            sets.append({k: s.event.event_id for k, s in at.items()})
        return sets

    def resolve(self, state_sets: list[StateIds], pending: Event | None = None) -> StateIds:
        """`pending`: an event of the sets not stored yet (the received one)."""
        if all(s == state_sets[0] for s in state_sets[1:]):
            return dict(state_sets[0])  # forks of messages: one state, nothing to read
        unconflicted, conflicted = split_conflicted(state_sets)
        if not conflicted:
            return unconflicted  # nothing to resolve, and no event to read for it
        # The index gives the auth difference without reading the states' events; only
        # the full conflicted set's events and auth chains are read then. Without it (an
        # event stored before its auth events were known), every event of the states is.
        # State resolution v1 (room version 1) reads fewer: its conflicted events, which
        # these include, and the unconflicted state at the keys their auth rules read.
        unstored = {pending.event_id: pending.auth_event_ids} if pending is not None else {}
        difference = self._graph.auth_difference(state_sets, unstored)
        if difference is None:
            ids = {e for s in state_sets for e in s.values()}
        else:
            ids = conflicted | difference
        ids |= self._read_with_auth_chains(ids)
        if difference is not None:
            ids |= self._read_checked_state(unconflicted, conflicted | difference)
        rejected = self.states.rejections(ids)
        self._ran_since = time.monotonic()
        return resolve_state(
            self.version,
            state_sets,
            self.get,
            auth_chain_from_lookup(self.get),
            lambda e: e in rejected,
            difference,
            (unconflicted, conflicted),
        )

    def _read_with_auth_chains(self, ids: set[str]) -> set[str]:
        """Reads the events and their auth chains, one read each, not one per event: in a
        big room that is thousands. Returns the IDs of the chains' events."""
        self.add(s.event for s in self._graph.events(self.room_id, ids - self._events.keys()))
        chain = [s.event for s in self._graph.auth_chain(self.room_id, ids, _AUTH_CHAIN_CAP)]
        self.add(chain)
        return {e.event_id for e in chain}

    def _read_checked_state(self, unconflicted: StateIds, full: set[str]) -> set[str]:
        """Reads, in one go, the unconflicted state the iterative auth checks of the full
        conflicted set's events will look up: the keys the auth rules read for each."""
        keys = {(POWER_LEVELS, "")}
        for event_id in full:
            event = self._events.get(event_id)
            if event is not None and event.state_key is not None:
                keys.update(
                    auth_types_for_event(
                        self.version, event.type, event.sender, event.state_key, event.content
                    )
                )
        wanted = {unconflicted[k] for k in keys if k in unconflicted} - self._events.keys()
        self.add(s.event for s in self._graph.events(self.room_id, wanted))
        return wanted

    def state_before(self, event: Event) -> StateIds:
        return self.resolve(self.state_after(list(event.prev_event_ids)))

    def before_of(self, event: Event) -> GroupRef | StateIds:
        """The state before a received event: its one prev_event's group, by reference (no
        read), or the resolution of the states after its prev_events."""
        if len(event.prev_event_ids) == 1:
            group = self.states.group_of(event.prev_event_ids[0])
            if group is not None:
                return GroupRef(group)
        return self.state_before(event)

    def events_at(self, state: GroupRef | Mapping[StateKey, str], keys: list[StateKey]):
        """The events of those of `keys` that `state` has: all a check reads of it."""
        if isinstance(state, GroupRef):
            return self.events_of(self.states.read(state.group, keys))
        return self.events_of({k: state[k] for k in keys if k in state})

    def stored_state_before(self, event: Event) -> dict[StateKey, StoredEvent]:
        """The state before a stored event, as other servers are given it (/state,
        /state_ids, a send_join answer): a message's own state group, which is that; else
        the resolution of the states after its prev_events."""
        before = None
        if event.state_key is None:
            before = self.states.state_after([event.event_id]).get(event.event_id)
        if before is None:
            before = self.state_before(event)
        found = self.store.events_in_room(self.room_id, before.values())
        return {k: found[v] for k, v in before.items() if v in found}

    def current_after(
        self, event: Event, before: GroupRef | Mapping[StateKey, str]
    ) -> CurrentAfter:
        """The current state once `event` is a forward extremity: the resolution of the
        state after it and the states at the other extremities it does not replace."""
        extremities = [e.event_id for e in self.store.forward_extremities(self.room_id)]
        key = (event.type, event.state_key) if event.state_key is not None else None
        if set(extremities) == set(event.prev_event_ids):
            return CurrentAfter(change={key: event.event_id} if key else {})
        others = [e for e in extremities if e not in event.prev_event_ids]
        if isinstance(before, GroupRef) and key is None and self._one_group(before, others):
            return CurrentAfter(change={})  # a message beside others on one state: no change
        if isinstance(before, GroupRef):
            before = self.states.read(before.group)
        after = dict(before)
        if key is not None:
            after[key] = event.event_id
        return CurrentAfter(state=self.resolve([after, *self.state_after(others)], event))

    def _one_group(self, before: GroupRef, others: list[str]) -> bool:
        """Are the room's current state and the states at `others` all `before`'s group?
        Then a message following `before` changes nothing, and nothing need be read."""
        if self.states.current_group(self.room_id) != before.group:
            return False
        return all(self.states.group_of(e) == before.group for e in others)

    def events_of(self, state: Mapping[StateKey, str]) -> dict[StateKey, Event]:
        """Reads only those not read already (an event never changes once stored)."""
        unread = [v for v in state.values() if self._events.get(v) is None]
        for event_id, stored in self.store.events_in_room(self.room_id, unread).items():
            self._events[event_id] = stored.event
        return {k: e for k, v in state.items() if (e := self._events.get(v)) is not None}
