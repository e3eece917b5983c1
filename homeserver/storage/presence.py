"""Presence rows (0030_presence.sql): each user's latest state, ours and other servers'.

A change takes the next position of the presence stream in its write, so /sync asks for
what changed after its token's position, and only of the users who share a room with its
user (or the user itself).

With several instances, `online_until_ms` says until when a user counts as online, whichever
instance they sync through: each extends it, and any instance's sweep takes the users past
it offline (sync/presence.py).
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


class _NotNow(Exception):
    pass


class PresenceStore:
    def __init__(self, db: Database):
        self.db = db

    def put(self, presence: Presence, online_until_ms: int = 0) -> int:
        """Stores the user's presence, and that they are online until `online_until_ms`
        unless a later time is stored; returns its stream position."""

        def write(tx) -> int:
            position = streams.advance(tx, PRESENCE_STREAM)
            tx.execute(
                "INSERT INTO presence (user_id, state, status_msg, last_active_ts,"
                " currently_active, stream_position, online_until_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id) DO UPDATE SET state = excluded.state,"
                " status_msg = excluded.status_msg, last_active_ts = excluded.last_active_ts,"
                " currently_active = excluded.currently_active,"
                " stream_position = excluded.stream_position,"
                " online_until_ms = CASE WHEN excluded.online_until_ms > presence.online_until_ms"
                " THEN excluded.online_until_ms ELSE presence.online_until_ms END",
                (
                    presence.user_id,
                    presence.state,
                    presence.status_msg,
                    presence.last_active_ts,
                    int(presence.currently_active),
                    position,
                    online_until_ms,
                ),
            )
            return position

        return self.db.write(write)

    def keep_online(self, user_id: str, until_ms: int) -> None:
        """The user counts as online until `until_ms` at least."""
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE presence SET online_until_ms = ? WHERE user_id = ? AND online_until_ms < ?",
                (until_ms, user_id, until_ms),
            )
        )

    def past_online(self, now_ms: int, limit: int) -> list[str]:
        """Users not offline whose online time has run out."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT user_id FROM presence WHERE state <> 'offline' AND online_until_ms < ?"
                " LIMIT ?",
                (now_ms, limit),
            )
        )
        return [user_id for (user_id,) in rows]

    def go_offline(self, user_id: str, now_ms: int) -> Presence | None:
        """Takes the user offline if their online time has run out still: the stored
        presence then, or None (another instance's sweep or a sync got there first)."""

        def write(tx) -> Presence:
            # The stream's row first, as every presence write takes it: one lock order.
            position = streams.advance(tx, PRESENCE_STREAM)
            row = tx.fetchone(
                "UPDATE presence SET state = 'offline', currently_active = 0,"
                " stream_position = ? WHERE user_id = ? AND state <> 'offline'"
                " AND online_until_ms < ?"
                " RETURNING user_id, state, status_msg, last_active_ts, currently_active,"
                " stream_position",
                (position, user_id, now_ms),
            )
            if row is None:
                raise _NotNow  # rolled back: no position taken, nothing announced
            return _row(row)

        try:
            return self.db.write(write)
        except _NotNow:
            return None

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
