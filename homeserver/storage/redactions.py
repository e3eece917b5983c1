"""Redactions: which redaction names which event, and which events have been redacted.

Applying a redaction rewrites the target's stored PDU to its redacted form, in the same
transaction as the redaction (or as the target, when the redaction came first), so every
reader (client APIs, /sync, federation) serves the redacted event without a check of its
own. The redacted form is computed by the room layer (the room version's algorithm) and
handed in; this store only knows rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from canonicaljson import encode_canonical_json

from homeserver.core.events import Event
from homeserver.storage import room_stats, user_directory
from homeserver.storage.database import Database, in_lists
from homeserver.storage.parsed_events import PARSED


@dataclass(frozen=True)
class PendingRedaction:
    """A recorded redaction whose target is stored and not yet redacted."""

    redaction: Event
    by_power: bool
    target: Event
    target_unsigned: dict


SEARCH_ROW_KEY = {"sqlite": "rowid", "postgres": "stream_ordering"}


class RedactionStore:
    """Reads and writes inside the transaction that persists events (`tx`), and reads."""

    def __init__(self, db: Database):
        self.db = db

    @staticmethod
    def room_version(tx, room_id: str) -> str:
        return tx.fetchone("SELECT room_version FROM rooms WHERE room_id = ?", (room_id,))[0]

    @staticmethod
    def event_pdus(tx, room_id: str, event_ids: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for chunk, marks in in_lists(list(dict.fromkeys(event_ids))):
            for event_id, pdu, room in tx.fetchall(
                f"SELECT event_id, json, room_id FROM events WHERE event_id IN ({marks})", chunk
            ):
                if room == room_id:  # by ID alone: see storage/rooms.py, events_in_room
                    found[event_id] = json.loads(pdu)
        return found

    @staticmethod
    def record(tx, redaction: Event, redacts: str, by_power: bool) -> None:
        tx.execute(
            "INSERT INTO redactions (redaction_id, redacts, room_id, sender, by_power)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (redaction_id) DO NOTHING",
            (redaction.event_id, redacts, redaction.room_id, redaction.sender, by_power),
        )

    @staticmethod
    def names_any(tx, room_id: str, targets: list[str]) -> bool:
        """Whether a recorded redaction in `room_id` names one of `targets` (what `pending`
        finds is among these)."""
        for chunk, marks in in_lists(list(dict.fromkeys(targets))):
            sql = f"SELECT 1 FROM redactions WHERE room_id = ? AND redacts IN ({marks}) LIMIT 1"
            if tx.fetchone(sql, (room_id, *chunk)) is not None:
                return True
        return False

    @staticmethod
    def pending(tx, room_id: str, targets: list[str]) -> list[PendingRedaction]:
        """Redactions of `targets` that are stored in `room_id` and not redacted yet, oldest
        redaction first. A redaction names an event of its own room only."""
        found: list[PendingRedaction] = []
        for chunk, marks in in_lists(list(dict.fromkeys(targets))):
            rows = tx.fetchall(
                "SELECT r.redaction_id, re.json, r.by_power, e.event_id, e.json, e.unsigned"
                " FROM redactions r JOIN events e ON e.event_id = r.redacts"
                " JOIN events re ON re.event_id = r.redaction_id"
                f" WHERE r.room_id = ? AND e.room_id = ? AND r.redacts IN ({marks})"
                " AND NOT EXISTS (SELECT 1 FROM redacted_events x WHERE x.event_id = e.event_id)"
                " ORDER BY re.stream_ordering",
                (room_id, room_id, *chunk),
            )
            found += [
                PendingRedaction(
                    Event(r[0], json.loads(r[1])),
                    bool(r[2]),
                    Event(r[3], json.loads(r[4])),
                    json.loads(r[5]) if r[5] else {},
                )
                for r in rows
            ]
        return found

    @classmethod
    def apply(
        cls, tx, target: Event, redacted_pdu: dict, unsigned: dict, redaction_id: str, now_ms: int
    ) -> None:
        """Stores `target` as redacted by `redaction_id`: its PDU becomes `redacted_pdu`, its
        unsigned `unsigned`. A state event that replaced it shows the redacted content as its
        prev_content, and room stats follow a redacted current state event."""
        tx.execute(
            "INSERT INTO redacted_events (event_id, redacted_by, room_id, redacted_ts)"
            " VALUES (?, ?, ?, ?)",
            (target.event_id, redaction_id, target.room_id, now_ms),
        )
        PARSED.drop(target.event_id)  # the text check would catch it too; this frees it now
        # A redacted event's relation stops counting (its m.relates_to is redacted away).
        tx.execute("DELETE FROM event_relations WHERE event_id = ?", (target.event_id,))
        # Nor may its text be found (the search row is keyed by the event's position).
        tx.execute(
            f"DELETE FROM event_search WHERE {SEARCH_ROW_KEY[tx.dialect]} ="
            " (SELECT stream_ordering FROM events WHERE event_id = ?)",
            (target.event_id,),
        )
        tx.execute(
            "UPDATE events SET json = ?, unsigned = ? WHERE event_id = ?",
            (
                encode_canonical_json(redacted_pdu).decode("utf-8"),
                json.dumps(unsigned),
                target.event_id,
            ),
        )
        if target.state_key is not None:
            cls._update_state_of(tx, target, Event(target.event_id, redacted_pdu))

    @staticmethod
    def _update_state_of(tx, target: Event, redacted: Event) -> None:
        row = tx.fetchone(
            "SELECT e.stream_ordering FROM current_state c JOIN events e"
            " ON e.event_id = c.event_id WHERE c.room_id = ? AND c.type = ? AND c.state_key = ?"
            " AND c.event_id = ?",
            (target.room_id, target.type, target.state_key, target.event_id),
        )
        if row is not None:
            # Membership survives redaction, so only the room's named columns can change.
            room_stats.update_stats(tx, redacted, redacted.membership, row[0])
            user_directory.index_member(tx, redacted)  # a redacted join shows no name
        for event_id, unsigned in tx.fetchall(
            "SELECT event_id, unsigned FROM events WHERE room_id = ? AND type = ?"
            " AND state_key = ? AND unsigned IS NOT NULL",
            (target.room_id, target.type, target.state_key),
        ):
            fields = json.loads(unsigned)
            if fields.get("replaces_state") == target.event_id and "prev_content" in fields:
                fields["prev_content"] = redacted.content
                tx.execute(
                    "UPDATE events SET unsigned = ? WHERE event_id = ?",
                    (json.dumps(fields), event_id),
                )

    def redacted_by(self, event_id: str) -> str | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT redacted_by FROM redacted_events WHERE event_id = ?", (event_id,)
            )
        )
        return row[0] if row else None
