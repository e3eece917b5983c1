"""Events fetched from another server (to fill a gap, or backfilled): checked like any PDU,
then stored as history (homeserver/storage/history.py).

The checks are a received PDU's: format, signatures and content hash (`PduChecker`, keys
under the key-resolution budget), then the auth rules against the event's auth events. One
that fails the auth rules is remembered as rejected (storage/event_state.py), so it is never
fetched or checked again.
"""

from __future__ import annotations

import logging
from typing import Mapping

from homeserver.core.clock import now_ms
from homeserver.core.events import Event
from homeserver.rooms.auth import AuthError, auth_event_ids_to_check, check_auth_events
from homeserver.rooms.pdu_checks import PduChecker
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.event_state import EventStateStore
from homeserver.storage.history import HistoryEvent, HistoryStore
from homeserver.storage.rooms import RoomStore

log = logging.getLogger(__name__)

StateKey = tuple[str, str]


def checked_events(
    checker: PduChecker, room_id: str, pdus: object, source_ip: str | None
) -> list[Event]:
    """The PDUs of `room_id` in `pdus` that pass the checks before authorisation; the rest
    are dropped. Raises `KeyResolutionRefused` like `PduChecker.check`."""
    if not isinstance(pdus, list):
        return []
    mine = [p for p in pdus if isinstance(p, dict) and p.get("room_id") == room_id]
    events = []
    for item in checker.check(mine, source_ip):
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
        known = self.history.stored(event_ids) | set(self.states.rejections(event_ids))
        return [e for e in dict.fromkeys(event_ids) if e not in known]

    def store(
        self,
        version: RoomVersion,
        events: list[Event],
        state_before: Mapping[str, Mapping[StateKey, str]] | None = None,
    ) -> list[str]:
        """Stores those of `events` that pass the auth rules against their auth events
        (stored, or among `events`), newest stored lowest; returns the IDs stored now.
        `state_before` gives some of them the state before them."""
        state_before = state_before or {}
        by_id = {e.event_id: e for e in events}
        rejected = self.states.rejections(
            [a for e in events for a in auth_event_ids_to_check(version, e)]
        )
        passed: dict[str, Event] = {}
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
            passed[event.event_id] = event
        newest_first = sorted(passed.values(), key=lambda e: e.depth, reverse=True)
        return self.history.store(
            [HistoryEvent(e, state_before.get(e.event_id)) for e in newest_first]
        )

    def _reject(self, event: Event, reason: str, rejected: dict) -> None:
        log.info("fetched event %s rejected: %s", event.event_id, reason)
        self.states.reject(event, reason, now_ms())
        rejected[event.event_id] = reason
