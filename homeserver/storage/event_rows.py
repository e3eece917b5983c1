"""The one INSERT of a row of `events`, for the timeline (storage/rooms.py) and for history
and outliers (storage/history.py)."""

from __future__ import annotations

import json

from canonicaljson import encode_canonical_json

from homeserver.core.events import Event


def insert_event_row(
    tx,
    event: Event,
    position: int,
    unsigned: dict | None = None,
    soft_failed: bool = False,
    outlier: bool = False,
) -> None:
    tx.execute(
        "INSERT INTO events (stream_ordering, event_id, room_id, type, state_key, sender,"
        " depth, origin_server_ts, membership, json, unsigned, soft_failed, outlier)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            position,
            event.event_id,
            event.room_id,
            event.type,
            event.state_key,
            event.sender,
            event.depth,
            event.origin_server_ts,
            event.membership,
            encode_canonical_json(event.pdu).decode("utf-8"),
            json.dumps(unsigned) if unsigned else None,
            int(soft_failed),
            int(outlier),
        ),
    )
