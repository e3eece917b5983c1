"""What the server admins' API reads and writes beyond other stores (0066_admin.sql):
the room list with its counts, blocked rooms and quarantined media."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.database import Database


@dataclass(frozen=True)
class AdminRoomRow:
    room_id: str
    name: str | None
    canonical_alias: str | None
    joined_members: int
    joined_local_members: int
    version: str
    creator: str
    state_events: int
    public: bool
    join_rules: str | None
    guest_access: str | None
    history_visibility: str | None
    topic: str | None
    avatar: str | None
    room_type: str | None
    invited_members: int
    encrypted: bool


# Each ordering synadm offers, by the column it sorts (Synapse's admin API names).
ORDERINGS = {
    "name": "s.name",
    "canonical_alias": "s.canonical_alias",
    "joined_members": "COALESCE(s.joined_members, 0)",
    "joined_local_members": "joined_local_members",
    "version": "r.room_version",
    "creator": "r.creator",
    "encryption": "encrypted",
    "public": "public",
    "join_rules": "s.join_rule",
    "guest_access": "s.guest_access",
    "history_visibility": "s.history_visibility",
    "state_events": "state_events",
}

_SELECT = (
    "SELECT r.room_id, s.name, s.canonical_alias, COALESCE(s.joined_members, 0),"
    " (SELECT COUNT(*) FROM current_state c WHERE c.room_id = r.room_id"
    "  AND c.type = 'm.room.member' AND c.membership = 'join'"
    "  AND c.state_key LIKE ? ESCAPE '!') AS joined_local_members,"
    " r.room_version, r.creator,"
    " (SELECT COUNT(*) FROM current_state c WHERE c.room_id = r.room_id) AS state_events,"
    " CASE WHEN p.room_id IS NULL THEN 0 ELSE 1 END AS public,"
    " s.join_rule, s.guest_access, s.history_visibility, s.topic, s.avatar_url, s.room_type,"
    " COALESCE(s.invited_members, 0),"
    " (SELECT COUNT(*) FROM current_state c WHERE c.room_id = r.room_id"
    "  AND c.type = 'm.room.encryption' AND c.state_key = '') AS encrypted"
    " FROM rooms r LEFT JOIN room_stats s ON s.room_id = r.room_id"
    " LEFT JOIN published_rooms p ON p.room_id = r.room_id"
)


def like_escaped(text: str) -> str:
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def _row(r) -> AdminRoomRow:
    fields = list(r)
    fields[8], fields[16] = bool(r[8]), bool(r[16])
    return AdminRoomRow(*fields)


class AdminStore:
    def __init__(self, db: Database, server_name: str):
        self.db = db
        self._local_members = "%:" + like_escaped(server_name)

    def list_rooms(
        self, offset: int, limit: int, order_by: str, backwards: bool, term: str | None
    ) -> tuple[list[AdminRoomRow], int]:
        """A page of rooms and how many match; `term` matches part of the name, the
        canonical alias or the room ID, case-insensitively."""
        where, params = "", []
        if term:
            where = (
                " WHERE LOWER(COALESCE(s.name, '')) LIKE ? ESCAPE '!'"
                " OR LOWER(COALESCE(s.canonical_alias, '')) LIKE ? ESCAPE '!'"
                " OR LOWER(r.room_id) LIKE ? ESCAPE '!'"
            )
            params = ["%" + like_escaped(term.lower()) + "%"] * 3
        column = ORDERINGS[order_by]
        direction = "DESC" if backwards else "ASC"
        # NULLs last both ways and on both engines, then the room ID: a stable order to page.
        order = f" ORDER BY ({column}) IS NULL, {column} {direction}, r.room_id {direction}"

        def tx(tx):
            total = tx.fetchone(
                "SELECT COUNT(*) FROM rooms r LEFT JOIN room_stats s ON s.room_id = r.room_id"
                + where,
                params,
            )[0]
            rows = tx.fetchall(
                _SELECT + where + order + " LIMIT ? OFFSET ?",
                (self._local_members, *params, limit, offset),
            )
            return [_row(r) for r in rows], total

        return self.db.read(tx)

    def room(self, room_id: str) -> AdminRoomRow | None:
        row = self.db.read(
            lambda tx: tx.fetchone(_SELECT + " WHERE r.room_id = ?", (self._local_members, room_id))
        )
        return _row(row) if row else None

    def block_room(self, room_id: str, by: str, now_ms: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "INSERT INTO blocked_rooms (room_id, blocked_by, blocked_ts) VALUES (?, ?, ?)"
                " ON CONFLICT (room_id) DO NOTHING",
                (room_id, by, now_ms),
            )
        )

    def outbox_rows(self, room_id: str) -> int:
        """The room's events still owed to other servers (federation/sender.py)."""
        return self.db.read(
            lambda tx: tx.fetchone(
                "SELECT COUNT(*) FROM federation_outbox WHERE room_id = ?", (room_id,)
            )[0]
        )

    def purge_room(self, room_id: str) -> None:
        """Deletes the room and everything stored of it, in one transaction. Reports and
        blocks stay: they are the admins' record."""

        def tx(tx):
            events = "SELECT event_id FROM events WHERE room_id = ?"
            groups = "SELECT state_group FROM state_groups WHERE room_id = ?"
            chains = "SELECT chain_id FROM event_auth_positions WHERE event_id IN (" + events + ")"
            tx.execute(f"DELETE FROM auth_chain_links WHERE origin_chain IN ({chains})", (room_id,))
            tx.execute(f"DELETE FROM event_auth_positions WHERE event_id IN ({events})", (room_id,))
            tx.execute(
                f"DELETE FROM state_group_entries WHERE state_group IN ({groups})", (room_id,)
            )
            for table in _ROOM_TABLES:
                tx.execute(f"DELETE FROM {table} WHERE room_id = ?", (room_id,))

        self.db.write(tx)


# Every table with the room's rows, those referring to `rooms` last.
_ROOM_TABLES = (
    "federation_outbox",
    "event_search",
    "event_relations",
    "redacted_events",
    "redactions",
    "rejected_events",
    "event_txn_ids",
    "receipts",
    "account_data",
    "forgotten_rooms",
    "remote_invites",
    "event_forward_extremities",
    "current_state",
    "room_state_positions",
    "room_joined_count_history",
    "event_state_groups",
    "state_groups",
    "room_aliases",
    "published_rooms",
    "room_stats",
    "events",
    "rooms",
)


class AdminMediaStore:
    """Media lists and quarantine for the admins (0066_admin.sql)."""

    def __init__(self, db: Database, server_name: str):
        self.db = db
        self.server_name = server_name  # the origin of local media

    def quarantine(self, files: list[tuple[str, str]], by: str, now_ms: int) -> int:
        """Quarantines each (origin, media_id); how many were not already."""

        def tx(tx):
            count = 0
            for origin, media_id in files:
                count += tx.execute(
                    "INSERT INTO quarantined_media (origin, media_id, quarantined_by,"
                    " quarantined_ts) VALUES (?, ?, ?, ?) ON CONFLICT (origin, media_id)"
                    " DO NOTHING",
                    (origin, media_id, by, now_ms),
                ).rowcount
            return count

        return self.db.write(tx)

    def unquarantine(self, origin: str, media_id: str) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "DELETE FROM quarantined_media WHERE origin = ? AND media_id = ?",
                (origin, media_id),
            )
        )

    def user_media(
        self, user_id: str, offset: int, limit: int, order_by: str, backwards: bool
    ) -> tuple[list[tuple], int]:
        """A page of the user's uploads: (media_id, content_type, media_length, upload_name,
        created_ts, quarantined_by), and how many there are."""
        column = MEDIA_ORDERINGS[order_by]
        direction = "DESC" if backwards else "ASC"

        def tx(tx):
            total = tx.fetchone("SELECT COUNT(*) FROM local_media WHERE user_id = ?", (user_id,))
            rows = tx.fetchall(
                "SELECT m.media_id, m.content_type, m.media_length, m.upload_name,"
                " m.created_ts, q.quarantined_by FROM local_media m"
                " LEFT JOIN quarantined_media q ON q.origin = ? AND q.media_id = m.media_id"
                f" WHERE m.user_id = ? ORDER BY ({column}) IS NULL, {column} {direction},"
                f" m.media_id {direction} LIMIT ? OFFSET ?",
                (self.server_name, user_id, limit, offset),
            )
            return rows, total[0]

        return self.db.read(tx)

    def user_media_ids(self, user_id: str) -> list[str]:
        rows = self.db.read(
            lambda tx: tx.fetchall("SELECT media_id FROM local_media WHERE user_id = ?", (user_id,))
        )
        return [r[0] for r in rows]

    def room_event_pdus(self, room_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        """(stream_ordering, PDU JSON) of the room's events after `after`, `limit` at most."""
        return self.db.read(
            lambda tx: tx.fetchall(
                "SELECT stream_ordering, json FROM events WHERE room_id = ?"
                " AND stream_ordering > ? ORDER BY stream_ordering LIMIT ?",
                (room_id, after, limit),
            )
        )


MEDIA_ORDERINGS = {
    "media_id": "m.media_id",
    "upload_name": "m.upload_name",
    "created_ts": "m.created_ts",
    "media_length": "m.media_length",
    "media_type": "m.content_type",
    "quarantined_by": "q.quarantined_by",
}
