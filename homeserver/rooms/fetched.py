"""Events fetched from another server (to fill a gap, or backfilled): checked like any PDU,
then stored as history (homeserver/storage/history.py).

The checks are a received PDU's: format, signatures and content hash (`PduChecker`, keys
under the key-resolution budget), then the auth rules three ways where they can be: against
the event's auth events, against the state before it when that is known (a prev_event
whose state was fetched at a gap), and against the current state. Failing either of the
first two rejects the event, and it is remembered as rejected (storage/event_state.py), so
it is never fetched or checked again; failing only the third hides it.

Events fetched only to check others (the auth and state events at a gap) are stored as
outliers, as a remote join's state is: known, checked, usable as auth and state, but no part
of the timeline (not shown to clients, never where backfill starts). So an event that only
its own auth chain allows, made up by the server that sends it, changes nothing a user sees;
it can only be named as an auth event, and the state before any event is this server's own
resolution.
"""

from __future__ import annotations

import logging
from typing import Mapping

from homeserver.core.clock import now_ms
from homeserver.core.events import Event
from homeserver.rooms.auth import (
    AuthError,
    auth_event_ids_to_check,
    auth_types_for_event,
    check_against_state,
    check_auth_events,
)
from homeserver.rooms.pdu_checks import PduChecker
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.event_state import EventStateStore
from homeserver.storage.history import HistoryEvent, HistoryStore
from homeserver.storage.rooms import RoomStore

log = logging.getLogger(__name__)

StateKey = tuple[str, str]


def checked_events(
    checker: PduChecker,
    room_id: str,
    pdus: object,
    source_ip: str | None,
    wanted: set[str] | None = None,
    limit: int | None = None,
) -> list[Event]:
    """The first `limit` PDUs of `room_id` in `pdus` (and, given `wanted`, of those event
    IDs) that pass the checks before authorisation; the rest are dropped, what was not
    asked for before any signature is checked. Raises `KeyResolutionRefused` like
    `PduChecker.check`."""
    if not isinstance(pdus, list):
        return []
    mine = [p for p in pdus if isinstance(p, dict) and p.get("room_id") == room_id][:limit]
    events = []
    for item in checker.check(mine, source_ip, wanted=wanted):
        if item.error is None and item.event is not None:
            events.append(item.event)
        else:
            log.info("fetched event %s dropped: %s", item.event_id, item.error)
    return events


class HistoryWriter:
    """Authorises fetched events against their auth events and stores them as history."""

    def __init__(self, store: RoomStore, history: HistoryStore):
        self.rooms_store = store
        self.history = history
        self.states = EventStateStore(store.db)

    def unknown(self, event_ids: list[str]) -> list[str]:
        """Those of `event_ids` neither stored nor rejected: the ones worth fetching."""
        known = self.history.stored_or_rejected(event_ids)
        return [e for e in dict.fromkeys(event_ids) if e not in known]

    def store(
        self,
        version: RoomVersion,
        events: list[Event],
        state_before: Mapping[str, Mapping[StateKey, str]] | None = None,
        outliers: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Stores those of `events` that pass the auth rules against their auth events
        (stored, or among `events`), newest stored lowest; returns the IDs stored now.
        `state_before` gives some of them the state before them, which they are checked
        against too, and then against the current state; one that the current state refuses
        is stored hidden (soft-failed). Those in `outliers` are stored as outliers."""
        state_before = state_before or {}
        by_id = {e.event_id: e for e in events}
        rejected = self.states.rejections(
            [a for e in events for a in auth_event_ids_to_check(version, e)]
        )
        passed: dict[str, Event] = {}
        hidden: set[str] = set()
        for event in sorted(by_id.values(), key=lambda e: e.depth):  # auth events first
            auth_ids = auth_event_ids_to_check(version, event)
            if any(a in rejected for a in auth_ids):
                self._reject(event, "an auth event was rejected", rejected)
                continue
            stored = self.rooms_store.events_in_room(event.room_id, [a for a in auth_ids])
            auth = [passed.get(a) or (stored[a].event if a in stored else None) for a in auth_ids]
            if any(a is None for a in auth):
                log.info("fetched event %s dropped: auth events unknown", event.event_id)
                continue
            try:
                check_auth_events(version, event, [a for a in auth if a is not None])
            except AuthError as e:
                self._reject(event, f"rejected by its auth events: {e}", rejected)
                continue
            before = state_before.get(event.event_id)
            if before is not None:
                try:
                    check_against_state(version, event, self._state(version, event, before, by_id))
                except AuthError as e:
                    self._reject(event, f"rejected by the state before it: {e}", rejected)
                    continue
                if not self._allowed_now(version, event):
                    hidden.add(event.event_id)
            passed[event.event_id] = event
        newest_first = sorted(passed.values(), key=lambda e: e.depth, reverse=True)
        return self.history.store(
            [
                HistoryEvent(
                    e,
                    state_before.get(e.event_id),
                    hidden=e.event_id in hidden,
                    outlier=e.event_id in outliers,
                )
                for e in newest_first
            ]
        )

    def _state(
        self,
        version: RoomVersion,
        event: Event,
        state: Mapping[StateKey, str],
        fetched: Mapping[str, Event],
    ) -> dict[StateKey, Event]:
        """The events of `state` that the auth rules read for `event`."""
        keys = auth_types_for_event(
            version, event.type, event.sender, event.state_key, event.content
        )
        ids = {k: state[k] for k in keys if k in state}
        stored = self.rooms_store.events_in_room(
            event.room_id, [i for i in ids.values() if i not in fetched]
        )
        found = {
            k: fetched.get(i) or (stored[i].event if i in stored else None) for k, i in ids.items()
        }
        return {k: e for k, e in found.items() if e is not None}

    def _allowed_now(self, version: RoomVersion, event: Event) -> bool:
        """Does the room's current state allow `event` (else it is stored hidden)?"""
        keys = auth_types_for_event(
            version, event.type, event.sender, event.state_key, event.content
        )
        current = {
            k: s.event for k, s in self.rooms_store.current_state(event.room_id, keys).items()
        }
        try:
            check_against_state(version, event, current)
        except AuthError:
            return False
        return True

    def _reject(self, event: Event, reason: str, rejected: dict) -> None:
        log.info("fetched event %s rejected: %s", event.event_id, reason)
        self.states.reject(event, reason, now_ms())
        rejected[event.event_id] = reason
