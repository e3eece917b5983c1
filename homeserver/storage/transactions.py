"""Inbound federation transactions already answered (the idempotency record of /send), and
those answered before they were applied (staged: homeserver/rooms/staging.py)."""

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
            # Applied now: no longer staged (the same write, so it is never both or neither).
            tx.execute(
                "DELETE FROM inbound_staging WHERE origin = ? AND txn_id = ?", (origin, txn_id)
            )
            tx.execute(
                "INSERT INTO received_transactions (origin, txn_id, response_json,"
                " received_ts) VALUES (?, ?, ?, ?) ON CONFLICT (origin, txn_id)"
                " DO NOTHING",
                (origin, txn_id, json.dumps(response), now_ms),
            )

        self.db.write(write)

    # --- staged: answered 200, applied in the background ---------------------------------

    def stage(
        self, origin: str, txn_id: str, body: dict, max_pdus: int, max_bytes: int, now_ms: int
    ) -> bool:
        """Keeps the transaction until `record`; False (nothing kept) if the origin's staged
        transactions would then hold more than `max_pdus` PDUs or `max_bytes`."""
        text = json.dumps(body, separators=(",", ":"))
        count = len(body.get("pdus", ()))

        def write(tx) -> bool:
            held, size = tx.fetchone(
                "SELECT COALESCE(SUM(pdus), 0), COALESCE(SUM(bytes), 0) FROM inbound_staging"
                " WHERE origin = ?",
                (origin,),
            )
            if held + count > max_pdus or size + len(text) > max_bytes:
                return False
            tx.execute(
                "INSERT INTO inbound_staging (origin, txn_id, body, pdus, bytes, staged_ts)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (origin, txn_id) DO NOTHING",
                (origin, txn_id, text, count, len(text), now_ms),
            )
            return True

        return self.db.write(write)

    def staged(self) -> list[tuple[str, str, dict]]:
        """Every staged (origin, txn_id, body), in the order they came."""
        rows = self.db.read(
            lambda tx: tx.fetchall("SELECT origin, txn_id, body FROM inbound_staging ORDER BY id")
        )
        return [(row[0], row[1], json.loads(row[2])) for row in rows]

    def staged_count(self) -> int:
        return self.db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM inbound_staging"))[0]
