"""The state at each event (state groups), rejected PDUs, and the writes that keep current
state the resolved state of a room's forward extremities.

A state group is a whole state map, {(type, state_key): event_id}; every event with a known
state points at the group of the state after it. The writes here run inside
`RoomStore.persist_events`' transaction.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping

from homeserver.core.events import Event
from homeserver.storage.database import Database, in_lists

StateKey = tuple[str, str]
StateIds = Mapping[StateKey, str]

_SEP = "\u0000"


def _encode(state: StateIds) -> str:
    return json.dumps({f"{t}{_SEP}{k}": v for (t, k), v in sorted(state.items())})


# Decoded state groups a store keeps (RoomStore.state_at). A room of thousands has a state
# of thousands of keys, and every lazy-loading sync one message wakes reads it.
DECODED_GROUPS = 16


def _decode(text: str) -> dict[StateKey, str]:
    found: dict[StateKey, str] = {}
    for key, event_id in json.loads(text).items():
        event_type, _, state_key = key.partition(_SEP)
        found[(event_type, state_key)] = event_id
    return found


# --- writes, inside the persist transaction ---------------------------------------------


def group_of(tx, event_id: str) -> int | None:
    row = tx.fetchone("SELECT state_group FROM event_state_groups WHERE event_id = ?", (event_id,))
    return row[0] if row else None


def read_group(tx, group: int) -> dict[StateKey, str]:
    row = tx.fetchone("SELECT state FROM state_groups WHERE state_group = ?", (group,))
    return _decode(row[0]) if row else {}


def state_of(tx, event_id: str) -> dict[StateKey, str] | None:
    """The state after `event_id` (its group), or None if it has none."""
    group = group_of(tx, event_id)
    return read_group(tx, group) if group is not None else None


def new_group(tx, room_id: str, state: StateIds) -> int:
    row = tx.fetchone(
        "INSERT INTO state_groups (room_id, state) VALUES (?, ?) RETURNING state_group",
        (room_id, _encode(state)),
    )
    return row[0]


def current_ids(tx, room_id: str) -> dict[StateKey, str]:
    rows = tx.fetchall(
        "SELECT type, state_key, event_id FROM current_state WHERE room_id = ?", (room_id,)
    )
    return {(r[0], r[1]): r[2] for r in rows}


def record_state(tx, event: Event, before: StateIds | None, local: bool) -> None:
    """Writes the group of the state after `event`. `before` is the state before it when
    the caller resolved it; a local event's is the current state (the resolved state of
    the extremities it follows), taken from its one prev_event's group when it has one.
    A received event with no `before` (an auth chain event) gets no group."""
    group = None
    if before is None and local:
        prevs = event.prev_event_ids
        group = group_of(tx, prevs[0]) if len(prevs) == 1 else None
        if group is None:
            before = current_ids(tx, event.room_id) if prevs else {}
    if before is None and group is None:
        return
    if event.is_state or group is None:
        state = dict(before) if before is not None else read_group(tx, group)  # type: ignore[arg-type]
        if event.is_state:
            state[(event.type, event.state_key or "")] = event.event_id
        group = new_group(tx, event.room_id, state)
    tx.execute(
        "INSERT INTO event_state_groups (event_id, room_id, state_group) VALUES (?, ?, ?)",
        (event.event_id, event.room_id, group),
    )


def record_rejection(tx, event: Event, reason: str, now_ms: int) -> None:
    tx.execute(
        "INSERT INTO rejected_events (event_id, room_id, reason, rejected_ts) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (event_id) DO NOTHING",
        (event.event_id, event.room_id, reason[:500], now_ms),
    )


def set_current_state(tx, room_id: str, new: StateIds, position: int, update_stats) -> bool:
    """Makes the room's current state `new` (a resolved state); `update_stats(tx, event,
    previous_membership, position)` keeps the room's stats with each changed key. Returns
    whether anything changed."""
    old = current_ids(tx, room_id)
    if old == new:
        return False
    for key in old.keys() - new.keys():
        tx.execute(
            "DELETE FROM current_state WHERE room_id = ? AND type = ? AND state_key = ?",
            (room_id, *key),
        )
    changed = [k for k, v in new.items() if old.get(k) != v]
    found = _events_by_id(tx, [new[k] for k in changed] + list(old.values()))
    for key in changed:
        event = found[new[key]]
        previous = found.get(old.get(key, ""))
        tx.execute(
            "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key) DO UPDATE"
            " SET event_id = excluded.event_id, membership = excluded.membership",
            (room_id, *key, event.event_id, event.membership),
        )
        update_stats(tx, event, previous.membership if previous else None, position)
    return True


def record_current(tx, room_id: str, position: int, last_event_id: str) -> None:
    """Remembers the room's current state as it is now, at `position` (the last event just
    stored): the group of `last_event_id` when that is the current state (a local event's
    is), else a new group."""
    current = current_ids(tx, room_id)
    group = group_of(tx, last_event_id)
    if group is None or read_group(tx, group) != current:
        group = new_group(tx, room_id, current)
    tx.execute(
        "INSERT INTO room_state_positions (room_id, stream_ordering, state_group) VALUES (?, ?, ?)",
        (room_id, position, group),
    )


def ids_at(
    tx, room_id: str, position: int, decoded: dict | None = None
) -> dict[StateKey, str] | None:
    """The room's current state as it was just after stream position `position`, or None
    when no row covers it (a room stored before room_state_positions). `decoded`: state
    groups already decoded, by group, which this adds to (a group never changes once
    written); the caller must not change what it returns then."""
    row = tx.fetchone(
        "SELECT state_group FROM room_state_positions"
        " WHERE room_id = ? AND stream_ordering <= ?"
        " ORDER BY stream_ordering DESC LIMIT 1",
        (room_id, position),
    )
    if row is None:
        return None
    group = row[0]
    state = decoded.get(group) if decoded is not None else None
    if state is None:
        state = read_group(tx, group)
        if decoded is not None:
            if len(decoded) >= DECODED_GROUPS:
                decoded.clear()
            decoded[group] = state
    return state


def _events_by_id(tx, event_ids: list[str]) -> dict[str, Event]:
    found: dict[str, Event] = {}
    for chunk, marks in in_lists(list(dict.fromkeys(event_ids))):
        for r in tx.fetchall(
            f"SELECT event_id, json FROM events WHERE event_id IN ({marks})", tuple(chunk)
        ):
            found[r[0]] = Event(r[0], json.loads(r[1]))
    return found


# --- reads ------------------------------------------------------------------------------


class EventStateStore:
    def __init__(self, db: Database):
        self.db = db

    def state_after(self, event_ids: Iterable[str]) -> dict[str, dict[StateKey, str]]:
        """The state after each of `event_ids` that has a group."""

        def read(tx):
            found: dict[str, dict[StateKey, str]] = {}
            for chunk, marks in in_lists(list(event_ids)):
                for event_id, text in tx.fetchall(
                    "SELECT g.event_id, s.state FROM event_state_groups g"
                    " JOIN state_groups s ON s.state_group = g.state_group"
                    f" WHERE g.event_id IN ({marks})",
                    tuple(chunk),
                ):
                    found[event_id] = _decode(text)
            return found

        return self.db.read(read)

    def rejections(self, event_ids: Iterable[str]) -> dict[str, str]:
        """{event_id: reason} for those of `event_ids` that were rejected."""

        def read(tx):
            found: dict[str, str] = {}
            for chunk, marks in in_lists(list(event_ids)):
                found.update(
                    tx.fetchall(
                        f"SELECT event_id, reason FROM rejected_events WHERE event_id IN ({marks})",
                        tuple(chunk),
                    )
                )
            return found

        return self.db.read(read)

    def reject(self, event: Event, reason: str, now_ms: int) -> None:
        self.db.write(record_rejection, event, reason, now_ms)
