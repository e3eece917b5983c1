"""One event's rows in the write that stores it (storage/rooms.py, `RoomStore._persist`):
first those that need no stream position (`prepare_event`: its state, the room's
extremities and current state, what its replacing a state event changes), then, once the
events stream's row is taken, those that carry one (`Ready.insert`). Between the two every
other writer of events in the cluster waits (storage/streams.py), so the second part is
as short as it can be."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from homeserver.core.events import Event
from homeserver.storage import event_rows, event_state, room_stats, streams, user_directory
from homeserver.storage.event_state import Delta

StateKey = tuple[str, str]


@dataclass
class Batch:
    """What the events of one write made current before any of them has a position."""

    current: int | None  # the group of the room's current state (event_state.group_after)
    state: dict[StateKey, Event] = field(default_factory=dict)  # state keys they set


@dataclass
class Ready:
    """An event whose rows that need no position are written; what it writes at its own."""

    event: Event
    unsigned: dict
    soft_failed: bool
    joined: int | None = None  # the room's joined count it made
    directory: user_directory.MemberEntry | None = None
    current: int | None = None  # the group of the current state it made

    def insert(self, tx, position: streams.Position) -> None:
        event, room_id = self.event, self.event.room_id
        event_rows.insert_event_row(tx, event, position, self.unsigned, self.soft_failed)
        if self.joined is not None:
            room_stats.record_joined(tx, room_id, position, self.joined)
        if self.directory is not None:
            # A user's row, which another room's write may take while it holds the stream's
            # row (event_state.update_current): taken after it here too, never before.
            self.directory.write(tx)
        if self.current is not None:
            event_state.place_current(tx, room_id, position, self.current)


def prepare_event(tx, event: Event, resolved, received: bool, batch: Batch) -> Ready:
    """Writes an event's rows that need no stream position. `resolved`
    (rooms.ResolvedPersist): the state before it if a resolution decided it, whether it was
    soft failed, and whether a resolution decides the room's current state."""
    room_id = event.room_id
    before = resolved.state_before.get(event.event_id)
    event_state.record_state(tx, event, before, not received, current=batch.current)
    unsigned, previous_membership = _replaced(tx, event, batch)
    ready = Ready(event, unsigned, resolved.soft_failed)
    if resolved.soft_failed:  # stored for the graph only: no extremity, no current state
        return ready
    for prev_id in event.prev_event_ids:
        tx.execute(
            "DELETE FROM event_forward_extremities WHERE room_id = ? AND event_id = ?",
            (room_id, prev_id),
        )
    tx.execute(
        "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
        (room_id, event.event_id),
    )
    if event.is_state and not resolved.decides_current:
        key = (event.type, event.state_key or "")
        tx.execute(
            "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key) DO UPDATE"
            " SET event_id = excluded.event_id, membership = excluded.membership",
            (room_id, *key, event.event_id, event.membership),
        )
        batch.state[key] = event
        ready.joined = room_stats.change_stats(tx, event, previous_membership)
        ready.directory = user_directory.member_entry(tx, event)
        change: Delta = {key: event.event_id}
        group = event_state.group_after(tx, room_id, change, event.event_id, True, batch.current)
        ready.current = batch.current = group
    return ready


def _replaced(tx, event: Event, batch: Batch) -> tuple[dict, str | None]:
    """The unsigned data of a state event that replaces another in the current state
    (prev_content, prev_sender, replaces_state), and that one's membership."""
    if not event.is_state:
        return {}, None
    earlier = batch.state.get((event.type, event.state_key or ""))
    if earlier is not None:  # an earlier event of the batch, not stored yet
        prev = (earlier.event_id, earlier.pdu, earlier.membership)
    else:
        row = tx.fetchone(
            "SELECT e.event_id, e.json, e.membership FROM current_state c"
            " JOIN events e ON e.event_id = c.event_id"
            " WHERE c.room_id = ? AND c.type = ? AND c.state_key = ?",
            (event.room_id, event.type, event.state_key),
        )
        if row is None:
            return {}, None
        prev = (row[0], json.loads(row[1]), row[2])
    unsigned = {
        "replaces_state": prev[0],
        "prev_content": prev[1]["content"],
        "prev_sender": prev[1]["sender"],
    }
    return unsigned, prev[2]
