"""Inbound federation transactions already answered (the idempotency record of /send)."""

from __future__ import annotations

import json

from homeserver.storage.database import Database

# Senders retry a transaction for minutes, not days: an answer is kept this long.
KEEP_ANSWERS_MS = 24 * 3600 * 1000


class ReceivedTransactionStore:
    def __init__(self, db: Database):
        self.db = db

    def answer(self, origin: str, txn_id: str) -> dict | None:
        """The answer given to ``(origin, txn_id)``, if it was answered."""
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT response_json FROM received_transactions WHERE origin = ? AND txn_id = ?",
                (origin, txn_id),
            )
        )
        return json.loads(row[0]) if row else None

    def record(self, origin: str, txn_id: str, response: dict, now_ms: int) -> None:
        """Keeps the answer (the first one, if two were recorded at once) and prunes
        answers older than ``KEEP_ANSWERS_MS``."""

        def write(tx):
            tx.execute(
                "DELETE FROM received_transactions WHERE received_ts < ?",
                (now_ms - KEEP_ANSWERS_MS,),
            )
            tx.execute(
                "INSERT INTO received_transactions (origin, txn_id, response_json,"
                " received_ts) VALUES (?, ?, ?, ?) ON CONFLICT (origin, txn_id)"
                " DO NOTHING",
                (origin, txn_id, json.dumps(response), now_ms),
            )

        self.db.write(write)
