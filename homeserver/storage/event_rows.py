"""The one INSERT of a row of `events`, for the timeline (storage/rooms.py) and for history
and outliers (storage/history.py), and of the event's relation (`event_relations`, read by
storage/relations.py) and full-text search row (`event_search`, read by storage/search.py)
in the same write."""

from __future__ import annotations

import json

from canonicaljson import encode_canonical_json

from homeserver.core.events import Event
from homeserver.storage.streams import Position, sql

THREAD = "m.thread"


def insert_event_row(
    tx,
    event: Event,
    position: Position,
    unsigned: dict | None = None,
    soft_failed: bool = False,
    outlier: bool = False,
) -> None:
    at, at_params = sql(position)
    tx.execute(
        "INSERT INTO events (stream_ordering, event_id, room_id, type, state_key, sender,"
        " depth, origin_server_ts, membership, json, unsigned, soft_failed, outlier)"
        f" VALUES ({at}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            *at_params,
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
        insert_search_row(tx, event, position)


def relation_of(content: dict) -> tuple[str, str] | None:
    """(rel_type, parent event ID) of an event's `m.relates_to`, if it forms a relation."""
    relates_to = content.get("m.relates_to")
    if not isinstance(relates_to, dict):
        return None
    rel_type, parent = relates_to.get("rel_type"), relates_to.get("event_id")
    if isinstance(rel_type, str) and isinstance(parent, str):
        return rel_type, parent
    return None


def insert_relation_row(tx, event: Event, position: Position) -> None:
    relation = relation_of(event.content)
    if relation is None:
        return
    rel_type, parent = relation
    at, at_params = sql(position)
    tx.execute(
        "INSERT INTO event_relations (event_id, relates_to_id, rel_type, type, sender, room_id,"
        f" stream_ordering, origin_server_ts, thread_root) VALUES (?, ?, ?, ?, ?, ?, {at}, ?, ?)"
        " ON CONFLICT (event_id) DO NOTHING",
        (
            event.event_id,
            parent,
            rel_type,
            event.type,
            event.sender,
            event.room_id,
            *at_params,
            event.origin_server_ts,
            parent if rel_type == THREAD else None,
        ),
    )


# The event types whose text is searchable, and the content key each is searched by (the
# spec's `keys`: content.body, content.name, content.topic). m.room.encrypted is not here.
SEARCHED_KEYS = {
    "m.room.message": "content.body",
    "m.room.name": "content.name",
    "m.room.topic": "content.topic",
}


def searchable_text(event: Event) -> tuple[str, str] | None:
    """(key, text) of an event's searchable string, if it has one."""
    key = SEARCHED_KEYS.get(event.type)
    if key is None:
        return None
    text = event.content.get(key.removeprefix("content."))
    return (key, text) if isinstance(text, str) and text else None


def insert_search_row(tx, event: Event, position: Position) -> None:
    found = searchable_text(event)
    if found is None:
        return
    key, text = found
    at, at_params = sql(position)
    if tx.dialect == "postgres":
        tx.execute(
            "INSERT INTO event_search (stream_ordering, event_id, room_id, key, vector)"
            f" VALUES ({at}, ?, ?, ?, to_tsvector('english', ?)) ON CONFLICT DO NOTHING",
            (*at_params, event.event_id, event.room_id, key, text),
        )
    else:
        tx.execute(
            "INSERT INTO event_search (rowid, event_id, room_id, key, value)"
            f" VALUES ({at}, ?, ?, ?, ?)",
            (*at_params, event.event_id, event.room_id, key, text),
        )
