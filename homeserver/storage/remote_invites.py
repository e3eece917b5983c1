"""Invites of our users to rooms this server is not in, as a remote server sent them, and
our users' knocks on such rooms, as the room's server took them (send_knock).

Such a room has no events here, so the invite cannot live in the room's state: it is kept
beside it, one row per (room, user), at a position of the events stream taken in the same
transaction (so /sync tokens order it with room events). Once the user has a member event
in the room itself (they joined it), that event is newer and wins.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from canonicaljson import encode_canonical_json

from homeserver.core.events import Event
from homeserver.storage import streams
from homeserver.storage.database import Database
from homeserver.storage.rooms import EVENTS_STREAM


@dataclass(frozen=True)
class RemoteInvite:
    room_id: str
    user_id: str
    room_version: str
    membership: str  # "invite" or "knock", then "leave" once rejected or rescinded
    event: Event
    invite_room_state: list[dict]  # or a knock's knock_room_state
    stream_ordering: int


_COLUMNS = (
    "room_id, user_id, room_version, membership, event_id, event_json, invite_room_state,"
    " stream_ordering"
)


def _invite(row) -> RemoteInvite:
    return RemoteInvite(
        row[0],
        row[1],
        row[2],
        row[3],
        Event(row[4], json.loads(row[5])),
        json.loads(row[6]),
        row[7],
    )


class RemoteInviteStore:
    def __init__(self, db: Database):
        self.db = db

    def put(
        self, room_version: str, event: Event, invite_room_state: list[dict], membership: str
    ) -> int:
        """Records (or replaces) the user's invite or knock, or its end, for the event's
        room; returns its stream position. An invite replacing a knock is the knock let in."""
        user_id = event.state_key

        def write(tx):
            position = streams.advance(tx, EVENTS_STREAM)
            params = (
                event.event_id,
                room_version,
                membership,
                encode_canonical_json(event.pdu).decode("utf-8"),
                json.dumps(invite_room_state),
                position,
            )
            updated = tx.fetchone(
                "UPDATE remote_invites SET event_id = ?, room_version = ?, membership = ?,"
                " event_json = ?, invite_room_state = ?, stream_ordering = ?"
                " WHERE room_id = ? AND user_id = ? RETURNING room_id",
                (*params, event.room_id, user_id),
            )
            if updated is None:
                tx.execute(
                    "INSERT INTO remote_invites (event_id, room_version, membership, event_json,"
                    " invite_room_state, stream_ordering, room_id, user_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (*params, event.room_id, user_id),
                )
            return position

        return self.db.write(write)

    def get(self, room_id: str, user_id: str) -> RemoteInvite | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_COLUMNS} FROM remote_invites WHERE room_id = ? AND user_id = ?",
                (room_id, user_id),
            )
        )
        return _invite(row) if row else None

    def pending_rooms(self, user_id: str) -> list[str]:
        """The rooms of the user's remote invites and knocks still open (not superseded by
        a member event of theirs in the room itself, nor ended)."""
        kept = self.db.read(lambda tx: self.invites_in(tx, user_id))
        return [r.room_id for r in kept if r.membership in ("invite", "knock")]

    @staticmethod
    def invites_in(tx, user_id: str) -> list[RemoteInvite]:
        """The user's remote invites and knocks (and their ends) that no member event of
        theirs in the room itself has superseded; for /sync, inside its read transaction."""
        rows = tx.fetchall(
            f"SELECT {', '.join('r.' + c.strip() for c in _COLUMNS.split(','))}"
            " FROM remote_invites r WHERE r.user_id = ? AND NOT EXISTS ("
            " SELECT 1 FROM current_state c JOIN events e ON e.event_id = c.event_id"
            " WHERE c.room_id = r.room_id AND c.type = 'm.room.member'"
            " AND c.state_key = r.user_id AND e.stream_ordering > r.stream_ordering)"
            " ORDER BY r.room_id",
            (user_id,),
        )
        return [_invite(r) for r in rows]
