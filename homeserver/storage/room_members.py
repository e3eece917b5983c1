"""Who is in a room, read from current state and room stats: a user's rooms, a room's
joined members and counts, and the heroes a nameless room is called after. The room store
(storage/rooms.py) is built on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from homeserver.storage.database import Database, in_lists


@dataclass(frozen=True)
class RoomCounts:
    """What a /sync room summary is made from."""

    joined_members: int
    invited_members: int
    name: str | None
    canonical_alias: str | None


class RoomMembers:
    db: Database

    def rooms_for_user(self, user_id: str, membership: str = "join") -> list[str]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT room_id FROM current_state WHERE state_key = ? AND type = 'm.room.member'"
                " AND membership = ? ORDER BY room_id",
                (user_id, membership),
            )
        )
        return [r[0] for r in rows]

    # Two reads for /sync, which runs them in one transaction with others (storage/sync.py).

    def member_counts(self, room_id: str) -> RoomCounts:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT joined_members, invited_members, name, canonical_alias FROM room_stats"
                " WHERE room_id = ?",
                (room_id,),
            )
        )
        return RoomCounts(*row) if row else RoomCounts(0, 0, None, None)

    def heroes(self, room_id: str, exclude: str, limit: int) -> list[str]:
        """What a client names a room without a name after: the first members other than
        `exclude` to have joined or been invited, in stream order; only if there are none,
        those who left or were banned."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT c.state_key, CASE WHEN c.membership IN ('join', 'invite') THEN 0 ELSE 1 END"
                " AS departed FROM current_state c JOIN events e ON e.event_id = c.event_id"
                " WHERE c.room_id = ? AND c.type = 'm.room.member'"
                " AND c.membership IN ('join', 'invite', 'leave', 'ban') AND c.state_key <> ?"
                " ORDER BY departed, e.stream_ordering LIMIT ?",
                (room_id, exclude, limit),
            )
        )
        present = [r[0] for r in rows if r[1] == 0]
        return present or [r[0] for r in rows]

    def joined_users(self, room_id: str) -> list[str]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT state_key FROM current_state WHERE room_id = ? AND type = 'm.room.member'"
                " AND membership = 'join' ORDER BY state_key",
                (room_id,),
            )
        )
        return [r[0] for r in rows]

    def joined_among(self, room_id: str, user_ids: Iterable[str]) -> list[str]:
        """Those of `user_ids` joined to the room: a lookup each, whatever the room's size."""
        users = list(dict.fromkeys(user_ids))

        def read(tx) -> list[str]:
            found: list[str] = []
            for chunk, marks in in_lists(users):
                found += [
                    r[0]
                    for r in tx.fetchall(
                        "SELECT state_key FROM current_state WHERE room_id = ?"
                        " AND type = 'm.room.member' AND membership = 'join'"
                        f" AND state_key IN ({marks})",
                        (room_id, *chunk),
                    )
                ]
            return found

        return self.db.read(read) if users else []
