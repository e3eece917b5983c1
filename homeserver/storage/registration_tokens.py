"""Registration tokens and the UIA sessions that passed their stage
(0065_registration_tokens.sql). Every change to a token's counts is one transaction, so two
registrations racing for a token's last use cannot both take it."""

from __future__ import annotations

from dataclasses import dataclass

from homeserver.storage.database import Database

_COLUMNS = "token, uses_allowed, pending, completed, expiry_time"


@dataclass(frozen=True)
class RegistrationToken:
    token: str
    uses_allowed: int | None
    pending: int
    completed: int
    expiry_time: int | None

    def valid_at(self, now_ms: int) -> bool:
        if self.expiry_time is not None and self.expiry_time <= now_ms:
            return False
        return self.uses_allowed is None or self.pending + self.completed < self.uses_allowed

    def as_json(self) -> dict:
        return {
            "token": self.token,
            "uses_allowed": self.uses_allowed,
            "pending": self.pending,
            "completed": self.completed,
            "expiry_time": self.expiry_time,
        }


def _get(tx, token: str) -> RegistrationToken | None:
    row = tx.fetchone(f"SELECT {_COLUMNS} FROM registration_tokens WHERE token = ?", (token,))
    return RegistrationToken(*row) if row else None


def _release_stale(tx, older_than_ms: int) -> None:
    """Gives back the pending uses of sessions that lived out their time unregistered."""
    stale = tx.fetchall(
        "SELECT session, token FROM registration_token_sessions WHERE created_ts < ?",
        (older_than_ms,),
    )
    for session, token in stale:
        tx.execute("DELETE FROM registration_token_sessions WHERE session = ?", (session,))
        tx.execute(
            "UPDATE registration_tokens SET pending = pending - 1 WHERE token = ? AND pending > 0",
            (token,),
        )


class RegistrationTokenStore:
    def __init__(self, db: Database):
        self.db = db

    def get(self, token: str, stale_before_ms: int) -> RegistrationToken | None:
        """The token, once the uses of sessions older than `stale_before_ms` are given back."""

        def tx(tx):
            _release_stale(tx, stale_before_ms)
            return _get(tx, token)

        return self.db.write(tx)

    def list(self, stale_before_ms: int) -> list[RegistrationToken]:
        def tx(tx):
            _release_stale(tx, stale_before_ms)
            return tx.fetchall(f"SELECT {_COLUMNS} FROM registration_tokens ORDER BY token")

        return [RegistrationToken(*r) for r in self.db.write(tx)]

    def create(self, token: str, uses_allowed: int | None, expiry_time: int | None) -> bool:
        """False if the token exists."""

        def tx(tx):
            cur = tx.execute(
                "INSERT INTO registration_tokens (token, uses_allowed, expiry_time)"
                " VALUES (?, ?, ?) ON CONFLICT (token) DO NOTHING",
                (token, uses_allowed, expiry_time),
            )
            return cur.rowcount == 1

        return self.db.write(tx)

    def update(self, token: str, changes: dict) -> RegistrationToken | None:
        """Sets `uses_allowed` and/or `expiry_time`; None if there is no such token."""

        def tx(tx):
            for column in ("uses_allowed", "expiry_time"):
                if column in changes:
                    tx.execute(
                        f"UPDATE registration_tokens SET {column} = ? WHERE token = ?",
                        (changes[column], token),
                    )
            return _get(tx, token)

        return self.db.write(tx)

    def delete(self, token: str) -> bool:
        def tx(tx):
            tx.execute("DELETE FROM registration_token_sessions WHERE token = ?", (token,))
            return tx.execute("DELETE FROM registration_tokens WHERE token = ?", (token,)).rowcount

        return bool(self.db.write(tx))

    def session_token(self, session: str) -> str | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT token FROM registration_token_sessions WHERE session = ?", (session,)
            )
        )
        return row[0] if row else None

    def take_pending(self, session: str, token: str, now_ms: int, stale_before_ms: int) -> bool:
        """Counts the session as a pending use of the token if the token is valid now (or
        the session holds it already); False otherwise."""

        def tx(tx):
            _release_stale(tx, stale_before_ms)
            held = tx.fetchone(
                "SELECT token FROM registration_token_sessions WHERE session = ?", (session,)
            )
            if held is not None:
                return held[0] == token
            found = _get(tx, token)
            if found is None or not found.valid_at(now_ms):
                return False
            tx.execute(
                "INSERT INTO registration_token_sessions (session, token, created_ts)"
                " VALUES (?, ?, ?)",
                (session, token, now_ms),
            )
            tx.execute(
                "UPDATE registration_tokens SET pending = pending + 1 WHERE token = ?", (token,)
            )
            return True

        return self.db.write(tx)

    def complete(self, session: str) -> None:
        """The session registered: its pending use becomes a completed one."""

        def tx(tx):
            row = tx.fetchone(
                "SELECT token FROM registration_token_sessions WHERE session = ?", (session,)
            )
            if row is None:
                return
            tx.execute("DELETE FROM registration_token_sessions WHERE session = ?", (session,))
            tx.execute(
                "UPDATE registration_tokens SET pending = CASE WHEN pending > 0"
                " THEN pending - 1 ELSE 0 END, completed = completed + 1 WHERE token = ?",
                (row[0],),
            )

        self.db.write(tx)
