"""The federation sender's queue and per-destination state (0010_federation_outbox.sql).

`queue_pdus` runs inside the write transaction that stores the events (RoomStore's
`persist_events`), so an event is queued exactly when it is stored. `OutboxStore` is what the
sender (homeserver/federation/sender.py) reads and clears; PDUs are handed to it as the JSON
stored in `events`, opaque to it.
"""

from __future__ import annotations

from typing import Iterable


def queue_pdus(tx, destinations: Iterable[str], stored: Iterable[tuple[int, str, str]]) -> None:
    """Queues every (stream_ordering, event_id, room_id) for every destination."""
    rows = [
        (destination, ordering, event_id, room_id)
        for destination in sorted(set(destinations))
        for ordering, event_id, room_id in stored
    ]
    if rows:
        tx.executemany(
            "INSERT INTO federation_outbox (destination, stream_ordering, event_id, room_id)"
            " VALUES (?, ?, ?, ?)",
            rows,
        )
