"""Room aliases and the published room directory.

Public room list paging. Rooms are listed largest first (joined members), then by room ID.
A paging session is pinned to a snapshot taken when its first page is read: the event
stream position (member counts are read as they were at that position, from
room_joined_count_history) and the directory stream position (rooms published later are left
out). Pages are keyset-paginated on (count at the snapshot, room_id), so the order cannot
shift under the client: every room listed at the snapshot and still published is returned
exactly once, whether rooms are published, joined or left meanwhile. A room unpublished
meanwhile simply drops out. The chunk itself shows current names, topics and counts.
An offset token (what Synapse uses) would skip or repeat rooms when counts change between
pages; the price here is one indexed lookup per published room per page.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage import streams
from homeserver.storage.database import Database
from homeserver.storage.rooms import EVENTS_STREAM

DIRECTORY_STREAM = "directory"


@dataclass(frozen=True)
class Snapshot:
    events_position: int
    directory_position: int


@dataclass(frozen=True)
class Cursor:
    """A room's place in a paging session's order."""

    ranked_members: int
    room_id: str


@dataclass(frozen=True)
class PublishedRoom:
    room_id: str
    ranked_members: int  # joined members at the snapshot: the sort key
    joined_members: int  # now
    name: str | None
    topic: str | None
    canonical_alias: str | None
    avatar_url: str | None
    join_rule: str | None
    history_visibility: str | None
    guest_access: str | None
    room_type: str | None


@dataclass(frozen=True)
class RoomFilter:
    search_term: str | None = None  # case-insensitive substring of name, topic or an alias
    room_types: tuple | None = None  # None in the tuple matches rooms without a type


def _like_contains(term: str) -> str:
    # Not folded here: the SQL folds the term with the engine's LOWER, as it folds the
    # columns. Python's lower() knows more of Unicode than SQLite's (ASCII only) or a C-locale
    # PostgreSQL's, and a term folded differently from the name would miss the name itself.
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _filter_sql(room_filter: RoomFilter) -> tuple[str, list]:
    sql, params = "", []
    if room_filter.search_term:
        pattern = _like_contains(room_filter.search_term)
        sql += (
            " AND (LOWER(s.name) LIKE LOWER(?) ESCAPE '\\'"
            " OR LOWER(s.topic) LIKE LOWER(?) ESCAPE '\\'"
            " OR LOWER(s.canonical_alias) LIKE LOWER(?) ESCAPE '\\'"
            " OR EXISTS (SELECT 1 FROM room_aliases a WHERE a.room_id = p.room_id"
            " AND LOWER(a.room_alias) LIKE LOWER(?) ESCAPE '\\'))"
        )
        params += [pattern] * 4
    if room_filter.room_types is not None:
        named = [t for t in room_filter.room_types if t is not None]
        clauses = []
        if named:
            clauses.append("s.room_type IN (" + ", ".join("?" for _ in named) + ")")
            params += named
        if None in room_filter.room_types:
            clauses.append("s.room_type IS NULL")
        sql += " AND (" + (" OR ".join(clauses) or "1 = 0") + ")"
    return sql, params


class DirectoryStore:
    def __init__(self, db: Database):
        self.db = db

    # --- aliases ------------------------------------------------------------------------

    @staticmethod
    def add_alias_in(tx, alias: str, room_id: str, creator: str, now_ms: int) -> bool:
        """Within a transaction: adds the alias; False if it is taken."""
        # RETURNING, not `rowcount`: a room's creation writes it in a pipelined transaction.
        added = tx.fetchone(
            "INSERT INTO room_aliases (room_alias, room_id, creator, created_ts)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (room_alias) DO NOTHING RETURNING 1",
            (alias, room_id, creator, now_ms),
        )
        return added is not None

    def add_alias(self, alias: str, room_id: str, creator: str, now_ms: int) -> bool:
        return self.db.write(self.add_alias_in, alias, room_id, creator, now_ms)

    def get_alias(self, alias: str) -> tuple[str, str] | None:
        """(room_id, creator) of an alias."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT room_id, creator FROM room_aliases WHERE room_alias = ?", (alias,)
            )
        )
        return (row[0], row[1]) if row else None

    def delete_alias(self, alias: str) -> bool:
        return self.db.write(
            lambda tx: (
                tx.execute("DELETE FROM room_aliases WHERE room_alias = ?", (alias,)).rowcount == 1
            )
        )

    def aliases_for_room(self, room_id: str) -> list[str]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT room_alias FROM room_aliases WHERE room_id = ? ORDER BY room_alias",
                (room_id,),
            )
        )
        return [r[0] for r in rows]

    @classmethod
    def move_room_in(cls, tx, old_room_id: str, new_room_id: str, now_ms: int) -> None:
        """Within a transaction (an upgrade's new room): the old room's aliases point at the
        new room, and the new room is listed in the directory instead if the old one was."""
        tx.execute(
            "UPDATE room_aliases SET room_id = ? WHERE room_id = ?", (new_room_id, old_room_id)
        )
        if tx.fetchone("DELETE FROM published_rooms WHERE room_id = ? RETURNING 1", (old_room_id,)):
            cls.publish_in(tx, new_room_id, now_ms)

    # --- visibility ---------------------------------------------------------------------

    @staticmethod
    def publish_in(tx, room_id: str, now_ms: int) -> None:
        """Within a transaction: lists the room. A room already listed keeps its place (the
        position taken then goes unused: gaps in a stream are harmless)."""
        position = streams.advance(tx, DIRECTORY_STREAM)
        tx.execute(
            "INSERT INTO published_rooms (room_id, published_at, published_ts)"
            " VALUES (?, ?, ?) ON CONFLICT (room_id) DO NOTHING",
            (room_id, position, now_ms),
        )

    def publish(self, room_id: str, now_ms: int) -> None:
        self.db.write(self.publish_in, room_id, now_ms)

    def unpublish(self, room_id: str) -> None:
        self.db.write(
            lambda tx: tx.execute("DELETE FROM published_rooms WHERE room_id = ?", (room_id,))
        )

    def is_published(self, room_id: str) -> bool:
        return (
            self.db.read(
                lambda tx: tx.fetchone(
                    "SELECT 1 FROM published_rooms WHERE room_id = ?", (room_id,)
                )
            )
            is not None
        )

    # --- the public room list -----------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self.db.read(
            lambda tx: Snapshot(
                streams.current(tx, EVENTS_STREAM), streams.current(tx, DIRECTORY_STREAM)
            )
        )

    def public_rooms(
        self,
        snapshot: Snapshot,
        cursor: Cursor | None,
        backwards: bool,
        limit: int,
        room_filter: RoomFilter,
    ) -> list[PublishedRoom]:
        """Up to `limit` rooms after `cursor` in the session's order (before it, nearest
        first, when `backwards`)."""
        filter_sql, filter_params = _filter_sql(room_filter)
        # MATERIALIZED: each room's count at the snapshot is looked up once, not again for
        # every place the outer query uses it.
        sql = (
            "WITH ranked AS MATERIALIZED ("
            " SELECT p.room_id, COALESCE((SELECT h.joined_members"
            "  FROM room_joined_count_history h WHERE h.room_id = p.room_id"
            "  AND h.stream_ordering <= ? ORDER BY h.stream_ordering DESC LIMIT 1), 0)"
            "  AS ranked_members, s.joined_members, s.name, s.topic, s.canonical_alias,"
            "  s.avatar_url, s.join_rule, s.history_visibility, s.guest_access, s.room_type"
            " FROM published_rooms p JOIN room_stats s ON s.room_id = p.room_id"
            f" WHERE p.published_at <= ?{filter_sql})"
            " SELECT room_id, ranked_members, joined_members, name, topic, canonical_alias,"
            " avatar_url, join_rule, history_visibility, guest_access, room_type FROM ranked"
        )
        params: list = [snapshot.events_position, snapshot.directory_position, *filter_params]
        if cursor is not None:
            if backwards:
                sql += " WHERE (ranked_members > ? OR (ranked_members = ? AND room_id < ?))"
            else:
                sql += " WHERE (ranked_members < ? OR (ranked_members = ? AND room_id > ?))"
            params += [cursor.ranked_members, cursor.ranked_members, cursor.room_id]
        sql += (
            " ORDER BY ranked_members ASC, room_id DESC"
            if backwards
            else " ORDER BY ranked_members DESC, room_id ASC"
        ) + " LIMIT ?"
        params.append(limit)
        rows = self.db.read(lambda tx: tx.fetchall(sql, params))
        return [PublishedRoom(*row) for row in rows]

    def count_public_rooms(self, room_filter: RoomFilter) -> int:
        filter_sql, params = _filter_sql(room_filter)
        return self.db.read(
            lambda tx: tx.fetchone(
                "SELECT COUNT(*) FROM published_rooms p JOIN room_stats s ON s.room_id = p.room_id"
                f" WHERE 1 = 1{filter_sql}",
                params,
            )
        )[0]
