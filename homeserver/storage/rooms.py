"""Rooms: events, current state, forward extremities, transaction IDs and room stats.

Events are stored as the PDU JSON plus the columns queries need. Current state, memberships,
room stats and the joined-count history are updated in the same transaction as the events
they follow from, so a reader never sees one without the other.
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from homeserver.core.events import Event
from homeserver.storage import (
    auth_chains,
    event_state,
    outbox,
    streams,
)
from homeserver.storage.database import Database, in_lists
from homeserver.storage.event_state import Delta, GroupRef
from homeserver.storage.event_writes import Batch, prepare_event
from homeserver.storage.history import HistoryEvent, store_history
from homeserver.storage.parsed_events import PARSED
from homeserver.storage.room_members import RoomMembers
from homeserver.storage.state_sql import glob_match, keys_clause, keys_table

EVENTS_STREAM = "events"

StateKey = tuple[str, str]


@dataclass(frozen=True)
class StoredEvent:
    event: Event
    stream_ordering: int
    # Server-side unsigned data of a state event that replaced another: prev_content,
    # prev_sender, replaces_state.
    unsigned: dict = field(default_factory=dict)
    soft_failed: bool = False  # stored for the room's graph, never shown to clients


@dataclass(frozen=True)
class RoomRow:
    room_id: str
    room_version: str
    creator: str


@dataclass(frozen=True)
class NewRoom:
    room_id: str
    room_version: str
    creator: str
    created_ts: int


@dataclass(frozen=True)
class TxnKey:
    """A client transaction: one device, one request path."""

    user_id: str
    device_id: str
    room_id: str
    event_type: str
    txn_id: str


@dataclass(frozen=True)
class ResolvedPersist:
    """What state resolution decided for events being stored: the state before each (by
    event ID), whether they were soft-failed, and the room's new current state."""

    state_before: Mapping[str, Mapping[StateKey, str] | GroupRef] = field(default_factory=dict)
    soft_failed: bool = False
    current: Mapping[StateKey, str] | None = None
    current_change: Delta | None = None  # instead of `current`: the change to it
    outliers: Sequence[Event] = ()  # stored first, newest first (storage/history.py)

    @property
    def decides_current(self) -> bool:
        return self.current is not None or self.current_change is not None


class StaleExtremities(Exception):
    """The room moved on between building an event and storing it."""


# The first key of a room's advisory lock while an event of it is written ("ROOM").
ROOM_WRITES = 0x524F4F4D

_EVENT_COLUMNS = "e.stream_ordering, e.event_id, e.json, e.unsigned"


def _stored(row) -> StoredEvent:
    return StoredEvent(PARSED.event(row[1], row[2]), row[0], json.loads(row[3] or "{}"))


def _one_writer_per_room(tx, room_id: str) -> None:
    """With other instances on the database, they write to the room too, and
    rooms/service.py's room lock is one process's: one writer per room cluster-wide, until
    commit, so the extremity check sees their commits instead of forking the room."""
    if tx.announce_as is not None:
        tx.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (ROOM_WRITES, room_id))


def _state_key_of(stored: StoredEvent) -> StateKey:
    """The (type, state_key) of an event read from the room state (state events only)."""
    state_key = stored.event.state_key
    if state_key is None:
        raise ValueError(f"{stored.event.event_id} was read as room state but has no state_key")
    return stored.event.type, state_key


class RoomStore(RoomMembers):
    def __init__(self, db: Database):
        self.db = db
        self._state_groups: dict = {}  # decoded, by group (event_state.ids_at)

    # --- writes -------------------------------------------------------------------------

    def persist_events(
        self,
        events: list[Event],
        *,
        new_room: NewRoom | None = None,
        txn: TxnKey | None = None,
        now_ms: int = 0,
        extra_writes: Iterable[Callable] = (),
        first_writes: Iterable[Callable] = (),
        received: bool = False,
        send_to: Iterable[str] = (),
        resolved: ResolvedPersist | None = None,
    ) -> list[StoredEvent]:
        """Stores `events` (in order, one room) in one transaction, with their effects on
        current state, stats and extremities. `extra_writes` are `fn(tx)` run in the same
        transaction once the events are stored (an alias and a directory entry for a new
        room); `first_writes` too, but before the events take their stream positions, with
        only their state, extremities and current state written. Raises
        `StaleExtremities` if one of the first event's prev_events is no longer a forward
        extremity of the room, and the engine's unique violation if `txn` was already used
        (or, for a `received` event, if the event is already stored). A `received` event
        (over federation) may extend any part of the room's graph: its prev_events were
        checked to be stored, and it becomes an extremity beside the others.

        Every event is queued for each server in `send_to` (the federation sender's outbox)
        in the same transaction, so it is queued exactly when it is stored. `resolved`
        carries what state resolution decided for received events (event_state.py keeps
        the state at each event)."""
        return self.db.write_pipelined(  # from `advance` on, one round trip with the COMMIT
            self._persist,
            events,
            new_room,
            txn,
            now_ms,
            list(extra_writes),
            list(first_writes),
            received,
            set(send_to),
            resolved or ResolvedPersist(),
        )

    def _persist(self, tx, events, new_room, txn, now_ms, extra, first, received, send_to, res):
        room_id = events[0].room_id
        _one_writer_per_room(tx, room_id)
        RoomStore._new_or_unmoved(tx, events, new_room, received)
        store_history(tx, [HistoryEvent(e, outlier=True) for e in res.outliers])
        answer = None
        if res.outliers:  # a remote join's answer: its state is the room's just before it
            answer = event_state.answer_group(tx, room_id, res.state_before[events[0].event_id])
            res = replace(res, state_before={events[0].event_id: answer})
        # All that needs no position first: from `advance` to the commit, every other
        # writer of events in the cluster waits (storage/streams.py).
        batch = Batch(answer.group if answer is not None else None)
        ready = [prepare_event(tx, e, res, received, batch) for e in events]
        if txn is not None:
            tx.execute(
                "INSERT INTO event_txn_ids (user_id, device_id, room_id, event_type,"
                " txn_id, event_id, created_ts) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*astuple(txn), events[-1].event_id, now_ms),
            )
        for write in first:
            write(tx)
        auth_chains.index_events(tx, events)  # its stream's row first, as history.py takes it
        taken = streams.take(tx, EVENTS_STREAM, len(events))
        # The rows read their positions themselves (streams.Pending), so the advance, the
        # rows and the COMMIT reach the server together (Database.write_pipelined). A
        # resolution's change of current state, or a remote join's answer, needs the
        # number: one wait with the row held.
        last: streams.Position = taken.pending
        if answer is not None or res.decides_current:
            last = taken.last()
        if answer is not None:
            event_state.place_current(tx, room_id, last - 1, answer.group, replace=True)
        for i, r in enumerate(ready):
            r.insert(tx, last - (len(ready) - 1 - i))
        if res.decides_current:
            last_id, whole, change = events[-1].event_id, res.current, res.current_change
            event_state.update_current(tx, room_id, taken.last(), last_id, whole, change)
        outbox.queue_pdus(tx, send_to, [e.event_id for e in events])
        for write in extra:
            write(tx)

        def stored() -> list[StoredEvent]:  # once committed
            end = taken.last()
            return [
                StoredEvent(r.event, end - (len(ready) - 1 - i), r.unsigned, r.soft_failed)
                for i, r in enumerate(ready)
            ]

        return stored

    @staticmethod
    def _new_or_unmoved(tx, events: list[Event], new_room: NewRoom | None, received: bool):
        """Creates the room's rows if it is new; else, for a local event, raises
        `StaleExtremities` unless its prev_events are still the room's extremities."""
        room_id = events[0].room_id
        if new_room is not None:
            tx.execute(
                "INSERT INTO rooms (room_id, room_version, creator, created_ts)"
                " VALUES (?, ?, ?, ?)",
                (new_room.room_id, new_room.room_version, new_room.creator, new_room.created_ts),
            )
            tx.execute("INSERT INTO room_stats (room_id) VALUES (?)", (room_id,))
        elif not received:
            current = {
                r[0]
                for r in tx.fetchall(
                    "SELECT event_id FROM event_forward_extremities WHERE room_id = ?", (room_id,)
                )
            }
            if not set(events[0].prev_event_ids) <= current:
                raise StaleExtremities(room_id)

    @staticmethod
    def only_extremity(room_id: str, event_id: str) -> Callable:
        """A write (for `extra_writes`) leaving `event_id` the room's one forward extremity:
        after a remote join, the events of its state and auth chain are not the room's
        frontier, our join is."""

        def write(tx) -> None:
            tx.execute(
                "DELETE FROM event_forward_extremities WHERE room_id = ? AND event_id <> ?",
                (room_id, event_id),
            )

        return write

    # --- rooms --------------------------------------------------------------------------

    def get_room(self, room_id: str) -> RoomRow | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT room_id, room_version, creator FROM rooms WHERE room_id = ?", (room_id,)
            )
        )
        return RoomRow(*row) if row else None

    def is_blocked(self, room_id: str) -> bool:
        """An admin blocked the room (0066_admin.sql): no local user may join it."""
        row = self.db.read(
            lambda tx: tx.fetchone("SELECT 1 FROM blocked_rooms WHERE room_id = ?", (room_id,))
        )
        return row is not None

    def stream_position(self) -> int:
        return self.db.read(streams.current, EVENTS_STREAM)

    # --- events and state ---------------------------------------------------------------

    def get_event(self, event_id: str) -> StoredEvent | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                f"SELECT {_EVENT_COLUMNS} FROM events e WHERE e.event_id = ?", (event_id,)
            )
        )
        return _stored(row) if row else None

    def events_in_room(self, room_id: str, event_ids: Iterable[str]) -> dict[str, StoredEvent]:
        """Those of `event_ids` that are stored events of `room_id`, by ID."""
        event_ids = list(dict.fromkeys(event_ids))
        if not event_ids:
            return {}

        def read(tx) -> dict[str, StoredEvent]:
            # By ID alone, the room checked here: with room_id in the WHERE, SQLite may scan
            # the room's index, a cost that grows with the room. Decoded here, on the
            # database's thread: a big room's state is 100,000 events, seconds of the hub.
            found: dict[str, StoredEvent] = {}
            for chunk, marks in in_lists(event_ids):
                rows = tx.fetchall(
                    f"SELECT {_EVENT_COLUMNS}, e.room_id FROM events e"
                    f" WHERE e.event_id IN ({marks})",
                    chunk,
                )
                found.update((r[1], _stored(r)) for r in rows if r[4] == room_id)
            return found

        return self.db.read(read)

    def forward_extremities(self, room_id: str) -> list[Event]:
        rows = self.db.read(
            lambda tx: tx.fetchall(
                f"SELECT {_EVENT_COLUMNS} FROM event_forward_extremities x"
                " JOIN events e ON e.event_id = x.event_id WHERE x.room_id = ?"
                " ORDER BY e.stream_ordering",
                (room_id,),
            )
        )
        return [_stored(r).event for r in rows]

    def current_state(
        self, room_id: str, keys: Iterable[StateKey] | None = None, event_type: str | None = None
    ) -> dict[StateKey, StoredEvent]:
        """The room's current state; only `keys`, or only `event_type`, when given."""
        params: list = []
        if keys is not None:
            keys = list(dict.fromkeys(keys))
            if not keys:
                return {}
            sql = (
                keys_table(keys, params) + f"SELECT {_EVENT_COLUMNS} FROM k"
                " CROSS JOIN current_state c JOIN events e ON e.event_id = c.event_id"
                " WHERE c.room_id = ? AND c.type = k.type AND c.state_key = k.state_key"
            )
        else:
            sql = (
                f"SELECT {_EVENT_COLUMNS} FROM current_state c"
                " JOIN events e ON e.event_id = c.event_id WHERE c.room_id = ?"
            )
        params.append(room_id)
        if event_type is not None:
            sql += " AND c.type = ?"
            params.append(event_type)
        rows = self.db.read(lambda tx: tx.fetchall(sql, params))
        return {_state_key_of(s): s for s in map(_stored, rows)}

    def current_bans(self, room_id: str) -> list[StoredEvent]:
        """The member events of the room's banned users (an upgrade copies them), read by
        membership without decoding the other members' events."""
        rows = self.db.read(
            lambda tx: tx.fetchall(
                f"SELECT {_EVENT_COLUMNS} FROM current_state c"
                " JOIN events e ON e.event_id = c.event_id WHERE c.room_id = ?"
                " AND c.type = 'm.room.member' AND c.membership = 'ban' ORDER BY c.state_key",
                (room_id,),
            )
        )
        return [_stored(row) for row in rows]

    def state_at(
        self,
        room_id: str,
        position: int,
        event_type: str | None = None,
        changed_after: int = 0,
        keys: Iterable[StateKey] | None = None,
    ) -> dict[StateKey, StoredEvent]:
        """The room's current state as it was just after stream position `position`: the
        resolved state, from room_state_positions. With `changed_after`, only the keys whose
        event differs from the state at that position (a state delta); with `keys` or
        `event_type`, only those. A room with no row that far back is read by stream order."""
        keys = list(keys) if keys is not None else None
        only = keys if changed_after == 0 else None
        ids = self.db.read(event_state.ids_at, room_id, position, self._state_groups, only)
        if ids is None:
            return self._state_by_order(room_id, position, event_type, changed_after, keys)
        if changed_after > 0:
            before = self.db.read(event_state.ids_at, room_id, changed_after, self._state_groups)
            if before is None:
                before = {
                    k: s.event.event_id
                    for k, s in self._state_by_order(room_id, changed_after).items()
                }
            ids = {k: v for k, v in ids.items() if before.get(k) != v}
        if keys is not None:
            # Looked up, not filtered: a lazy-loading sync wants two members of thousands.
            ids = {k: ids[k] for k in set(keys) if k in ids}
        if event_type is not None:
            ids = {k: v for k, v in ids.items() if k[0] == event_type}
        found = self.events_in_room(room_id, ids.values())
        return {k: found[v] for k, v in ids.items() if v in found}

    def _state_by_order(
        self,
        room_id: str,
        position: int,
        event_type: str | None = None,
        changed_after: int = 0,
        keys: Iterable[StateKey] | None = None,
    ) -> dict[StateKey, StoredEvent]:
        """state_at for positions before room_state_positions: the latest state event per
        key at or before `position`, by stream order (how linear rooms were read)."""
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events e WHERE e.room_id = ? AND e.soft_failed = 0"
            " AND e.state_key IS NOT NULL AND e.stream_ordering <= ?"
            " AND e.stream_ordering > ?"
            " AND e.stream_ordering = (SELECT MAX(e2.stream_ordering) FROM events e2"
            "  WHERE e2.room_id = e.room_id AND e2.type = e.type AND e2.soft_failed = 0"
            "  AND e2.state_key = e.state_key AND e2.stream_ordering <= ?)"
        )
        params: list = [room_id, position, changed_after, position]
        if keys is not None:
            keys = list(keys)
            if not keys:
                return {}
            sql += keys_clause("e", keys, params)
        if event_type is not None:
            sql += " AND e.type = ?"
            params.append(event_type)
        rows = self.db.read(lambda tx: tx.fetchall(sql, params))
        return {_state_key_of(s): s for s in map(_stored, rows)}

    def event_near_ts(self, room_id: str, ts: int, forward: bool) -> StoredEvent | None:
        """The timeline's first event at or after `ts` (forward), or its last at or before
        it; never an outlier or a soft-failed event."""
        op, order = (">=", "ASC") if forward else ("<=", "DESC")
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events e WHERE e.room_id = ? AND e.soft_failed = 0"
            f" AND e.outlier = 0 AND e.origin_server_ts {op} ?"
            f" ORDER BY e.origin_server_ts {order}, e.stream_ordering {order} LIMIT 1"
        )
        row = self.db.read(lambda tx: tx.fetchone(sql, (room_id, ts)))
        return _stored(row) if row else None

    def room_events(
        self,
        room_id: str,
        after: int,
        up_to: int,
        backwards: bool,
        limit: int,
        types=None,
        not_types=None,
        senders=None,
        not_senders=None,
    ) -> list[StoredEvent]:
        """Events with `after < stream_ordering <= up_to`, oldest first or newest first."""
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events e WHERE e.room_id = ? AND e.soft_failed = 0"
            " AND e.outlier = 0 AND e.stream_ordering > ? AND e.stream_ordering <= ?"
        )
        params: list = [room_id, after, up_to]
        dialect = self.db.dialect
        if types is not None:
            if not types:
                return []
            matches = [glob_match(dialect, "e.type", t) for t in types]
            sql += " AND (" + " OR ".join(m[0] for m in matches) + ")"
            params += [m[1] for m in matches]
        for pattern in not_types or ():
            clause, param = glob_match(dialect, "e.type", pattern)
            sql += f" AND NOT {clause}"
            params.append(param)
        if senders is not None:
            if not senders:
                return []
            sql += " AND e.sender IN (" + ", ".join("?" for _ in senders) + ")"
            params += list(senders)
        if not_senders:
            sql += " AND e.sender NOT IN (" + ", ".join("?" for _ in not_senders) + ")"
            params += list(not_senders)
        sql += f" ORDER BY e.stream_ordering {'DESC' if backwards else 'ASC'} LIMIT ?"
        params.append(limit)
        rows = self.db.read(lambda tx: tx.fetchall(sql, params))
        return [_stored(r) for r in rows]

    def state_changes(
        self, room_id: str, keys: list[StateKey]
    ) -> dict[StateKey, list[tuple[int, StoredEvent]]]:
        """Every event ever set for each of `keys`, oldest first, read in one transaction:
        membership and history visibility timelines for deciding what a user may see."""
        return self.db.read(RoomStore.state_changes_in, room_id, keys)

    @staticmethod
    def state_changes_in(tx, room_id: str, keys: list[StateKey]) -> dict:
        """`state_changes` inside a caller's transaction (storage/sync.py's snapshot)."""
        found: dict[StateKey, list[tuple[int, StoredEvent]]] = {key: [] for key in keys}
        if not keys:
            return found
        params: list = []
        rows = tx.fetchall(
            f"{keys_table(list(found), params)}SELECT {_EVENT_COLUMNS}, e.type, e.state_key FROM k"
            " JOIN events e ON e.room_id = ? AND e.type = k.type AND e.state_key = k.state_key"
            " WHERE e.soft_failed = 0 ORDER BY e.stream_ordering",
            (*params, room_id),
        )
        for row in rows:
            found[(row[4], row[5])].append((row[0], _stored(row)))
        return found

    @staticmethod
    def history_keys(user_id: str) -> list[StateKey]:
        """The state a user's view of a room's history is made of (rooms/visibility.py)."""
        return [("m.room.member", user_id), ("m.room.history_visibility", "")]

    # --- transaction IDs ----------------------------------------------------------------

    def event_for_txn(self, txn: TxnKey) -> str | None:
        row = self.db.read(
            lambda tx: tx.fetchone(
                "SELECT event_id FROM event_txn_ids WHERE user_id = ? AND device_id = ?"
                " AND room_id = ? AND event_type = ? AND txn_id = ?",
                (txn.user_id, txn.device_id, txn.room_id, txn.event_type, txn.txn_id),
            )
        )
        return row[0] if row else None

    def txn_ids_for(self, user_id: str, device_id: str, event_ids: list[str]) -> dict[str, str]:
        """{event_id: txn_id} for those of `event_ids` this device sent."""
        found: dict[str, str] = {}
        for chunk, marks in in_lists(event_ids):
            found.update(
                self.db.read(
                    lambda tx: tx.fetchall(
                        # `user_id || ''`: no indexed column, so SQLite looks the events
                        # up by event_id rather than walking all the user's transactions
                        # by the primary key (5 ms for a user with 5,000 of them).
                        f"SELECT event_id, txn_id FROM event_txn_ids WHERE event_id IN ({marks})"
                        " AND user_id || '' = ? AND device_id = ?",
                        (*chunk, user_id, device_id),
                    )
                )
            )
        return found
