"""The federation sender's queues and per-destination state (0010_federation_outbox.sql,
0029_federation_edu_outbox.sql, 0076_unanswered_transactions.sql).

`queue_pdus` runs inside the write transaction that stores the events (RoomStore's
`persist_events`), so an event is queued exactly when it is stored; `queue_edus` likewise
inside the write that made a durable EDU (a to-device message, a device list update).
`OutboxStore` is what the sender (homeserver/federation/sender.py) reads and clears; PDUs are
handed to it as the JSON stored in `events`, opaque to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Iterable

from homeserver.storage.database import Database, in_lists
from homeserver.storage.leases import Claim, LeasedTable, QueueLeases

# The LISTEN/NOTIFY channel on which an instance asks the holder of a destination's lease
# to send what it handed over: "<holder> <destination>" (storage/announcements.py). Not
# the streams' channel, as appservices' handovers are: the destination is in the payload,
# so the holder reads nothing to learn whom to send to.
OUTBOX_CHANNEL = "weir_outbox"


def queue_pdus(tx, destinations: Iterable[str], event_ids: Iterable[str]) -> None:
    """Queues every event, stored earlier in the same transaction, for every destination."""
    rows = [(d, event_id) for d in sorted(set(destinations)) for event_id in event_ids]
    if rows:
        # The position is read from the event's row: it may not be known here yet
        # (storage/streams.py, `Pending`).
        tx.executemany(
            "INSERT INTO federation_outbox (destination, stream_ordering, event_id, room_id)"
            " SELECT ?, stream_ordering, event_id, room_id FROM events WHERE event_id = ?",
            rows,
        )


def queue_edus(
    tx, edus: Iterable[tuple[str, str, dict]], max_backlog: int
) -> list[tuple[str, str]]:
    """Queues (destination, edu_type, content) EDUs, in order. A destination already owed
    `max_backlog` EDUs gets no more: returns (destination, edu_type) of each left out."""
    backlog: dict[str, int] = {}
    rows, left_out = [], []
    for destination, edu_type, content in edus:
        if destination not in backlog:
            backlog[destination] = tx.fetchone(
                "SELECT COUNT(*) FROM federation_edu_outbox WHERE destination = ?",
                (destination,),
            )[0]
        if backlog[destination] >= max_backlog:
            left_out.append((destination, edu_type))
            continue
        backlog[destination] += 1
        rows.append((destination, edu_type, _text(content)))
    if rows:
        tx.executemany(
            "INSERT INTO federation_edu_outbox (destination, edu_type, content) VALUES (?, ?, ?)",
            rows,
        )
    return left_out


# Each destination's row carries its lease (storage/leases.py).
DESTINATIONS = LeasedTable("federation_destinations", ("destination",))


@dataclass(frozen=True)
class DestinationRow:
    destination: str
    retry_interval_ms: int  # 0: the last attempt succeeded (or none was made yet)
    retry_at_ms: int


class OutboxStore:
    def __init__(self, db: Database):
        self.db = db

    # --- the queue ----------------------------------------------------------------------

    def pending(self, destination: str, limit: int) -> list[tuple[int, dict]]:
        """The oldest `limit` PDUs owed to `destination`: (stream_ordering, pdu)."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT o.stream_ordering, e.json FROM federation_outbox o"
                " JOIN events e ON e.stream_ordering = o.stream_ordering"
                " WHERE o.destination = ? ORDER BY o.stream_ordering LIMIT ?",
                (destination, limit),
            )
        )
        return [(row[0], json.loads(row[1])) for row in rows]

    def delivered(
        self, destination: str, txn_id: int, orderings: list[int], edu_ids: list[int]
    ) -> None:
        """Removes what `destination` acknowledged, PDUs and durable EDUs, with the record
        of the transaction that carried them, in one write: none of it goes again."""

        def write(tx):
            _answered(tx, destination, txn_id)
            _delete_edus(tx, destination, edu_ids)
            for chunk, marks in in_lists(orderings):
                tx.execute(
                    "DELETE FROM federation_outbox WHERE destination = ?"
                    f" AND stream_ordering IN ({marks})",
                    [destination, *chunk],
                )

        self.db.write(write)

    def trim_rooms(self, destination: str, keep: int) -> int:
        """Catch-up past a limit: of each room's PDUs owed to `destination`, keeps only the
        newest `keep` (the peer fetches the gap from their prev_events). Returns how many
        were dropped."""

        def write(tx) -> int:
            crowded = tx.fetchall(
                "SELECT room_id FROM federation_outbox WHERE destination = ?"
                " GROUP BY room_id HAVING COUNT(*) > ?",
                (destination, keep),
            )
            dropped = 0
            for (room_id,) in crowded:
                oldest_kept = tx.fetchone(
                    "SELECT stream_ordering FROM federation_outbox"
                    " WHERE destination = ? AND room_id = ?"
                    " ORDER BY stream_ordering DESC LIMIT 1 OFFSET ?",
                    (destination, room_id, keep - 1),
                )[0]
                before = tx.fetchone(
                    "SELECT COUNT(*) FROM federation_outbox WHERE destination = ?"
                    " AND room_id = ? AND stream_ordering < ?",
                    (destination, room_id, oldest_kept),
                )[0]
                tx.execute(
                    "DELETE FROM federation_outbox WHERE destination = ? AND room_id = ?"
                    " AND stream_ordering < ?",
                    (destination, room_id, oldest_kept),
                )
                dropped += before
            return dropped

        return self.db.write(write)

    def destinations_with_pending(self) -> list[str]:
        """Every destination owed a PDU or a durable EDU."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT destination FROM federation_outbox"
                " UNION SELECT destination FROM federation_edu_outbox"
            )
        )
        return sorted(row[0] for row in rows)

    def depth(self) -> int:
        """PDU deliveries still owed, all destinations together."""
        return self.db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM federation_outbox"))[0]

    # --- durable EDUs ------------------------------------------------------------------------

    def queue_edus(
        self, edus: list[tuple[str, str, dict]], max_backlog: int
    ) -> list[tuple[str, str]]:
        """`queue_edus` in a write of its own: for an EDU no other write makes."""
        return self.db.write(lambda tx: queue_edus(tx, edus, max_backlog))

    def pending_edus(self, destination: str, limit: int) -> list[tuple[int, dict]]:
        """The oldest `limit` durable EDUs owed to `destination`: (id, edu)."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT id, edu_type, content FROM federation_edu_outbox"
                " WHERE destination = ? ORDER BY id LIMIT ?",
                (destination, limit),
            )
        )
        return [_edu(row) for row in rows]

    def edus_refused(self, destination: str, ids: list[int], max_refusals: int) -> list[str]:
        """`destination` refused a transaction holding these EDUs: each counts a refusal,
        and those refused `max_refusals` times go. Returns the edu_type of each that went."""

        def write(tx) -> list[str]:
            gone = []
            for chunk, marks in in_lists(ids):
                tx.execute(
                    "UPDATE federation_edu_outbox SET refusals = refusals + 1"
                    f" WHERE destination = ? AND id IN ({marks})",
                    [destination, *chunk],
                )
                gone += tx.fetchall(
                    "SELECT id, edu_type FROM federation_edu_outbox"
                    f" WHERE destination = ? AND id IN ({marks}) AND refusals >= ?",
                    [destination, *chunk, max_refusals],
                )
            _delete_edus(tx, destination, [row[0] for row in gone])
            return [row[1] for row in gone]

        return self.db.write(write) if ids else []

    def edu_depth(self) -> int:
        """Durable EDUs still owed, all destinations together."""
        return self.db.read(lambda tx: tx.fetchone("SELECT COUNT(*) FROM federation_edu_outbox"))[0]

    # --- per destination ------------------------------------------------------------------

    def begin_transaction(
        self, destination: str, leases: QueueLeases, pdus: list[int], edus: list[int]
    ) -> Claim:
        """Claims (or renews) `destination`'s lease and begins the transaction to send it:
        the claim's row is (txn_id, holder, pdu orderings, durable EDU ids). That is a new
        transaction, with an ID never handed out before, carrying `pdus` and `edus`, unless
        the row records one begun and never answered (its sender died in the call): then
        that one, to be sent again as it was. Not claimed while another instance holds it."""

        def known(tx) -> None:
            tx.execute(
                "INSERT INTO federation_destinations (destination) VALUES (?)"
                " ON CONFLICT (destination) DO NOTHING",
                (destination,),
            )

        # The SET expressions all read the row as it was; the pending_ columns are NULL
        # together, when nothing is unanswered.
        claim = leases.claim(
            (destination,),
            returning="pending_txn_id, lease_owner, pending_pdus, pending_edus",
            also_set="next_txn_id = CASE WHEN pending_txn_id IS NULL"
            " THEN next_txn_id + 1 ELSE next_txn_id END,"
            " pending_txn_id = COALESCE(pending_txn_id, next_txn_id),"
            " pending_pdus = COALESCE(pending_pdus, ?), pending_edus = COALESCE(pending_edus, ?)",
            also_params=(_text(pdus), _text(edus)),
            before=known,
        )
        if not claim.claimed or claim.row is None:
            return claim
        txn_id, holder, carried_pdus, carried_edus = claim.row
        return replace(
            claim, row=(txn_id, holder, json.loads(carried_pdus), json.loads(carried_edus))
        )

    def carried(
        self, destination: str, pdus: list[int], edus: list[int]
    ) -> tuple[list[tuple[int, dict]], list[tuple[int, dict]]]:
        """What an unanswered transaction carried, to send it again: its PDUs (stream
        ordering, pdu), from the events themselves (a catch-up may have dropped them from
        the outbox since), and those of its durable EDUs (id, edu) still owed."""

        def read(tx) -> tuple[list, list]:
            found_pdus, found_edus = [], []
            for chunk, marks in in_lists(pdus):
                found_pdus += tx.fetchall(
                    f"SELECT stream_ordering, json FROM events WHERE stream_ordering IN ({marks})",
                    chunk,
                )
            for chunk, marks in in_lists(edus):
                found_edus += tx.fetchall(
                    "SELECT id, edu_type, content FROM federation_edu_outbox"
                    f" WHERE destination = ? AND id IN ({marks})",
                    [destination, *chunk],
                )
            return found_pdus, found_edus

        found_pdus, found_edus = self.db.read(read)
        return (
            sorted((row[0], json.loads(row[1])) for row in found_pdus),
            sorted(_edu(row) for row in found_edus),
        )

    def abandoned(self, destination: str, txn_id: int) -> None:
        """The transaction failed: what it carried goes again in a new one."""
        self.db.write(lambda tx: _answered(tx, destination, txn_id))

    def hand_over(
        self, destination: str, holder: str | None, edus: list[dict], max_backlog: int
    ) -> list[tuple[str, str]]:
        """`holder` holds `destination`'s lease: our ephemeral `edus` for it (typing,
        receipts: in our memory only) join the durable EDU outbox it sends from, and it is
        told at this write's commit to send what we owe it, those and any PDUs or durable
        EDUs we queued. Returns (destination, edu_type) of each EDU left out (`queue_edus`)."""

        def write(tx) -> list[tuple[str, str]]:
            queued = [(destination, edu["edu_type"], edu["content"]) for edu in edus]
            left_out = queue_edus(tx, queued, max_backlog)
            if tx.announce_as is not None and holder:  # other instances listen (PostgreSQL)
                tx.execute("SELECT pg_notify(?, ?)", (OUTBOX_CHANNEL, f"{holder} {destination}"))
            return left_out

        return self.db.write(write)

    def destinations_between(self, after: int, upto: int) -> list[str]:
        """Destinations owed events stored at stream positions in (after, upto]: those
        another instance stored, when its NOTIFY arrives."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT DISTINCT destination FROM federation_outbox"
                " WHERE stream_ordering > ? AND stream_ordering <= ?",
                (after, upto),
            )
        )
        return [row[0] for row in rows]

    def set_retry(self, destination: str, interval_ms: int, retry_at_ms: int) -> None:
        self.db.write(
            lambda tx: tx.execute(
                "UPDATE federation_destinations SET retry_interval_ms = ?, retry_at_ms = ?"
                " WHERE destination = ?",
                (interval_ms, retry_at_ms, destination),
            )
        )

    def destination_rows(self) -> list[DestinationRow]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                "SELECT destination, retry_interval_ms, retry_at_ms FROM federation_destinations"
            )
        )
        return [DestinationRow(*row) for row in rows]


def _edu(row) -> tuple[int, dict]:
    return row[0], {"edu_type": row[1], "content": json.loads(row[2])}


def _text(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _answered(tx, destination: str, txn_id: int) -> None:
    tx.execute(
        "UPDATE federation_destinations SET pending_txn_id = NULL, pending_pdus = NULL,"
        " pending_edus = NULL WHERE destination = ? AND pending_txn_id = ?",
        (destination, txn_id),
    )


def _delete_edus(tx, destination: str, ids: list[int]) -> None:
    for chunk, marks in in_lists(ids):
        tx.execute(
            f"DELETE FROM federation_edu_outbox WHERE destination = ? AND id IN ({marks})",
            [destination, *chunk],
        )
