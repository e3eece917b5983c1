"""Sliding sync connections (0070_sliding_sync.sql) and what the rooms list of a sliding
sync reads at once: each room's latest position, and the facts its filters look at.

A connection's entries are opaque JSON texts by (kind, room_id) to this store; the sync
service (sync/sliding_connections.py) gives them meaning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from homeserver.storage.database import Database, in_lists
from homeserver.storage.sync import StreamPositions, read_positions

EntryKey = tuple[str, str]  # (kind, room_id)


@dataclass(frozen=True)
class Connection:
    id: int
    user_id: str
    device_id: str
    conn_id: str
    generation: int
    last_used_ts: int


@dataclass(frozen=True)
class RoomFacts:
    """What a list's filters and a room's header read of a room's current state."""

    room_type: str | None
    encrypted: bool
    name: str | None
    avatar_url: str | None
    canonical_alias: str | None
    joined: int
    invited: int
    space_children: tuple[str, ...]  # the state keys of its m.space.child events with a via


_CONNECTION_COLUMNS = "id, user_id, device_id, conn_id, generation, last_used_ts"


class SlidingSyncStore:
    def __init__(self, db: Database):
        self.db = db

    # --- connections --------------------------------------------------------------------

    def open(
        self, user_id: str, device_id: str, conn_id: str, now_ms: int, keep: int
    ) -> tuple[int, list[int]]:
        """A new connection at generation 0, replacing the device's one of that conn_id,
        and ending its oldest past `keep`; returns its id, and those of the ended."""

        def write(tx) -> tuple[int, list[int]]:
            ended = [
                row[0]
                for row in tx.fetchall(
                    "DELETE FROM sliding_sync_connections"
                    " WHERE user_id = ? AND device_id = ? AND conn_id = ? RETURNING id",
                    (user_id, device_id, conn_id),
                )
            ]
            others = tx.fetchall(
                "SELECT id FROM sliding_sync_connections WHERE user_id = ? AND device_id = ?"
                " ORDER BY last_used_ts DESC, id DESC",
                (user_id, device_id),
            )
            for (old,) in others[max(keep - 1, 0) :]:
                tx.execute("DELETE FROM sliding_sync_connections WHERE id = ?", (old,))
                ended.append(old)
            created = tx.fetchone(
                "INSERT INTO sliding_sync_connections"
                " (user_id, device_id, conn_id, generation, last_used_ts)"
                " VALUES (?, ?, ?, 0, ?) RETURNING id",
                (user_id, device_id, conn_id, now_ms),
            )[0]
            return created, ended

        return self.db.write(write)

    def connection(self, connection_id: int) -> Connection | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_CONNECTION_COLUMNS} FROM sliding_sync_connections WHERE id = ?",
                (connection_id,),
            )
        )
        return Connection(*row) if row else None

    def entries(self, connection_id: int, generation: int) -> dict[EntryKey, str]:
        """The connection's entries as of `generation`: per key, the latest row at or
        before it, unless that row removed the key."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT kind, room_id, value FROM sliding_sync_entries WHERE connection_id = ?"
                " AND generation <= ? ORDER BY generation",
                (connection_id, generation),
            )
        )
        found: dict[EntryKey, str | None] = {}
        for kind, room_id, value in rows:
            found[(kind, room_id)] = value
        return {key: value for key, value in found.items() if value is not None}

    def save(
        self,
        connection_id: int,
        from_generation: int,
        changes: dict[EntryKey, str | None],
        now_ms: int,
    ) -> int | None:
        """Writes `changes` (None: removed) as the generation after `from_generation`, the
        one the client came back with; rows past it were never acknowledged and go, as do
        the rows the new ones supersede before it (a retry of `from_generation` still reads
        its own). Returns the new generation; None if the connection has ended meanwhile."""
        return self.save_many([(connection_id, from_generation, changes, now_ms)])[0]

    def save_many(self, saves: list[tuple[int, int, dict, int]]) -> list[int | None]:
        """`save` for each (connection_id, from_generation, changes, now_ms), in order, in
        one transaction."""
        return self.db.write(lambda tx: [_save(tx, *save) for save in saves])

    def touch(self, connection_id: int, now_ms: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE sliding_sync_connections SET last_used_ts = ? WHERE id = ?",
                (now_ms, connection_id),
            )
        )

    def expire(self, unused_since_ms: int) -> int:
        """Forgets the connections last used before `unused_since_ms`; returns how many."""

        def write(tx) -> int:
            rows = tx.fetchall(
                "DELETE FROM sliding_sync_connections WHERE last_used_ts < ? RETURNING id",
                (unused_since_ms,),
            )
            return len(rows)

        return self.db.write(write)

    # --- what a rooms list reads --------------------------------------------------------

    def forgets(self, user_id: str) -> tuple[int, int]:
        """(rooms forgotten, when last): what changes when the user forgets a room, which
        moves no stream."""
        return self.db.read(lambda tx: _forgets(tx, user_id))

    def positions_and_forgets(self, user_id: str) -> tuple[StreamPositions, tuple[int, int]]:
        """The streams' positions and `forgets`, in one read: what a connection's kept room
        list is brought up to date from (sync/sliding_lists.py)."""
        return self.db.read(lambda tx: (read_positions(tx), _forgets(tx, user_id)))

    def latest_positions(self, room_ids: list[str], up_to: int) -> dict[str, int]:
        """{room_id: the stream position of its latest event shown to clients, at or before
        `up_to`}: an index probe a room (events_by_room)."""
        found: dict[str, int] = {}

        def read(tx):
            for chunk, marks in in_lists(room_ids):
                found.update(
                    tx.fetchall(
                        "SELECT room_id, MAX(stream_ordering) FROM events"
                        f" WHERE room_id IN ({marks}) AND stream_ordering <= ?"
                        " AND soft_failed = 0 AND outlier = 0 GROUP BY room_id",
                        (*chunk, up_to),
                    )
                )

        self.db.read(read)
        return found

    def latest_of_types(self, room_id: str, up_to: int, types: frozenset[str]) -> int | None:
        """The stream position of the room's latest event of one of `types` shown to
        clients, at or before `up_to`: read backwards from `up_to` (events_by_room)."""
        marks = ", ".join("?" * len(types))
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT stream_ordering FROM events WHERE room_id = ? AND stream_ordering <= ?"
                f" AND type IN ({marks}) AND soft_failed = 0 AND outlier = 0"
                " ORDER BY stream_ordering DESC LIMIT 1",
                (room_id, up_to, *sorted(types)),
            )
        )
        return row[0] if row else None

    def room_facts(self, room_ids: list[str]) -> dict[str, RoomFacts]:
        """The facts of each room this server holds state of (room_stats and current
        state); rooms it does not (a remote invite's) are left out."""
        facts: dict[str, RoomFacts] = {}

        def read(tx):
            for chunk, marks in in_lists(room_ids):
                encrypted = {
                    r[0]
                    for r in tx.fetchall(
                        f"SELECT room_id FROM current_state WHERE room_id IN ({marks})"
                        " AND type = 'm.room.encryption' AND state_key = ''",
                        chunk,
                    )
                }
                children: dict[str, list[str]] = {}
                for room_id, child, text in tx.fetchall(
                    "SELECT c.room_id, c.state_key, e.json FROM current_state c"
                    " JOIN events e ON e.event_id = c.event_id"
                    f" WHERE c.room_id IN ({marks}) AND c.type = 'm.space.child'",
                    chunk,
                ):
                    if json.loads(text).get("content", {}).get("via"):
                        children.setdefault(room_id, []).append(child)
                for row in tx.fetchall(
                    "SELECT room_id, room_type, name, avatar_url, canonical_alias,"
                    f" joined_members, invited_members FROM room_stats WHERE room_id IN ({marks})",
                    chunk,
                ):
                    room_id = row[0]
                    facts[room_id] = RoomFacts(
                        row[1],
                        room_id in encrypted,
                        row[2],
                        row[3],
                        row[4],
                        row[5],
                        row[6],
                        tuple(children.get(room_id, ())),
                    )

        self.db.read(read)
        return facts

    def member_senders(self, user_id: str, room_ids: list[str]) -> dict[str, str]:
        """{room_id: the sender of the user's current member event} in `room_ids`: a
        leave the user sent themselves is no kick."""
        found: dict[str, str] = {}

        def read(tx):
            for chunk, marks in in_lists(room_ids):
                for room_id, text in tx.fetchall(
                    "SELECT c.room_id, e.json FROM current_state c"
                    " JOIN events e ON e.event_id = c.event_id WHERE c.type = 'm.room.member'"
                    f" AND c.state_key = ? AND c.room_id IN ({marks})",
                    (user_id, *chunk),
                ):
                    found[room_id] = json.loads(text).get("sender", "")

        self.db.read(read)
        return found

    def account_data_of_type(self, user_id: str, data_type: str) -> dict[str, dict]:
        """{room_id ("" for global): content} of the user's account data of one type (the
        m.direct and m.tag a list's filters read)."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT room_id, content FROM account_data WHERE user_id = ? AND type = ?",
                (user_id, data_type),
            )
        )
        return {room_id: json.loads(content) for room_id, content in rows}


def _forgets(tx, user_id: str) -> tuple[int, int]:
    row = tx.fetchone(
        "SELECT COUNT(*), MAX(forgotten_ts) FROM forgotten_rooms WHERE user_id = ?", (user_id,)
    )
    return (row[0], row[1] or 0) if row else (0, 0)


def _save(
    tx, connection_id: int, from_generation: int, changes: dict[EntryKey, str | None], now_ms: int
) -> int | None:
    generation = from_generation + 1
    if not tx.fetchall(
        "UPDATE sliding_sync_connections SET generation = ?, last_used_ts = ?"
        " WHERE id = ? RETURNING id",
        (generation, now_ms, connection_id),
    ):
        return None
    tx.execute(
        "DELETE FROM sliding_sync_entries WHERE connection_id = ? AND generation > ?",
        (connection_id, from_generation),
    )
    for kind, room_id in changes:
        tx.execute(
            "DELETE FROM sliding_sync_entries WHERE connection_id = ? AND kind = ?"
            " AND room_id = ? AND generation < ?",
            (connection_id, kind, room_id, from_generation),
        )
    tx.executemany(
        "INSERT INTO sliding_sync_entries (connection_id, generation, kind, room_id,"
        " value) VALUES (?, ?, ?, ?, ?)",
        [(connection_id, generation, k, r, v) for (k, r), v in changes.items()],
    )
    return generation
