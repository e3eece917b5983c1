"""Server-side key backups: versions and the encrypted room keys stored in them.

Version numbers are per user, 1, 2, 3..., never reused. Every write first takes the user's
row in `key_backup_users` (schema 0021 says why), so the checks a write makes (is this
version current? is the stored key better?) and the write itself see one state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterator

from homeserver.storage.database import Database, Tx, in_lists


@dataclass(frozen=True)
class BackupVersion:
    version: int
    algorithm: str
    auth_data: dict
    etag: int
    count: int


@dataclass(frozen=True)
class RoomKey:
    first_message_index: int
    forwarded_count: int
    is_verified: bool
    session_data: dict

    def to_json(self) -> dict:
        return {
            "first_message_index": self.first_message_index,
            "forwarded_count": self.forwarded_count,
            "is_verified": self.is_verified,
            "session_data": self.session_data,
        }


@dataclass(frozen=True)
class KeysChanged:
    """What a write of keys left: the version's etag and how many keys it holds."""

    etag: int
    count: int


class UnknownVersion(Exception):
    """No live backup version of that number (never created, or deleted)."""


class NotCurrentVersion(Exception):
    """Keys may only be written to the current (highest live) version."""

    def __init__(self, current: int):
        super().__init__(current)
        self.current = current


# keep_new(stored, uploaded): whether the uploaded key replaces the stored one.
ReplaceRule = Callable[[RoomKey, RoomKey], bool]

_KEY_COLUMNS = "room_id, session_id, first_message_index, forwarded_count, is_verified"


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _lock_user(tx: Tx, user_id: str) -> int:
    """Takes the user's row (made if absent) and returns the last version handed out."""
    row = tx.fetchone(
        "INSERT INTO key_backup_users (user_id, last_version) VALUES (?, 0)"
        " ON CONFLICT (user_id) DO UPDATE SET last_version = key_backup_users.last_version"
        " RETURNING last_version",
        (user_id,),
    )
    assert row is not None
    return int(row[0])


def _current(tx: Tx, user_id: str) -> int | None:
    row = tx.fetchone("SELECT MAX(version) FROM key_backup_versions WHERE user_id = ?", (user_id,))
    return None if row is None or row[0] is None else int(row[0])


def _version_row(tx: Tx, user_id: str, version: int | None) -> BackupVersion | None:
    """The version, or the current one when `version` is None."""
    if version is None:
        version = _current(tx, user_id)
        if version is None:
            return None
    row = tx.fetchone(
        "SELECT version, algorithm, auth_data, etag, key_count FROM key_backup_versions"
        " WHERE user_id = ? AND version = ?",
        (user_id, version),
    )
    if row is None:
        return None
    return BackupVersion(int(row[0]), row[1], json.loads(row[2]), int(row[3]), int(row[4]))


def _writable(tx: Tx, user_id: str, version: int) -> BackupVersion:
    """The version, if keys may be written to it: it is the current one."""
    last = _lock_user(tx, user_id)
    current = _version_row(tx, user_id, None)
    if current is None or version > last:
        raise UnknownVersion(version)
    if current.version != version:
        raise NotCurrentVersion(current.version)
    return current


def _live(tx: Tx, user_id: str, version: int) -> BackupVersion:
    _lock_user(tx, user_id)
    found = _version_row(tx, user_id, version)
    if found is None:
        raise UnknownVersion(version)
    return found


def _changed(tx: Tx, user_id: str, found: BackupVersion, added: int, removed: int, bump: bool):
    etag = found.etag + 1 if bump else found.etag
    count = found.count + added - removed
    if bump or added or removed:
        tx.execute(
            "UPDATE key_backup_versions SET etag = ?, key_count = ?"
            " WHERE user_id = ? AND version = ?",
            (etag, count, user_id, found.version),
        )
    return KeysChanged(etag, count)


def _stored_keys(
    tx: Tx, user_id: str, version: int, room_id: str, session_ids: list[str]
) -> dict[str, RoomKey]:
    found: dict[str, RoomKey] = {}
    for chunk, marks in in_lists(session_ids):
        for row in tx.fetchall(
            "SELECT session_id, first_message_index, forwarded_count, is_verified FROM"
            " key_backup_keys WHERE user_id = ? AND version = ? AND room_id = ?"
            f" AND session_id IN ({marks})",
            (user_id, version, room_id, *chunk),
        ):
            # session_data plays no part in the replacement rule: not read back.
            found[row[0]] = RoomKey(int(row[1]), int(row[2]), bool(row[3]), {})
    return found


class KeyBackupStore:
    def __init__(self, db: Database):
        self.db = db

    # --- versions --------------------------------------------------------------------------

    def create_version(self, user_id: str, algorithm: str, auth_data: dict) -> int:
        """A new version, which becomes the current one."""

        def write(tx: Tx) -> int:
            version = _lock_user(tx, user_id) + 1
            tx.execute(
                "UPDATE key_backup_users SET last_version = ? WHERE user_id = ?",
                (version, user_id),
            )
            tx.execute(
                "INSERT INTO key_backup_versions"
                " (user_id, version, algorithm, auth_data, etag, key_count)"
                " VALUES (?, ?, ?, ?, 0, 0)",
                (user_id, version, algorithm, _dumps(auth_data)),
            )
            return version

        return self.db.write(write)

    def version(self, user_id: str, version: int | None = None) -> BackupVersion | None:
        """A live version, or the current one when `version` is None."""
        return self.db.read(_version_row, user_id, version)

    def update_version(self, user_id: str, version: int, auth_data: dict) -> bool:
        """Replaces the version's auth_data; False if it is not a live version."""

        def write(tx: Tx) -> bool:
            _lock_user(tx, user_id)
            cur = tx.execute(
                "UPDATE key_backup_versions SET auth_data = ? WHERE user_id = ? AND version = ?",
                (_dumps(auth_data), user_id, version),
            )
            return cur.rowcount == 1

        return self.db.write(write)

    def delete_version(self, user_id: str, version: int) -> bool:
        """Deletes the version and its keys. True if it is gone now (deleted by this call or
        an earlier one), False if it never existed."""

        def write(tx: Tx) -> bool:
            last = _lock_user(tx, user_id)
            tx.execute(
                "DELETE FROM key_backup_keys WHERE user_id = ? AND version = ?",
                (user_id, version),
            )
            tx.execute(
                "DELETE FROM key_backup_versions WHERE user_id = ? AND version = ?",
                (user_id, version),
            )
            return 1 <= version <= last

        return self.db.write(write)

    # --- keys ------------------------------------------------------------------------------

    def put_keys(
        self,
        user_id: str,
        version: int,
        rooms: dict[str, dict[str, RoomKey]],
        keep_new: ReplaceRule,
    ) -> KeysChanged:
        """Stores each uploaded key that is new or that `keep_new` prefers to the stored one.
        Raises UnknownVersion, or NotCurrentVersion when `version` is live but not current."""

        def write(tx: Tx) -> KeysChanged:
            found = _writable(tx, user_id, version)
            rows, added = [], 0
            for room_id, sessions in rooms.items():
                stored = _stored_keys(tx, user_id, version, room_id, list(sessions))
                for session_id, key in sessions.items():
                    old = stored.get(session_id)
                    if old is None or keep_new(old, key):
                        added += old is None
                        rows.append((room_id, session_id, key))
            tx.executemany(
                f"INSERT INTO key_backup_keys (user_id, version, {_KEY_COLUMNS}, session_data)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id, version, room_id, session_id) DO UPDATE SET"
                " first_message_index = excluded.first_message_index,"
                " forwarded_count = excluded.forwarded_count,"
                " is_verified = excluded.is_verified, session_data = excluded.session_data",
                [
                    (
                        user_id,
                        version,
                        room_id,
                        session_id,
                        key.first_message_index,
                        key.forwarded_count,
                        int(key.is_verified),
                        _dumps(key.session_data),
                    )
                    for room_id, session_id, key in rows
                ],
            )
            return _changed(tx, user_id, found, added, 0, bump=bool(rows))

        return self.db.write(write)

    def delete_keys(
        self, user_id: str, version: int, room_id: str | None = None, session_id: str | None = None
    ) -> KeysChanged:
        """Deletes the version's keys: all, one room's, or one session's. Any live version,
        not only the current one. Raises UnknownVersion."""

        def write(tx: Tx) -> KeysChanged:
            found = _live(tx, user_id, version)
            where, params = _key_filter(user_id, version, room_id, session_id)
            removed = tx.execute(f"DELETE FROM key_backup_keys WHERE {where}", params).rowcount
            return _changed(tx, user_id, found, 0, removed, bump=removed > 0)

        return self.db.write(write)

    def has_version(self, user_id: str, version: int) -> bool:
        return self.version(user_id, version) is not None

    def key_pages(
        self,
        user_id: str,
        version: int,
        room_id: str | None = None,
        session_id: str | None = None,
        page: int = 500,
    ) -> Iterator[tuple[str, str, RoomKey]]:
        """The version's keys as (room_id, session_id, key), in order, read `page` rows at a
        time so that a backup of any size is never all in memory. Each page is its own read:
        a write between pages may show or not."""
        after = ("", "")
        while True:
            rows = self.db.read(_key_page, user_id, version, room_id, session_id, after, page)
            for row in rows:
                yield (
                    row[0],
                    row[1],
                    RoomKey(int(row[2]), int(row[3]), bool(row[4]), json.loads(row[5])),
                )
            if len(rows) < page:
                return
            after = (rows[-1][0], rows[-1][1])


def _key_filter(
    user_id: str, version: int, room_id: str | None, session_id: str | None
) -> tuple[str, list]:
    where, params = "user_id = ? AND version = ?", [user_id, version]
    if room_id is not None:
        where, params = where + " AND room_id = ?", params + [room_id]
    if session_id is not None:
        where, params = where + " AND session_id = ?", params + [session_id]
    return where, params


def _key_page(
    tx: Tx,
    user_id: str,
    version: int,
    room_id: str | None,
    session_id: str | None,
    after: tuple[str, str],
    page: int,
) -> list[tuple]:
    where, params = _key_filter(user_id, version, room_id, session_id)
    return tx.fetchall(
        f"SELECT {_KEY_COLUMNS}, session_data FROM key_backup_keys WHERE {where}"
        " AND (room_id > ? OR (room_id = ? AND session_id > ?))"
        " ORDER BY room_id, session_id LIMIT ?",
        (*params, after[0], after[0], after[1], page),
    )
