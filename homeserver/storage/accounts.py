"""Users, devices and access tokens. Only hashes of passwords and tokens are stored."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.cluster_memory import revoke_tokens
from homeserver.storage.database import Database
from homeserver.storage.e2ee import delete_device_rows
from homeserver.storage.user_directory import index_local_user


@dataclass(frozen=True)
class UserRow:
    user_id: str
    password_hash: str | None
    admin: bool
    deactivated: bool


@dataclass(frozen=True)
class UserListing:
    user_id: str
    admin: bool
    deactivated: bool
    created_ts: int
    displayname_json: str | None  # the profile field as stored: JSON text


@dataclass(frozen=True)
class TokenOwner:
    user_id: str
    device_id: str
    admin: bool


class AccountStore:
    def __init__(self, db: Database):
        self.db = db

    def create_user(
        self, user_id: str, password_hash: str | None, admin: bool, now_ms: int
    ) -> bool:
        """Inserts the user; False if the ID is taken."""

        def tx(tx):
            cur = tx.execute(
                "INSERT INTO users (user_id, password_hash, admin, created_ts) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (user_id) DO NOTHING",
                (user_id, password_hash, int(admin), now_ms),
            )
            if cur.rowcount != 1:
                return False
            index_local_user(tx, user_id)  # found by user ID before any profile is set
            return True

        return self.db.write(tx)

    def get_user(self, user_id: str) -> UserRow | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT user_id, password_hash, admin, deactivated FROM users WHERE user_id = ?",
                (user_id,),
            )
        )
        return UserRow(row[0], row[1], bool(row[2]), bool(row[3])) if row else None

    def set_password_hash(self, user_id: str, password_hash: str) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE users SET password_hash = ? WHERE user_id = ?", (password_hash, user_id)
            )
        )

    def mark_deactivated(self, user_id: str) -> None:
        """The row stays, so the name is never registered again; the password hash stays
        too, so that a login with it is told the account is deactivated."""

        def write(tx) -> None:
            tx.execute("UPDATE users SET deactivated = 1 WHERE user_id = ?", (user_id,))
            revoke_tokens(tx, user_id, None)

        self.db.write(write)

    def count_users(self) -> int:
        return self.db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM users"))[0]

    def add_device_token(
        self, user_id: str, device_id: str, display_name: str | None, token_hash: str, now_ms: int
    ) -> None:
        """Records a login: the device (kept if it exists) and a new token for it.

        Logging in again with an existing device_id replaces that device's old tokens, as the
        spec asks: a device has one current session.
        """

        def tx(tx):
            tx.execute(
                "INSERT INTO devices (user_id, device_id, display_name, created_ts, last_seen_ts)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, device_id) DO UPDATE"
                " SET last_seen_ts = excluded.last_seen_ts",
                (user_id, device_id, display_name, now_ms, now_ms),
            )
            if tx.fetchall(
                "DELETE FROM access_tokens WHERE user_id = ? AND device_id = ? RETURNING 1",
                (user_id, device_id),
            ):
                revoke_tokens(tx, user_id, device_id)
            tx.execute(
                "INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts)"
                " VALUES (?, ?, ?, ?)",
                (token_hash, user_id, device_id, now_ms),
            )

        self.db.write(tx)

    def token_owner(self, token_hash: str) -> TokenOwner | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT t.user_id, t.device_id, u.admin FROM access_tokens t"
                " JOIN users u ON u.user_id = t.user_id"
                " WHERE t.token_hash = ? AND u.deactivated = 0",
                (token_hash,),
            )
        )
        return TokenOwner(row[0], row[1], bool(row[2])) if row else None

    def remove_devices(self, user_id: str, device_ids: list[str]) -> bool:
        """Removes the devices, their tokens, keys and pending to-device messages; True if
        any had device keys (a device list change others must hear of)."""

        def tx(tx):
            had_keys = False
            for device_id in device_ids:
                tx.execute(
                    "DELETE FROM access_tokens WHERE user_id = ? AND device_id = ?",
                    (user_id, device_id),
                )
                revoke_tokens(tx, user_id, device_id)
                tx.execute(
                    "DELETE FROM devices WHERE user_id = ? AND device_id = ?",
                    (user_id, device_id),
                )
                had_keys = delete_device_rows(tx, user_id, device_id) or had_keys
            return had_keys

        return self.db.write(tx)

    def remove_device(self, user_id: str, device_id: str) -> bool:
        return self.remove_devices(user_id, [device_id])

    def device_ids(self, user_id: str) -> list[str]:
        rows = self.db.read(
            lambda tx: tx.fetchall("SELECT device_id FROM devices WHERE user_id = ?", (user_id,))
        )
        return [r[0] for r in rows]

    def remove_all_devices(self, user_id: str) -> bool:
        return self.remove_devices(user_id, self.device_ids(user_id))

    # --- for server admins -------------------------------------------------------------

    def list_users(
        self, offset: int, limit: int, name: str | None, deactivated: bool
    ) -> tuple[list[UserListing], int]:
        """A page of users by user ID, and how many match in all. `name` matches part of
        the user ID or the display name, case-insensitively; deactivated users only when
        asked for."""
        where, params = [], []
        if not deactivated:
            where.append("u.deactivated = 0")
        if name:
            where.append("(LOWER(u.user_id) LIKE ? ESCAPE '!' OR LOWER(p.value) LIKE ? ESCAPE '!')")
            pattern = "%" + _like_escaped(name.lower()) + "%"
            params += [pattern, pattern]
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        base = (
            " FROM users u LEFT JOIN profile_fields p"
            " ON p.user_id = u.user_id AND p.field = 'displayname'" + clause
        )

        def tx(tx):
            total = tx.fetchone("SELECT COUNT(*)" + base, params)[0]
            rows = tx.fetchall(
                "SELECT u.user_id, u.admin, u.deactivated, u.created_ts, p.value"
                + base
                + " ORDER BY u.user_id LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            return rows, total

        rows, total = self.db.read(tx)
        return [UserListing(r[0], bool(r[1]), bool(r[2]), r[3], r[4]) for r in rows], total

    def created_ts(self, user_id: str) -> int | None:
        row = self.db.read(
            lambda tx: tx.fetchone("SELECT created_ts FROM users WHERE user_id = ?", (user_id,))
        )
        return row[0] if row else None

    def set_admin(self, user_id: str, admin: bool) -> None:
        """Every cached owner of the user's tokens carries the flag: they are forgotten."""

        def write(tx) -> None:
            tx.execute("UPDATE users SET admin = ? WHERE user_id = ?", (int(admin), user_id))
            revoke_tokens(tx, user_id, None)

        self.db.write(write)

    def reactivate(self, user_id: str) -> None:
        """An admin's undoing of `mark_deactivated` (with a new password set first)."""
        self.db.write(
            lambda tx: tx.execute("UPDATE users SET deactivated = 0 WHERE user_id = ?", (user_id,))
        )

    def devices(self, user_id: str) -> list[tuple[str, str | None, int | None]]:
        """(device_id, display_name, last_seen_ts) of each of the user's devices."""
        return self.db.read(
            lambda tx: tx.fetchall(
                "SELECT device_id, display_name, last_seen_ts FROM devices WHERE user_id = ?"
                " ORDER BY device_id",
                (user_id,),
            )
        )


def _like_escaped(text: str) -> str:
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")
