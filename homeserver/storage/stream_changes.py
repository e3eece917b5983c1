"""What other instances wrote between two positions of a stream, and who it concerns, read
by position when their NOTIFY arrives (sync/cluster.py), never carried in the notification.

Receipts and account data keep one row per key, moved to the newest position, so a range
finds the rows last written in it: each is someone to wake, which is all a wake needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from homeserver.storage.database import Database
from homeserver.storage.parsed_events import PARSED
from homeserver.storage.rooms import StoredEvent

RECEIPTS_PRIVATE = "m.read.private"


@dataclass
class RoomChanges:
    """Events stored in a range, and per room the users its member events are about."""

    stored: list[StoredEvent] = field(default_factory=list)  # oldest first
    rooms: dict[str, set[str]] = field(default_factory=dict)
    state_changed: set[str] = field(default_factory=set)  # rooms with a state event
    invited: set[str] = field(default_factory=set)  # invites and knocks kept out of rooms


class StreamChanges:
    def __init__(self, db: Database):
        self.db = db

    def room_events(self, after: int, upto: int) -> RoomChanges:
        def read(tx) -> RoomChanges:
            changes = RoomChanges()
            for position, event_id, text, unsigned, soft_failed in tx.fetchall(
                "SELECT stream_ordering, event_id, json, unsigned, soft_failed FROM events"
                " WHERE stream_ordering > ? AND stream_ordering <= ? AND outlier = 0"
                " ORDER BY stream_ordering",
                (after, upto),
            ):
                event = PARSED.event(event_id, text)
                changes.stored.append(
                    StoredEvent(event, position, json.loads(unsigned or "{}"), bool(soft_failed))
                )
                targets = changes.rooms.setdefault(event.room_id, set())
                if event.state_key is not None and not soft_failed:
                    changes.state_changed.add(event.room_id)
                if event.type == "m.room.member" and event.state_key is not None:
                    targets.add(event.state_key)
            # Invites from other servers take positions of the events stream too.
            changes.invited.update(
                user_id
                for (user_id,) in tx.fetchall(
                    "SELECT user_id FROM remote_invites"
                    " WHERE stream_ordering > ? AND stream_ordering <= ?",
                    (after, upto),
                )
            )
            return changes

        return self.db.read(read)

    def receipts(self, after: int, upto: int) -> tuple[set[str], set[str]]:
        """The rooms with new shared receipts, and the users with new private ones."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT room_id, receipt_type, user_id FROM receipts"
                " WHERE stream_position > ? AND stream_position <= ?",
                (after, upto),
            )
        )
        rooms = {room_id for room_id, kind, _ in rows if kind != RECEIPTS_PRIVATE}
        users = {user_id for _, kind, user_id in rows if kind == RECEIPTS_PRIVATE}
        return rooms, users

    def users(self, stream_name: str, after: int, upto: int) -> set[str]:
        """The users whose rows of a per-user stream moved in the range."""
        table = _PER_USER[stream_name]
        rows = self.db.read(
            lambda tx: tx.fetchall(
                f"SELECT DISTINCT user_id FROM {table}"
                " WHERE stream_position > ? AND stream_position <= ?",
                (after, upto),
            )
        )
        return {user_id for (user_id,) in rows}

    def revoked_tokens(self, after: int, upto: int) -> list[tuple[str, str | None]]:
        """(user_id, device_id, or None for every one of the user's) of the access tokens
        ended in the range (storage/cluster_memory.py)."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT user_id, device_id FROM token_revocations"
                " WHERE stream_position > ? AND stream_position <= ? ORDER BY stream_position",
                (after, upto),
            )
        )
        return [(user_id, device_id) for user_id, device_id in rows]

    def positions(self) -> dict[str, int]:
        return dict(
            self.db.read(
                lambda tx: tx.fetchall("SELECT stream_name, position FROM stream_positions")
            )
        )


# Streams whose rows name the user they concern (or, for device lists and presence, the
# user whose change concerns everyone sharing a room with them).
_PER_USER = {
    "account_data": "account_data",
    "to_device": "to_device_messages",
    "device_lists": "device_list_changes",
    "presence": "presence",
}
PER_USER_STREAMS = frozenset(_PER_USER)
