"""Reporting content to the server's admins (client-server spec, "Reporting content"): an
event, a room or a user, kept in a table for the admins (storage/reports.py).

Abuse is bounded by size, not rate: a reason is at most `MAX_REASON_CHARS` characters
(400 M_BAD_JSON past it, as Synapse answers), so one report is a small row; the body's cap
(api/client/reports.py) bounds what is read.
"""

from __future__ import annotations

from homeserver.core.clock import now_ms
from homeserver.core.errors import MatrixError, bad_json, invalid_param, not_found
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.service import RoomService
from homeserver.storage.reports import ReportStore

MAX_REASON_CHARS = 1000


def _check_reason(reason: str | None) -> None:
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise bad_json(f"reason must be at most {MAX_REASON_CHARS} characters")


class ReportService:
    def __init__(self, store: ReportStore, rooms: RoomService, history: RoomHistory, accounts):
        self.store = store
        self.rooms = rooms
        self.history = history
        self.accounts = accounts

    def report_event(
        self,
        requester: Requester,
        room_id: str,
        event_id: str,
        reason: str | None,
        score: int | None,
    ) -> None:
        """404 unless the event is in that room and the reporter may see it (history.event
        decides, as for GET /event), so a report tells nothing of events one cannot read."""
        _check_reason(reason)
        if score is not None and not -100 <= score <= 0:
            raise invalid_param("score must be between -100 and 0")
        try:
            self.history.event(requester, room_id, event_id)
        except MatrixError as e:
            if e.status in (403, 404):
                raise not_found(
                    "Unable to report event: it does not exist or you cannot see it"
                ) from None
            raise
        self.store.add(
            requester.user_id,
            "event",
            now_ms(),
            room_id=room_id,
            event_id=event_id,
            reason=reason,
            score=score,
        )

    def report_room(self, requester: Requester, room_id: str, reason: str) -> None:
        _check_reason(reason)
        if not self.rooms.room_exists(room_id):
            raise not_found("Room does not exist")
        self.store.add(requester.user_id, "room", now_ms(), room_id=room_id, reason=reason)

    def report_user(self, requester: Requester, user_id: str, reason: str) -> None:
        """A local user who does not exist is not reported, and the answer does not say so
        (the spec lets the server keep that to itself, as Synapse does); another server's
        user is kept, for the admins to act on in rooms here."""
        _check_reason(reason)
        if not is_valid_user_id(user_id):
            raise invalid_param(f"Not a valid user ID: {user_id}")
        if server_of(user_id) == self.rooms.server_name and not self.accounts.user_exists(user_id):
            return
        self.store.add(requester.user_id, "user", now_ms(), target_user_id=user_id, reason=reason)
