"""Jump to date (`timestamp_to_event`): the room's event closest to a time, in one direction.

Our own timeline answers first. When it has none there, or going forward the event it found
follows a gap (we joined late, and history before our join was never backfilled), the room's
other servers are asked over federation, as Synapse does: a
client-triggered outbound call (ADR-0079, homeserver/federation/admission.py), one
`client_outbound_budget` slot and one total deadline for every server tried, so a dead
server costs its turn and the deadline only. Their answer is returned as it is, even when it
names an event we do not have, as Synapse does.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote

from budget import DeadlineExceeded, InFlightBudget
from homeserver.core.errors import MatrixError, not_found
from homeserver.core.requester import Requester
from homeserver.federation.admission import Caller, admitted, count_failure
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import FederationError
from homeserver.federation.junk import JunkAnswers
from homeserver.metrics import Metrics
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.service import RoomService

log = logging.getLogger(__name__)

# Every server tried included (ADR-0079's directory-sized deadline).
TIMESTAMP_DEADLINE_SECONDS = 10.0
# Servers asked, in turn, within the one deadline.
_MAX_SERVERS = 3
# An answer is two short fields.
_ANSWER_MAX_BYTES = 16 * 1024
# An event ID as the spec bounds it: a `$` sigil, 255 bytes at most, printable ASCII.
_EVENT_ID = re.compile(r"\$[\x21-\x7e]{1,254}")


def answer(event_id: str, ts: int) -> dict:
    return {"event_id": event_id, "origin_server_ts": ts}


class TimestampLookup:
    def __init__(
        self,
        rooms: RoomService,
        history: RoomHistory,
        client: FederationClient,
        budget: InFlightBudget,
        cooldown: AddressCooldown,
        metrics: Metrics,
        junk: JunkAnswers,
    ):
        self.rooms = rooms
        self.history = history
        self.client = client
        self.budget = budget
        self.cooldown = cooldown
        self.metrics = metrics
        self.junk = junk

    def local(self, room_id: str, ts: int, forward: bool) -> dict | None:
        stored = self.rooms.store.event_near_ts(room_id, ts, forward)
        if stored is None:
            return None
        return answer(stored.event.event_id, stored.event.origin_server_ts)

    def _after_a_gap(self, room_id: str, event_id: str) -> bool:
        """Whether history we lack may lie just before the event: a prev_event of it that we
        do not have (after a late join, our join itself, built on history never fetched)."""
        stored = self.rooms.store.events_in_room(room_id, [event_id]).get(event_id)
        prevs = stored.event.prev_event_ids if stored is not None else []
        return len(self.rooms.store.events_in_room(room_id, prevs)) < len(set(prevs))

    def for_client(
        self, requester: Requester, room_id: str, ts: int, forward: bool, caller: Caller | None
    ) -> dict:
        """403 for a user who may read none of the room, as /messages; 404 when neither we
        nor the servers asked know an event there."""
        self.rooms.room_version(room_id)
        view = self.history.history_view(room_id, requester.user_id)
        self.history.readable_state_position(room_id, requester.user_id, view)
        found = self.local(room_id, ts, forward)
        # Going forward, an event just after a gap may not be the closest: the servers
        # that have the gap's events are asked too, and a closer answer of theirs wins.
        if caller is not None and (
            found is None or (forward and self._after_a_gap(room_id, found["event_id"]))
        ):
            remote = self._ask_servers(room_id, ts, forward, caller)
            if remote is not None and (
                found is None or remote["origin_server_ts"] <= found["origin_server_ts"]
            ):
                found = remote
        if found is None:
            raise not_found("No event found")
        return found

    def _ask_servers(self, room_id: str, ts: int, forward: bool, caller: Caller) -> dict | None:
        ours = self.rooms.server_name
        servers = [s for s in self.rooms.joined_servers(room_id) if s != ours]
        if not servers:
            return None
        try:
            with admitted(self.budget, caller):
                return self._ask(room_id, ts, forward, self.junk.last(servers)[:_MAX_SERVERS])
        except MatrixError as e:  # the client budget is full: answer with what we have
            log.info("timestamp_to_event of %s refused: %s", room_id, e)
            return None

    def _ask(self, room_id: str, ts: int, forward: bool, servers: list[str]) -> dict | None:
        deadline = self.client.deadline(TIMESTAMP_DEADLINE_SECONDS, what=f"jump {room_id}")
        path = f"/_matrix/federation/v1/timestamp_to_event/{quote(room_id, safe='')}"
        for server in servers:
            try:
                body = self.client.get_json(
                    server,
                    path,
                    {"ts": str(ts), "dir": "f" if forward else "b"},
                    deadline=deadline,
                    max_bytes=_ANSWER_MAX_BYTES,
                    target_health=self.cooldown,
                )
            except (FederationError, DeadlineExceeded) as e:
                count_failure(self.metrics, "timestamp_to_event", e)
                self.junk.note_failure(server, e)
                if isinstance(e, DeadlineExceeded):
                    return None
                continue
            found = _valid_answer(body, ts, forward)
            self.metrics.outbound_calls.labels("timestamp_to_event", "ok").inc()
            if found is not None:
                return found
        return None


def _valid_answer(body, ts: int, forward: bool) -> dict | None:
    """A remote answer we pass on: an event ID and a time on the asked side of `ts`."""
    if not isinstance(body, dict):
        return None
    event_id, found_ts = body.get("event_id"), body.get("origin_server_ts")
    if not isinstance(event_id, str) or not _EVENT_ID.fullmatch(event_id):
        return None
    if not isinstance(found_ts, int) or isinstance(found_ts, bool):
        return None
    if (found_ts < ts) if forward else (found_ts > ts):
        return None
    return answer(event_id, found_ts)
