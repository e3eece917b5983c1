"""Backfill: a client's `/messages` going back past the oldest event we have of a room asks
a server in the room for the events before it (server-server spec, `/backfill`).

It is a client-triggered outbound call (ADR-0079, homeserver/federation/admission.py): it
takes a `client_outbound_budget` slot under the client's key and one total deadline, and
when refused or failed, `/messages` answers with what we have. The events are checked like
any PDU and stored as history (rooms/fetched.py, storage/history.py): behind the timeline,
not current state, waking no sync.

Where history ends: the prev_events of the room's lowest events (by stream position) that
are neither stored nor rejected. After a remote join that is what our join was built on; after
a backfill, what the oldest backfilled events were built on.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from budget import DeadlineExceeded, InFlightBudget
from homeserver.core.errors import MatrixError
from homeserver.core.identifiers import server_of
from homeserver.federation.admission import Caller, admitted, count_failure
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import FederationError, KeyResolutionRefused
from homeserver.federation.junk import JunkAnswers
from homeserver.metrics import Metrics
from homeserver.rooms.events import MAX_PDU_BYTES
from homeserver.rooms.fetched import HistoryWriter, checked_events
from homeserver.rooms.pdu_checks import PduChecker
from homeserver.rooms.service import RoomService
from homeserver.storage.history import HistoryStore

log = logging.getLogger(__name__)

# One backfill, every server tried included (ADR-0079's directory-sized deadline).
BACKFILL_DEADLINE_SECONDS = 10.0
# Events asked for at once; Synapse serves at most 100.
BACKFILL_LIMIT = 50
# How many of the room's lowest events are read to find where its history ends, and how
# many of their unknown prev_events a backfill starts from.
_OLDEST_EVENTS_READ = 100
_MAX_FROM = 20
# Servers asked, in turn, within the one deadline.
_MAX_SERVERS = 3
# An answer is read up to what BACKFILL_LIMIT events can take, and cut to that many of the
# room's events before any is checked.
RESPONSE_MAX_BYTES = BACKFILL_LIMIT * MAX_PDU_BYTES + 64 * 1024


class Backfiller:
    def __init__(
        self,
        rooms: RoomService,
        checker: PduChecker,
        client: FederationClient,
        budget: InFlightBudget,
        cooldown: AddressCooldown,
        metrics: Metrics,
        junk: JunkAnswers,
    ):
        self.junk = junk
        self.rooms = rooms
        self.checker = checker
        self.client = client
        self.budget = budget
        self.cooldown = cooldown
        self.metrics = metrics
        self.writer = HistoryWriter(rooms.store, HistoryStore(rooms.store.db))

    def backward_extremities(self, room_id: str) -> list[str]:
        oldest = self.writer.history.oldest(room_id, _OLDEST_EVENTS_READ)
        prevs = [p for e in oldest for p in e.prev_event_ids]
        return self.writer.unknown(prevs)[:_MAX_FROM]

    def backfill(self, room_id: str, caller: Caller) -> int:
        """Fetches and stores the history before the oldest events we have; how many events
        were stored. Never raises for a refusal or a failure: it stores nothing then."""
        from_ids = self.backward_extremities(room_id)
        if not from_ids:
            return 0
        try:
            with admitted(self.budget, caller):
                return self._backfill(room_id, from_ids)
        except MatrixError as e:  # the client budget is full: answer with what we have
            log.info("backfill of %s refused: %s", room_id, e)
            return 0

    def _backfill(self, room_id: str, from_ids: list[str]) -> int:
        version = self.rooms.room_version(room_id)
        deadline = self.client.deadline(BACKFILL_DEADLINE_SECONDS, what=f"backfill {room_id}")
        for server in self._servers(room_id, from_ids):
            try:
                body = self.client.get_json(
                    server,
                    f"/_matrix/federation/v1/backfill/{quote(room_id, safe='')}",
                    {"v": from_ids, "limit": str(BACKFILL_LIMIT)},
                    deadline=deadline,
                    max_bytes=RESPONSE_MAX_BYTES,
                    target_health=self.cooldown,
                )
                pdus = body.get("pdus") if isinstance(body, dict) else None
                pdus = pdus if isinstance(pdus, list) else []
                events = checked_events(self.checker, room_id, pdus, None, limit=BACKFILL_LIMIT)
                self.junk.note(server, len(pdus), len(events))
            except (FederationError, DeadlineExceeded) as e:
                count_failure(self.metrics, "backfill", e)
                self.junk.note_failure(server, e)
                if isinstance(e, (DeadlineExceeded, KeyResolutionRefused)):
                    return 0
                continue
            self.metrics.outbound_calls.labels("backfill", "ok").inc()
            return len(self.writer.store(version, events))
        return 0

    def _servers(self, room_id: str, from_ids: list[str]) -> list[str]:
        """The servers of the room's joined members, those that sent the events history
        ends at first (they have them)."""
        ours = self.rooms.server_name
        joined = [s for s in self.rooms.joined_servers(room_id) if s != ours]
        stored = self.rooms.store.events_in_room(room_id, self._children(room_id, from_ids))
        senders = [server_of(s.event.sender) for s in stored.values()]
        ordered = [s for s in dict.fromkeys([*senders, *joined]) if s != ours and s in joined]
        return self.junk.last(ordered)[:_MAX_SERVERS]

    def _children(self, room_id: str, from_ids: list[str]) -> list[str]:
        wanted = set(from_ids)
        oldest = self.writer.history.oldest(room_id, _OLDEST_EVENTS_READ)
        return [e.event_id for e in oldest if wanted & set(e.prev_event_ids)]
