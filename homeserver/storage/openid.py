"""OpenID tokens, by their hash, with their owner and expiry (0061_openid_tokens.sql)."""

from __future__ import annotations

from homeserver.storage.database import Database


class OpenIdStore:
    def __init__(self, db: Database):
        self.db = db

    def add(self, token_hash: str, user_id: str, expires_ts: int, now_ms: int) -> None:
        """Keeps a new token; expired ones go in the same write, so the table holds at most
        an hour's worth of tokens."""

        def tx(tx):
            tx.execute("DELETE FROM openid_tokens WHERE expires_ts <= ?", (now_ms,))
            tx.execute(
                "INSERT INTO openid_tokens (token_hash, user_id, expires_ts) VALUES (?, ?, ?)",
                (token_hash, user_id, expires_ts),
            )

        self.db.write(tx)

    def owner(self, token_hash: str, now_ms: int) -> str | None:
        """The user a token still valid at `now_ms` belongs to, unless they were deactivated."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT t.user_id FROM openid_tokens t JOIN users u ON u.user_id = t.user_id"
                " WHERE t.token_hash = ? AND t.expires_ts > ? AND u.deactivated = 0",
                (token_hash, now_ms),
            )
        )
        return row[0] if row else None
