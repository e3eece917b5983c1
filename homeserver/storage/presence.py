"""Presence rows (0030_presence.sql): each user's latest state, ours and other servers'.

A change takes the next position of the presence stream in its write, so /sync asks for
what changed after its token's position, and only of the users who share a room with its
user (or the user itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage import streams
from homeserver.storage.database import Database

PRESENCE_STREAM = "presence"

# Users sharing a joined room with the requester (`?`), or the requester.
_SHARES_A_ROOM = (
    "(p.user_id = ? OR EXISTS (SELECT 1 FROM current_state a JOIN current_state b"
    " ON b.room_id = a.room_id AND b.type = 'm.room.member' AND b.membership = 'join'"
    " AND b.state_key = ?"
    " WHERE a.state_key = p.user_id AND a.type = 'm.room.member' AND a.membership = 'join'))"
)


@dataclass(frozen=True)
class Presence:
    user_id: str
    state: str  # online, unavailable or offline
    status_msg: str | None
    last_active_ts: int
    currently_active: bool
    position: int = 0

    def same_as(self, other: Presence | None) -> bool:
        """What a client is shown is unchanged (last_active_ts aside)."""
        return other is not None and (self.state, self.status_msg, self.currently_active) == (
            other.state,
            other.status_msg,
            other.currently_active,
        )


_COLUMNS = (
    "p.user_id, p.state, p.status_msg, p.last_active_ts, p.currently_active, p.stream_position"
)


def _row(row) -> Presence:
    return Presence(row[0], row[1], row[2], int(row[3]), bool(row[4]), int(row[5]))


class PresenceStore:
    def __init__(self, db: Database):
        self.db = db

    def put(self, presence: Presence) -> int:
        """Stores the user's presence; returns its stream position."""

        def write(tx) -> int:
            position = streams.advance(tx, PRESENCE_STREAM)
            tx.execute(
                "INSERT INTO presence (user_id, state, status_msg, last_active_ts,"
                " currently_active, stream_position) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id) DO UPDATE SET state = excluded.state,"
                " status_msg = excluded.status_msg, last_active_ts = excluded.last_active_ts,"
                " currently_active = excluded.currently_active,"
                " stream_position = excluded.stream_position",
                (
                    presence.user_id,
                    presence.state,
                    presence.status_msg,
                    presence.last_active_ts,
                    int(presence.currently_active),
                    position,
                ),
            )
            return position

        return self.db.write(write)

    def get(self, user_id: str) -> Presence | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_COLUMNS} FROM presence p WHERE p.user_id = ?", (user_id,)
            )
        )
        return _row(row) if row else None

    def visible_changes(self, user_id: str, after: int, up_to: int, limit: int) -> list[Presence]:
        """The presence of users who share a room with `user_id` (and its own) that changed
        in (after, up_to], oldest first, at most `limit`."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                f"SELECT {_COLUMNS} FROM presence p"
                " WHERE p.stream_position > ? AND p.stream_position <= ?"
                f" AND {_SHARES_A_ROOM} ORDER BY p.stream_position LIMIT ?",
                (after, up_to, user_id, user_id, limit),
            )
        )
        return [_row(row) for row in rows]

    def shares_a_room(self, user_id: str, other: str) -> bool:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT 1 FROM presence p WHERE p.user_id = ? AND {_SHARES_A_ROOM}",
                (other, user_id, user_id),
            )
        )
        return row is not None

    def position(self) -> int:
        return self.db.read(lambda tx: streams.current(tx, PRESENCE_STREAM))
