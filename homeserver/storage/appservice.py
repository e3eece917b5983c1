"""Application services' delivery state (0067_appservices.sql): how far each one has been
served in the events stream, and the one transaction it is owed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from homeserver.storage import streams
from homeserver.storage.database import Database
from homeserver.storage.rooms import _EVENT_COLUMNS, EVENTS_STREAM, StoredEvent, _stored


@dataclass(frozen=True)
class PendingTxn:
    txn_id: int
    up_to: int  # the stream position it takes the appservice to once answered
    body: dict


@dataclass(frozen=True)
class AppserviceRow:
    stream_position: int
    pending: PendingTxn | None
    retry_interval_ms: int


class AppserviceStore:
    def __init__(self, db: Database):
        self.db = db

    def state(self, appservice_id: str) -> AppserviceRow:
        """Its row, made on first sight at the stream's current end: a new appservice is
        sent what happens from now on, not the server's history."""

        def write(tx) -> AppserviceRow:
            tx.execute(
                "INSERT INTO appservice_state (appservice_id, stream_position) VALUES (?, ?)"
                " ON CONFLICT (appservice_id) DO NOTHING",
                (appservice_id, streams.current(tx, EVENTS_STREAM)),
            )
            row = tx.fetchone(
                "SELECT stream_position, pending_txn_id, pending_up_to, pending_body,"
                " retry_interval_ms FROM appservice_state WHERE appservice_id = ?",
                (appservice_id,),
            )
            pending = None
            if row[1] is not None:
                pending = PendingTxn(row[1], row[2], json.loads(row[3]))
            return AppserviceRow(row[0], pending, row[4])

        return self.db.write(write)

    def events_after(self, position: int, limit: int) -> tuple[list[StoredEvent], int, bool]:
        """Up to `limit` timeline events after `position`, oldest first; the stream
        position they reach (the stream's end when fewer were found); and whether the
        stream goes on past it."""

        def read(tx) -> tuple[list[StoredEvent], int, bool]:
            end = streams.current(tx, EVENTS_STREAM)
            rows = tx.fetchall(
                f"SELECT {_EVENT_COLUMNS}, e.outlier, e.soft_failed FROM events e"
                " WHERE e.stream_ordering > ? AND e.stream_ordering <= ?"
                " ORDER BY e.stream_ordering LIMIT ?",
                (position, end, limit),
            )
            more = len(rows) == limit
            reached = rows[-1][0] if more else end
            return [_stored(r) for r in rows if not r[4] and not r[5]], reached, more

        return self.db.read(read)

    def advance(self, appservice_id: str, position: int) -> None:
        """Nothing in the stream up to `position` concerns it."""
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE appservice_state SET stream_position = ?"
                " WHERE appservice_id = ? AND pending_txn_id IS NULL",
                (position, appservice_id),
            )
        )

    def begin(self, appservice_id: str, up_to: int, body: dict) -> PendingTxn:
        """Keeps `body` as its transaction, with an ID never handed out before."""

        def write(tx) -> PendingTxn:
            row = tx.fetchone(
                "UPDATE appservice_state SET next_txn_id = next_txn_id + 1,"
                " pending_txn_id = next_txn_id, pending_up_to = ?, pending_body = ?"
                " WHERE appservice_id = ? RETURNING pending_txn_id",
                (up_to, json.dumps(body, separators=(",", ":")), appservice_id),
            )
            return PendingTxn(row[0], up_to, body)

        return self.db.write(write)

    def delivered(self, appservice_id: str, txn: PendingTxn) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE appservice_state SET stream_position = ?, pending_txn_id = NULL,"
                " pending_up_to = NULL, pending_body = NULL, retry_interval_ms = 0"
                " WHERE appservice_id = ? AND pending_txn_id = ?",
                (txn.up_to, appservice_id, txn.txn_id),
            )
        )

    def set_retry(self, appservice_id: str, interval_ms: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE appservice_state SET retry_interval_ms = ? WHERE appservice_id = ?",
                (interval_ms, appservice_id),
            )
        )
