"""Rows that tell other instances of a change they keep in memory: typing (sync/typing.py)
and access tokens that stopped working (accounts/tokens.py; read by
storage/stream_changes.py).

Only with several instances (`tx.announce_as` set): each row takes the next position of its
own stream in the write that makes it, so its NOTIFY goes at commit, and the others read
the rows by range when it arrives (sync/cluster.py). Positions are gapless (streams.py:
a rolled-back write takes none), so an instance that applies a range in order has applied
everything up to its end. Only the newest `KEEP` rows of each table stay: an instance that
far behind (its listening connection lost for long) has lost nothing it still needs, since
typing times out and a cached token owner is believed for 30 s at most.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage import streams
from homeserver.storage.database import Database

TYPING_STREAM = "typing"
TOKENS_STREAM = "token_revocations"
KEEP = 10_000
PRUNE_EVERY = 100


@dataclass(frozen=True)
class TypingChange:
    room_id: str
    user_id: str
    typing: bool
    timeout_ms: int
    instance: str  # the instance it happened on: it times it out


def _append(tx, stream: str, table: str, columns: tuple[str, ...], values: tuple) -> int:
    position = streams.advance(tx, stream)
    marks = ", ".join("?" * (len(values) + 1))
    tx.execute(
        f"INSERT INTO {table} (stream_position, {', '.join(columns)}) VALUES ({marks})",
        (position, *values),
    )
    if position % PRUNE_EVERY == 0:
        tx.execute(f"DELETE FROM {table} WHERE stream_position <= ?", (position - KEEP,))
    return position


def revoke_tokens(tx, user_id: str, device_id: str | None) -> None:
    """Inside the write that ends tokens: the device's, or every one of the user's (None).
    One process alone writes nothing: AccountService forgets its own cache."""
    if tx.announce_as is not None:
        columns = ("user_id", "device_id")
        _append(tx, TOKENS_STREAM, "token_revocations", columns, (user_id, device_id))


class ClusterMemoryStore:
    def __init__(self, db: Database):
        self.db = db

    def add_typing(self, change: TypingChange) -> int:
        """Stores a typing change; returns its position."""
        values = (
            change.room_id,
            change.user_id,
            int(change.typing),
            change.timeout_ms,
            change.instance,
        )
        columns = ("room_id", "user_id", "typing", "timeout_ms", "instance_name")
        return self.db.write(
            lambda tx: _append(tx, TYPING_STREAM, "typing_changes", columns, values)
        )

    def typing_changes(self, after: int, upto: int) -> list[tuple[int, TypingChange]]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT stream_position, room_id, user_id, typing, timeout_ms, instance_name"
                " FROM typing_changes WHERE stream_position > ? AND stream_position <= ?"
                " ORDER BY stream_position",
                (after, upto),
            )
        )
        return [(r[0], TypingChange(r[1], r[2], bool(r[3]), int(r[4]), r[5])) for r in rows]

    def position(self, stream: str) -> int:
        return self.db.read(lambda tx: streams.current(tx, stream))
