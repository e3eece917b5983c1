"""The one INSERT of a row of `events`, for the timeline (storage/rooms.py) and for history
and outliers (storage/history.py), and of the event's relation (`event_relations`, read by
storage/relations.py) in the same write."""

from __future__ import annotations

import json

from canonicaljson import encode_canonical_json

from homeserver.core.events import Event

THREAD = "m.thread"


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
    if not soft_failed and not outlier:  # neither is ever shown to clients
        insert_relation_row(tx, event, position)


def relation_of(content: dict) -> tuple[str, str] | None:
    """(rel_type, parent event ID) of an event's `m.relates_to`, if it forms a relation."""
    relates_to = content.get("m.relates_to")
    if not isinstance(relates_to, dict):
        return None
    rel_type, parent = relates_to.get("rel_type"), relates_to.get("event_id")
    if isinstance(rel_type, str) and isinstance(parent, str):
        return rel_type, parent
    return None


def insert_relation_row(tx, event: Event, position: int) -> None:
    relation = relation_of(event.content)
    if relation is None:
        return
    rel_type, parent = relation
    tx.execute(
        "INSERT INTO event_relations (event_id, relates_to_id, rel_type, type, sender, room_id,"
        " stream_ordering, origin_server_ts, thread_root) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (event_id) DO NOTHING",
        (
            event.event_id,
            parent,
            rel_type,
            event.type,
            event.sender,
            event.room_id,
            position,
            event.origin_server_ts,
            parent if rel_type == THREAD else None,
        ),
    )
