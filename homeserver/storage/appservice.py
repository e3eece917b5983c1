"""Application services' delivery state (0067_appservices.sql): how far each one has been
served in the events stream, the one transaction it is owed, and the lease of the instance
sending to it (0073_queue_leases)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from homeserver.storage import streams
from homeserver.storage.database import Database, in_lists
from homeserver.storage.leases import HELD_BY, LeasedTable, QueueLeases
from homeserver.storage.rooms import _EVENT_COLUMNS, EVENTS_STREAM, StoredEvent, _stored

# Each appservice's row carries its lease (storage/leases.py).
APPSERVICES = LeasedTable("appservice_state", ("appservice_id",))


@dataclass(frozen=True)
class PendingTxn:
    txn_id: int
    up_to: int  # the stream position it takes the appservice to once answered
    body: dict


# The NOTIFY of a handover (storage/streams.py's format; no stream of positions behind it).
HANDOVER = "appservice_handover"
EPHEMERAL, TO_DEVICE = "ephemeral", "to_device"


@dataclass
class Handover:
    ids: list[int] = field(default_factory=list)
    ephemeral: list = field(default_factory=list)
    to_device: list = field(default_factory=list)


class _NotKept(Exception):
    pass


def _text(value) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class AppserviceRow:
    stream_position: int
    pending: PendingTxn | None
    retry_interval_ms: int


class AppserviceStore:
    def __init__(self, db: Database):
        self.db = db

    def claim(self, leases: QueueLeases, appservice_id: str) -> tuple[AppserviceRow | None, float]:
        """Claims (or renews) the appservice's lease and reads its row, made on first sight
        at the stream's current end: a new appservice is sent what happens from now on, not
        the server's history. (None, seconds until it lapses) while another instance holds
        it."""

        def known(tx) -> None:
            tx.execute(
                "INSERT INTO appservice_state (appservice_id, stream_position) VALUES (?, ?)"
                " ON CONFLICT (appservice_id) DO NOTHING",
                (appservice_id, streams.current(tx, EVENTS_STREAM)),
            )

        claim = leases.claim(
            (appservice_id,),
            returning="stream_position, pending_txn_id, pending_up_to, pending_body,"
            " retry_interval_ms",
            before=known,
        )
        if not claim.claimed or claim.row is None:
            return None, claim.lapses_in
        position, txn_id, up_to, body, retry_interval_ms = claim.row
        pending = None if txn_id is None else PendingTxn(txn_id, up_to, json.loads(body))
        return AppserviceRow(position, pending, retry_interval_ms), 0.0

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

    def advance(self, appservice_id: str, position: int, owner: str) -> None:
        """Nothing in the stream up to `position` concerns it; written only by the lease's
        holder, and never backwards."""
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE appservice_state SET stream_position = ?"
                " WHERE appservice_id = ? AND pending_txn_id IS NULL AND stream_position < ?"
                + HELD_BY,
                (position, appservice_id, position, owner),
            )
        )

    def begin(
        self, appservice_id: str, up_to: int, body: dict, owner: str, handed: Handover
    ) -> PendingTxn | None:
        """Keeps `body` as its transaction, with an ID never handed out before, and drops
        the `handed` rows it carries; None (and nothing kept) unless `owner` holds its lease
        and it is owed no transaction."""

        def write(tx) -> PendingTxn | None:
            for chunk, marks in in_lists(handed.ids):
                tx.execute(f"DELETE FROM appservice_handover WHERE id IN ({marks})", chunk)
            row = tx.fetchone(
                "UPDATE appservice_state SET next_txn_id = next_txn_id + 1,"
                " pending_txn_id = next_txn_id, pending_up_to = ?, pending_body = ?"
                " WHERE appservice_id = ? AND pending_txn_id IS NULL"
                + HELD_BY
                + " RETURNING pending_txn_id",
                (up_to, _text(body), appservice_id, owner),
            )
            if row is None:
                raise _NotKept
            return PendingTxn(row[0], up_to, body)

        try:
            return self.db.write(write)
        except _NotKept:  # rolled back: the handed rows stay
            return None

    # --- what other instances hand to the holder --------------------------------------------

    def hand_over(self, appservice_id: str, ephemeral: list, to_device: list) -> None:
        """Typing, receipts and to-device messages for an appservice another instance holds:
        kept for the holder's next transaction (`handed_over`), which hears of them at once."""
        rows = [(appservice_id, EPHEMERAL, _text(e)) for e in ephemeral]
        rows += [(appservice_id, TO_DEVICE, _text(m)) for m in to_device]

        def write(tx) -> None:
            tx.executemany(
                "INSERT INTO appservice_handover (appservice_id, section, content)"
                " VALUES (?, ?, ?)",
                rows,
            )
            (last,) = tx.fetchone("SELECT MAX(id) FROM appservice_handover")
            streams.announce(tx, HANDOVER, last)

        if rows:
            self.db.write(write)

    def handed_over(self, appservice_id: str, limit: int) -> Handover:
        """The oldest `limit` items handed over for the appservice."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT id, section, content FROM appservice_handover WHERE appservice_id = ?"
                " ORDER BY id LIMIT ?",
                (appservice_id, limit),
            )
        )
        handed = Handover([row[0] for row in rows])
        for _, section, content in rows:
            (handed.ephemeral if section == EPHEMERAL else handed.to_device).append(
                json.loads(content)
            )
        return handed

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
