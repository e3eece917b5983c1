"""Filling gaps: a received PDU whose prev_events (or auth_events) we do not have.

Spec (server-server, "Backfilling and retrieving missing events"), as Synapse does it:

1. Ask the origin for the events between our forward extremities and the PDU with
   `/get_missing_events`, each request going further back (Synapse gives 20 at a time), at
   most `MAX_MISSING_EVENTS` events and `MAX_MISSING_BYTES` in all: a netsplit of a few
   hundred events is fetched whole. Those that connect to what we have are received like any
   PDU, oldest first (they are part of the live room: they become extremities, current
   state, and wake /sync).
2. Where the gap is still open (an event whose prev_events are still unknown), fetch the
   state before each unknown prev_event with `/state_ids`, and the events it names that we
   lack (the prev_event itself, the state, the auth chain) with `/event`, `STATE_FETCHES_AT_ONCE`
   at a time, at most `MAX_STATE_EVENTS`. They are checked like any PDU and stored as history
   (rooms/fetched.py), the state and auth events as outliers; the prev_event gets
   the fetched state as the state before it. The PDU is then received as usual: the state
   before it is the resolution (RoomResolver) of the states after its prev_events.

All of it is one fetch of the event-resolution budget (federation/event_resolution.py): one
slot, one rate token for the origin, one total deadline. Refused, `EventResolutionRefused`
goes up and the transaction gets 429. A fetch that fails (the origin is down, slow, or
answers nonsense) only leaves the gap open: the PDU is then refused for its unknown
prev_events (`MissingEventsRefused`), not remembered as rejected, and held to be tried
again later (rooms/held.py).
"""

from __future__ import annotations

import json
import logging
from urllib.parse import quote

from gevent.pool import Pool

from budget import DeadlineExceeded, OutboundDeadline
from homeserver.core.events import Event
from homeserver.federation.client import FederationClient
from homeserver.federation.errors import FederationError, KeyResolutionRefused
from homeserver.federation.event_resolution import EventResolutionBudget
from homeserver.federation.junk import JunkAnswers
from homeserver.rooms.auth import StateKey, auth_event_ids_to_check
from homeserver.rooms.events import MAX_PDU_BYTES
from homeserver.rooms.fetched import HistoryWriter, checked_events
from homeserver.rooms.pdu_checks import PduChecker, signing_servers
from homeserver.rooms.received import ReceivedEventRefused
from homeserver.rooms.service import RoomService
from homeserver.rooms.versions import RoomVersion
from homeserver.storage.history import HistoryStore

log = logging.getLogger(__name__)

FED_V1 = "/_matrix/federation/v1"
# /get_missing_events per gap: events taken, and their JSON's bytes, in all; requests made
# (each asks for at most 20, what Synapse gives, so the events take 50 requests).
MAX_MISSING_EVENTS = 1000
MAX_MISSING_BYTES = 8 * 1024 * 1024
MAX_LEVELS = 60
PER_REQUEST = 20
# Events fetched with /event for the state at a gap, so many at once; a gap whose state
# lacks more is left open (the PDU is refused).
MAX_STATE_EVENTS = 1000
STATE_FETCHES_AT_ONCE = 8
# Unknown prev_events of one event whose state is fetched.
MAX_PREV_EVENTS_FETCHED = 5
# An answer of /get_missing_events is read up to what its limit allows (events of at most
# MAX_PDU_BYTES, and room for the envelope), and cut to that limit before any event of it is
# checked. A server whose answers were mostly junk is asked for fewer (federation/junk.py).
ENVELOPE_BYTES = 64 * 1024
JUNK_PEER_LIMIT = 5
# /state_ids: event IDs only, at most this many of each list.
STATE_IDS_MAX_BYTES = 8 * 1024 * 1024
MAX_STATE_IDS = 100_000


def _q(value: str) -> str:
    return quote(value, safe="")


class GapNotFilled(Exception):
    """The origin did not give us what the gap needs."""


class GapFiller:
    def __init__(
        self,
        rooms: RoomService,
        checker: PduChecker,
        client: FederationClient,
        budget: EventResolutionBudget,
        junk: JunkAnswers,
    ):
        self.rooms = rooms
        self.checker = checker
        self.client = client
        self.budget = budget
        self.junk = junk
        self.writer = HistoryWriter(rooms.store, HistoryStore(rooms.store.db))

    def missing(self, version: RoomVersion, event: Event) -> list[str]:
        """The event's prev_events and auth events that are neither stored nor rejected."""
        return self.writer.unknown(
            [*event.prev_event_ids, *auth_event_ids_to_check(version, event)]
        )

    def fill(self, origin: str, version: RoomVersion, event: Event, source_ip: str | None) -> None:
        """Fetches what `event` lacks from `origin`, if anything. Raises
        `EventResolutionRefused` (or `KeyResolutionRefused`) with nothing fetched for this
        event; any other failure leaves the gap open, for `receive_event` to refuse."""
        if not self.missing(version, event) or self.writer.states.rejections([event.event_id]):
            return
        with self.budget.fetch(origin, f"events missing before {event.event_id}") as deadline:
            try:
                self._fill(origin, version, event, source_ip, deadline)
            except KeyResolutionRefused:
                raise
            except (FederationError, DeadlineExceeded, GapNotFilled) as e:
                self.junk.note_failure(origin, e)
                log.info("gap before %s from %s left open: %s", event.event_id, origin, e)

    def _fill(self, origin, version, event, source_ip, deadline) -> None:
        if self._unknown_prevs(event):
            for fetched in self._missing_events(origin, event, source_ip, deadline):
                self._receive(origin, version, fetched, source_ip, deadline)
        if self.missing(version, event):
            self._fetch_state(origin, version, event, source_ip, deadline)

    def _unknown_prevs(self, event: Event) -> list[str]:
        return self.writer.unknown(list(event.prev_event_ids))

    def _receive(self, origin, version, event: Event, source_ip, deadline) -> None:
        """A fetched event of the live room: its own gap first, then received as any PDU."""
        if self.missing(version, event):
            self._fetch_state(origin, version, event, source_ip, deadline)
        try:
            self.rooms.receive_event(version, event, frozenset(signing_servers(event.pdu, version)))
        except ReceivedEventRefused as e:
            log.info("missing event %s from %s refused: %s", event.event_id, origin, e)

    def _missing_events(
        self, origin: str, event: Event, source_ip, deadline: OutboundDeadline
    ) -> list[Event]:
        """Events between our forward extremities and `event`, oldest first."""
        room_id = event.room_id
        earliest = [e.event_id for e in self.rooms.store.forward_extremities(room_id)]
        found: dict[str, Event] = {}
        latest = [event.event_id]
        per_request = JUNK_PEER_LIMIT if self.junk.is_junk(origin) else PER_REQUEST
        bytes_left = MAX_MISSING_BYTES
        for _ in range(MAX_LEVELS):
            limit = min(MAX_MISSING_EVENTS - len(found), per_request)
            if limit <= 0 or not latest or bytes_left <= 0:
                break
            body = self.client.post_json(
                origin,
                f"{FED_V1}/get_missing_events/{_q(room_id)}",
                {"earliest_events": earliest, "latest_events": latest, "limit": limit},
                deadline=deadline,
                max_bytes=min(limit * MAX_PDU_BYTES, bytes_left) + ENVELOPE_BYTES,
            )
            pdus = body.get("events") if isinstance(body, dict) else None
            pdus = pdus if isinstance(pdus, list) else []
            bytes_left -= sum(len(json.dumps(p)) for p in pdus[:limit])
            checked = checked_events(self.checker, room_id, pdus, source_ip, limit=limit)
            new = [e for e in checked if e.event_id not in found]
            self.junk.note(origin, len(pdus), len(new))
            if not new:
                break
            found.update((e.event_id, e) for e in new)
            # Still open where a fetched event's prev_events are neither here nor fetched.
            open_ends = {
                e.event_id
                for e in found.values()
                if any(p not in found for p in self._unknown_prevs(e))
            }
            latest = sorted(open_ends)[:MAX_PREV_EVENTS_FETCHED]
        return sorted(found.values(), key=lambda e: e.depth)

    def _fetch_state(self, origin, version, event: Event, source_ip, deadline) -> None:
        """Stores, as history, each unknown prev_event of `event` with the state before it,
        and the unknown auth events of `event`."""
        prevs = self._unknown_prevs(event)[:MAX_PREV_EVENTS_FETCHED]
        states: dict[str, list[str]] = {}
        wanted = list(auth_event_ids_to_check(version, event))
        for prev in prevs:
            body = self.client.get_json(
                origin,
                f"{FED_V1}/state_ids/{_q(event.room_id)}",
                {"event_id": prev},
                deadline=deadline,
                max_bytes=STATE_IDS_MAX_BYTES,
            )
            state_ids, chain_ids = _id_lists(body)
            states[prev] = state_ids
            wanted += [prev, *state_ids, *chain_ids]
        unknown = self.writer.unknown(wanted)
        if len(unknown) > MAX_STATE_EVENTS:
            raise GapNotFilled(f"{len(unknown)} events of state to fetch, over the cap")
        pdus = self._events(origin, unknown, deadline)
        fetched = {
            e.event_id: e
            for e in checked_events(self.checker, event.room_id, pdus, source_ip, set(unknown))
        }
        befores = {
            prev: self._state_map(event.room_id, ids, fetched) for prev, ids in states.items()
        }
        # Only the prev_events are the room's timeline; the rest is for checking them.
        self.writer.store(version, list(fetched.values()), befores, frozenset(fetched) - set(prevs))

    def _events(self, origin: str, event_ids: list[str], deadline: OutboundDeadline) -> list:
        """The events of `event_ids` (None for one not given), STATE_FETCHES_AT_ONCE at a
        time, all under the gap's one deadline; a failure of any fails them all."""

        def attempt(event_id: str) -> dict | None | Exception:
            try:
                return self._event(origin, event_id, deadline)
            except (FederationError, DeadlineExceeded) as e:
                return e

        pool = Pool(STATE_FETCHES_AT_ONCE)
        try:
            found = list(pool.imap(attempt, event_ids))
        finally:
            pool.kill(block=True)
        failure = next((f for f in found if isinstance(f, Exception)), None)
        if failure is not None:
            raise failure
        return found

    def _event(self, origin: str, event_id: str, deadline: OutboundDeadline) -> dict | None:
        body = self.client.get_json(
            origin,
            f"{FED_V1}/event/{_q(event_id)}",
            deadline=deadline,
            max_bytes=MAX_PDU_BYTES + ENVELOPE_BYTES,
        )
        pdus = body.get("pdus") if isinstance(body, dict) else None
        return pdus[0] if isinstance(pdus, list) and pdus and isinstance(pdus[0], dict) else None

    def _state_map(
        self, room_id: str, ids: list[str], fetched: dict[str, Event]
    ) -> dict[StateKey, str]:
        stored = self.rooms.store.events_in_room(room_id, [i for i in ids if i not in fetched])
        events = [fetched.get(i) or (stored[i].event if i in stored else None) for i in ids]
        return {(e.type, e.state_key): e.event_id for e in events if e and e.state_key is not None}


def _id_lists(body: object) -> tuple[list[str], list[str]]:
    """`pdu_ids` and `auth_chain_ids` of a `/state_ids` answer."""
    if not isinstance(body, dict):
        raise GapNotFilled("state_ids answer is not an object")
    lists = []
    for name in ("pdu_ids", "auth_chain_ids"):
        value = body.get(name)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise GapNotFilled(f"state_ids answer has no list of {name}")
        if len(value) > MAX_STATE_IDS:
            raise GapNotFilled(f"state_ids answer has over {MAX_STATE_IDS} {name}")
        lists.append(value)
    return lists[0], lists[1]
