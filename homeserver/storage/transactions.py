"""Inbound federation transactions already answered (the idempotency record of /send), those
answered before they were applied (staged: homeserver/rooms/staging.py), and received PDUs
kept until their missing events can be fetched (held: homeserver/rooms/held.py). Staged and
held work share one cap per origin, and one on all origins' bytes together (`StagingCaps`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from homeserver.storage.database import Database

# Senders retry a transaction for minutes, not days: an answer is kept this long.
KEEP_ANSWERS_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class StagingCaps:
    """What staged and held work may take: per origin, and all origins' bytes together, so
    that a server under many names (each its own origin, each with its own cap) cannot make
    us hold more than `total_bytes`."""

    per_origin_pdus: int = 1000
    per_origin_bytes: int = 16 * 1024 * 1024
    total_bytes: int = 256 * 1024 * 1024

    def allow(
        self, tx, origin: str, pdus: int, size: int, staged_except="", held_except=""
    ) -> bool:
        """Whether `pdus` more PDUs of `size` bytes fit (the excepted: as `_load`)."""
        excepted = {"staged_except": staged_except, "held_except": held_except}
        count, held = _load(tx, origin, **excepted)
        if count + pdus > self.per_origin_pdus or held + size > self.per_origin_bytes:
            return False
        _, everyone = _load(tx, origin, everyone=True, **excepted)
        return everyone + size <= self.total_bytes


class ReceivedTransactionStore:
    def __init__(self, db: Database, instance_name: str = "main"):
        """`instance_name`: whose staged and held work this is. With several instances each
        applies and retries only what it staged or held itself, so no two apply it twice."""
        self.db = db
        self.instance = instance_name

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

    def stage(self, origin: str, txn_id: str, body: dict, caps: StagingCaps, now_ms: int) -> bool:
        """Keeps the transaction until `record`; False (nothing kept) past `caps`."""
        text = json.dumps(body, separators=(",", ":"))
        count = len(body.get("pdus", ()))

        def write(tx) -> bool:
            # Its PDUs held already (while it was applied) are in `count`.
            if not caps.allow(tx, origin, count, len(text), held_except=txn_id):
                return False
            tx.execute(
                "INSERT INTO inbound_staging (origin, txn_id, body, pdus, bytes, staged_ts,"
                " instance_name) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (origin, txn_id) DO NOTHING",
                (origin, txn_id, text, count, len(text), now_ms, self.instance),
            )
            return True

        return self.db.write(write)

    def staged(self) -> list[tuple[str, str, dict]]:
        """Every staged (origin, txn_id, body), in the order they came."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT origin, txn_id, body FROM inbound_staging WHERE instance_name = ?"
                " ORDER BY id",
                (self.instance,),
            )
        )
        return [(row[0], row[1], json.loads(row[2])) for row in rows]

    def staged_count(self) -> int:
        return self.db.read(
            lambda tx: tx.fetchone(
                "SELECT COUNT(*) FROM inbound_staging WHERE instance_name = ?", (self.instance,)
            )
        )[0]

    # --- held: PDUs whose missing events could not be fetched yet -----------------------

    def hold(self, held: HeldPdu, txn_id: str, caps: StagingCaps) -> bool:
        """Keeps `held` (once per origin and event) unless staged and held work, its
        transaction `txn_id`'s staging aside, would then pass `caps`; whether it is held now."""
        text = json.dumps(held.pdu, separators=(",", ":"))

        def write(tx) -> bool:
            if tx.fetchone(
                "SELECT 1 FROM inbound_held WHERE origin = ? AND event_id = ?",
                (held.origin, held.event_id),
            ):
                return True
            if not caps.allow(tx, held.origin, 1, len(text), staged_except=txn_id):
                return False
            tx.execute(
                "INSERT INTO inbound_held (origin, event_id, txn_id, pdu, source_ip, bytes,"
                " held_ts, next_try_ts, tries, instance_name)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (
                    held.origin,
                    held.event_id,
                    txn_id,
                    text,
                    held.source_ip,
                    len(text),
                    held.held_ms,
                    held.next_try_ms,
                    self.instance,
                ),
            )
            return True

        return self.db.write(write)

    def held_due(self, now_ms: int, limit: int) -> list[HeldPdu]:
        """Held PDUs whose next try is due, the longest due first."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT id, origin, event_id, pdu, source_ip, held_ts, next_try_ts, tries"
                " FROM inbound_held WHERE next_try_ts <= ? AND instance_name = ?"
                " ORDER BY next_try_ts, id LIMIT ?",
                (now_ms, self.instance, limit),
            )
        )
        return [HeldPdu(r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], r[0]) for r in rows]

    def held_next_try(self) -> int | None:
        """When the next held PDU is due, if any is held."""
        return self.db.read(
            lambda tx: tx.fetchone(
                "SELECT MIN(next_try_ts) FROM inbound_held WHERE instance_name = ?",
                (self.instance,),
            )
        )[0]

    def retry_held_later(self, row_id: int, tries: int, next_try_ms: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE inbound_held SET tries = ?, next_try_ts = ? WHERE id = ?",
                (tries, next_try_ms, row_id),
            )
        )

    def postpone_held(self, origin: str, until_ms: int) -> None:
        """The origin's held PDUs due before `until_ms` wait until then."""
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE inbound_held SET next_try_ts = ?"
                " WHERE origin = ? AND next_try_ts < ? AND instance_name = ?",
                (until_ms, origin, until_ms, self.instance),
            )
        )

    def release_held(self, row_id: int) -> None:
        self.db.write(lambda tx: tx.execute("DELETE FROM inbound_held WHERE id = ?", (row_id,)))

    def held_count(self) -> int:
        return self.db.read(
            lambda tx: tx.fetchone(
                "SELECT COUNT(*) FROM inbound_held WHERE instance_name = ?", (self.instance,)
            )
        )[0]


@dataclass(frozen=True)
class HeldPdu:
    """A received PDU kept until its missing events are fetched; `row_id` once stored."""

    origin: str
    event_id: str
    pdu: dict
    source_ip: str | None
    held_ms: int
    next_try_ms: int
    tries: int = 0
    row_id: int = 0


def _load(
    tx, origin: str, staged_except: str, held_except: str, everyone: bool = False
) -> tuple[int, int]:
    """PDUs and bytes of the origin's (or `everyone`'s) staged transactions and held PDUs;
    the origin's transaction staged and held from is counted once (its staged row, or its
    held PDUs)."""
    scope = "" if everyone else " AND origin = ?"
    staged, staged_bytes = tx.fetchone(
        "SELECT COALESCE(SUM(pdus), 0), COALESCE(SUM(bytes), 0) FROM inbound_staging"
        " WHERE NOT (origin = ? AND txn_id = ?)" + scope,
        (origin, staged_except) + (() if everyone else (origin,)),
    )
    held, held_bytes = tx.fetchone(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM inbound_held"
        " WHERE NOT (origin = ? AND txn_id = ?)" + scope,
        (origin, held_except) + (() if everyone else (origin,)),
    )
    return int(staged) + int(held), int(staged_bytes) + int(held_bytes)
