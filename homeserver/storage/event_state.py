"""The state at each event (state groups), rejected PDUs, and the writes that keep current
state the resolved state of a room's forward extremities.

A state group is a state map, {(type, state_key): event_id}, stored as a delta: the keys that
differ from its previous group (`prev_state_group`; a removed key has no event), in
`state_group_entries`. A chain is at most MAX_CHAIN deltas long; the group after that is
written whole. So a message writes no group (it points at its prev's), a state event writes
one key, and reading a few keys of a group reads those keys of at most MAX_CHAIN + 1 groups,
whatever the room's size.

Every event with a known state points at the group of the state after it, and each change
of a room's current state is a row of room_state_positions pointing at the group of the
state it became. The writes here run inside `RoomStore.persist_events`' transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping

from homeserver.core.events import Event
from homeserver.storage import room_stats, streams, user_directory
from homeserver.storage.database import Database, in_lists
from homeserver.storage.state_sql import keys_table
from homeserver.storage.streams import Position

StateKey = tuple[str, str]
StateIds = Mapping[StateKey, str]
Delta = dict[StateKey, "str | None"]  # None: the key is removed

# Deltas in a chain before a group is written whole: the bound on a read's groups, against
# the disk a whole group costs (a 10,000-member room's is about 10,000 rows).
MAX_CHAIN = 100

# Decoded state groups a store keeps (RoomStore.state_at). A room of thousands has a state
# of thousands of keys, and every lazy-loading sync one message wakes reads it.
DECODED_GROUPS = 16

# More keys than this are read as the whole group, then picked.
_KEYS_PER_QUERY = 200

# Events decoded at once when current state changes by many keys.
_EVENTS_PER_READ = 1000


@dataclass(frozen=True)
class GroupRef:
    """The state of a stored group, by reference: the state before a received event whose
    one prev_event has a group. Checking the event reads a few keys of it, and storing it
    as the event's state before reads and writes nothing."""

    group: int


def delta_between(old: StateIds, new: StateIds) -> Delta:
    """The changes that make `old` into `new`."""
    delta: Delta = {k: v for k, v in new.items() if old.get(k) != v}
    delta.update({k: None for k in old.keys() - new.keys()})
    return delta


# --- groups ------------------------------------------------------------------------------


def group_of(tx, event_id: str) -> int | None:
    row = tx.fetchone("SELECT state_group FROM event_state_groups WHERE event_id = ?", (event_id,))
    return row[0] if row else None


def _chain(tx, group: int) -> list[int]:
    """`group` and the groups it is a delta on, nearest first."""
    rows = tx.fetchall(
        "WITH RECURSIVE chain (state_group, prev_state_group, n) AS ("
        " SELECT state_group, prev_state_group, 0 FROM state_groups WHERE state_group = ?"
        " UNION ALL SELECT g.state_group, g.prev_state_group, c.n + 1"
        " FROM state_groups g JOIN chain c ON g.state_group = c.prev_state_group)"
        " SELECT state_group FROM chain ORDER BY n",
        (group,),
    )
    return [r[0] for r in rows]


def read_group(tx, group: int, keys: Iterable[StateKey] | None = None) -> dict[StateKey, str]:
    """The state of `group`: whole, or only those of `keys` it has."""
    chain = _chain(tx, group)
    wanted = None if keys is None else set(keys)
    in_chain = f"state_group IN ({', '.join('?' * len(chain))})"
    sql = f"SELECT state_group, type, state_key, event_id FROM state_group_entries WHERE {in_chain}"
    params: list = list(chain)
    if wanted is not None and len(wanted) <= _KEYS_PER_QUERY:
        if not wanted:
            return {}
        params = []
        sql = keys_table(list(wanted), params) + (
            "SELECT s.state_group, s.type, s.state_key, s.event_id FROM k"
            " CROSS JOIN state_group_entries s"
            f" WHERE s.type = k.type AND s.state_key = k.state_key AND s.{in_chain}"
        )
        params += chain
    by_group: dict[int, list[tuple]] = {}
    for row in tx.fetchall(sql, params) if chain else ():
        by_group.setdefault(row[0], []).append(row)
    state: dict[StateKey, str] = {}
    for g in reversed(chain):  # the whole group first, the nearest delta last
        for _, event_type, state_key, event_id in by_group.get(g, ()):
            if event_id is None:
                state.pop((event_type, state_key), None)
            else:
                state[(event_type, state_key)] = event_id
    if wanted is not None:
        return {k: v for k, v in state.items() if k in wanted}
    return state


def state_of(
    tx, event_id: str, keys: Iterable[StateKey] | None = None
) -> dict[StateKey, str] | None:
    """The state after `event_id` (its group; only `keys` of it if given), or None if it
    has none."""
    group = group_of(tx, event_id)
    return read_group(tx, group, keys) if group is not None else None


def new_group(tx, room_id: str, base: int | None, delta: Delta) -> int:
    """A group of `base`'s state changed by `delta` (with no base, `delta` is the state)."""
    length = 0
    if base is not None:
        row = tx.fetchone("SELECT chain_length FROM state_groups WHERE state_group = ?", (base,))
        length = row[0] + 1
        if length > MAX_CHAIN:  # written whole: no read walks more than MAX_CHAIN + 1
            whole = dict(read_group(tx, base))
            whole.update(delta)  # type: ignore[arg-type]
            base, length, delta = None, 0, dict(whole)
    group = tx.fetchone(
        "INSERT INTO state_groups (room_id, prev_state_group, chain_length) VALUES (?, ?, ?)"
        " RETURNING state_group",
        (room_id, base, length),
    )[0]
    tx.executemany(
        "INSERT INTO state_group_entries (state_group, type, state_key, event_id)"
        " VALUES (?, ?, ?, ?)",
        [(group, t, k, e) for (t, k), e in delta.items() if base is not None or e is not None],
    )
    return group


def current_group(tx, room_id: str) -> int | None:
    """The group of the room's current state: its latest room_state_positions row (None for
    a room with none, stored before that table)."""
    row = tx.fetchone(
        "SELECT state_group FROM room_state_positions WHERE room_id = ?"
        " ORDER BY stream_ordering DESC LIMIT 1",
        (room_id,),
    )
    return row[0] if row else None


def current_ids(tx, room_id: str) -> dict[StateKey, str]:
    rows = tx.fetchall(
        "SELECT type, state_key, event_id FROM current_state WHERE room_id = ?", (room_id,)
    )
    return {(r[0], r[1]): r[2] for r in rows}


# --- writes, inside the persist transaction ---------------------------------------------


def record_state(
    tx,
    event: Event,
    before: StateIds | GroupRef | None,
    local: bool,
    applied: bool = True,
    current: int | None = None,
) -> None:
    """Points `event` at the group of the state after it. `before` is the state before it
    when the caller resolved it; a local event's is the current state (the resolved state
    of the extremities it follows). A received event with no `before` (an auth chain
    event) gets no group. A rejected event is not `applied`: the state after it is the
    state before it. `current`: the current state's group when the caller knows it ahead
    of room_state_positions (`group_after` of an earlier event of its batch)."""
    found = _state_before(tx, event, before, local, current)
    if found is None:
        return
    base, delta = found
    if event.is_state and applied:
        delta[(event.type, event.state_key or "")] = event.event_id
    group = base if base is not None and not delta else new_group(tx, event.room_id, base, delta)
    tx.execute(
        "INSERT INTO event_state_groups (event_id, room_id, state_group) VALUES (?, ?, ?)",
        (event.event_id, event.room_id, group),
    )


def _state_before(
    tx, event: Event, before: StateIds | GroupRef | None, local: bool, current: int | None
) -> tuple[int | None, Delta] | None:
    """The state before `event` as a group and the delta on it; None when it is unknown."""
    if isinstance(before, GroupRef):
        return before.group, {}
    prevs = event.prev_event_ids
    if before is None:
        if not local:
            return None
        if not prevs:
            return None, {}
        group = group_of(tx, prevs[0]) if len(prevs) == 1 else None
        group = group if group is not None else current
        group = group if group is not None else current_group(tx, event.room_id)
        return (group, {}) if group is not None else (None, dict(current_ids(tx, event.room_id)))
    for prev in prevs:  # resolved from several states: a delta on one of them
        group = group_of(tx, prev)
        if group is not None:
            return group, delta_between(read_group(tx, group), before)
    return None, dict(before)


def record_rejection(
    tx, event: Event, reason: str, now_ms: int, before: StateIds | GroupRef | None = None
) -> None:
    """Remembers the rejection; with the state `before` the event, also the state after it
    (the same: a rejected event changes nothing), so that it can stand as a prev_event
    (spec: "rejected events ... may be referenced as prev_events")."""
    row = tx.fetchone(
        "INSERT INTO rejected_events (event_id, room_id, reason, rejected_ts) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
        (event.event_id, event.room_id, reason[:500], now_ms),
    )
    if row is not None and before is not None:
        record_state(tx, event, before, local=False, applied=False)


def update_current(
    tx,
    room_id: str,
    position: int,
    last_event_id: str,
    whole: StateIds | None,
    change: Delta | None = None,
) -> None:
    """Makes the room's current state `whole` (a resolved state), or changes it by
    `change` (the event followed exactly the room's forward extremities, so the state after
    it is the new current state), at `position` where `last_event_id` was stored, and
    records the change (see `change_current_state` and `record_current`)."""
    after_event = change is not None
    if change is None:
        change = delta_between(current_ids(tx, room_id), whole or {})
    delta = change_current_state(tx, room_id, change, position)
    if delta:
        record_current(tx, room_id, position, delta, last_event_id, after_event)


def change_current_state(tx, room_id: str, delta: Delta, position: int) -> Delta:
    """Changes the room's current state by `delta`, reading and writing only its keys, and
    the room's stats with each changed key. Returns the change (empty if none)."""
    old = _current_of(tx, room_id, list(delta))
    delta = {k: v for k, v in delta.items() if old.get(k) != v}
    for key in [k for k, v in delta.items() if v is None]:
        tx.execute(
            "DELETE FROM current_state WHERE room_id = ? AND type = ? AND state_key = ?",
            (room_id, *key),
        )
    # Members last: the user directory reads the room's join rule as the stats have it.
    changed = sorted(
        ((k, v) for k, v in delta.items() if v is not None),
        key=lambda kv: kv[0][0] == "m.room.member",
    )
    # A few events decoded at a time: a joined room's whole state is 100,000s of them.
    for at in range(0, len(changed), _EVENTS_PER_READ):
        part = changed[at : at + _EVENTS_PER_READ]
        found = _events_by_id(tx, [v for _, v in part] + [old[k] for k, _ in part if k in old])
        tx.executemany(
            "INSERT INTO current_state (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key) DO UPDATE"
            " SET event_id = excluded.event_id, membership = excluded.membership",
            [(room_id, *key, event_id, found[event_id].membership) for key, event_id in part],
        )
        for key, event_id in part:
            previous = found.get(old.get(key, ""))
            membership = previous.membership if previous else None
            room_stats.update_stats(tx, found[event_id], membership, position)
            user_directory.index_member(tx, found[event_id])
    return delta


def _current_of(tx, room_id: str, keys: list[StateKey]) -> dict[StateKey, str]:
    if len(keys) > _KEYS_PER_QUERY:  # a new room's whole state: one read, not thousands
        current = current_ids(tx, room_id)
        return {k: current[k] for k in keys if k in current}
    found: dict[StateKey, str] = {}
    for event_type, state_key in keys:
        row = tx.fetchone(
            "SELECT event_id FROM current_state WHERE room_id = ? AND type = ? AND state_key = ?",
            (room_id, event_type, state_key),
        )
        if row is not None:
            found[(event_type, state_key)] = row[0]
    return found


def record_current(
    tx, room_id: str, position: int, delta: Delta, event_id: str, after_event: bool
) -> None:
    """Remembers that the room's current state changed by `delta` at `position`, where
    `event_id` was stored (`group_after`, then `place_current`)."""
    place_current(tx, room_id, position, group_after(tx, room_id, delta, event_id, after_event))


def group_after(
    tx, room_id: str, delta: Delta, event_id: str, after_event: bool, current: int | None = None
) -> int:
    """The group of the room's current state once `event_id` changed it by `delta`. When
    the new current state is the state after that event (`after_event`: it followed
    exactly the room's forward extremities, as a local event does; a received event stored
    without a resolution has no group), their group is one; else a new delta on the
    current group (`current`, or room_state_positions' latest; a whole group for a room
    with none yet, from current_state, which is already changed)."""
    group = group_of(tx, event_id) if after_event else None
    if group is None:
        base = current if current is not None else current_group(tx, room_id)
        whole = base is None
        group = new_group(tx, room_id, base, dict(current_ids(tx, room_id)) if whole else delta)
    return group


def place_current(tx, room_id: str, position: Position, group: int, replace: bool = False) -> None:
    """The room's current state is `group`'s from `position` on; `replace`: another row
    may be there (a remote join's answer, `answer_group`)."""
    at, at_params = streams.sql(position)
    statement = (
        "INSERT INTO room_state_positions (room_id, stream_ordering, state_group)"
        f" VALUES (?, {at}, ?)"
    )
    if replace:
        statement += (
            " ON CONFLICT (room_id, stream_ordering)"
            " DO UPDATE SET state_group = excluded.state_group"
        )
    tx.execute(statement, (room_id, *at_params, group))


def answer_group(tx, room_id: str, state: StateIds) -> GroupRef:
    """A remote join's answer: its state (outliers, with no stream positions of their own),
    which the caller places (`place_current`, replacing) just before our join, so /sync's
    state section and reads at that position find it. Our join's group is one key on this
    one."""
    return GroupRef(new_group(tx, room_id, None, dict(state)))


def ids_at(
    tx,
    room_id: str,
    position: int,
    decoded: dict | None = None,
    keys: Iterable[StateKey] | None = None,
) -> dict[StateKey, str] | None:
    """The room's current state as it was just after stream position `position` (only
    `keys` of it if given), or None when no row covers it (a room stored before
    room_state_positions). `decoded`: whole groups already read, by group, which this adds
    to (a group never changes once written); the caller must not change what it returns."""
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
    if state is None and keys is not None:
        return read_group(tx, group, keys)
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

    def group_of(self, event_id: str) -> int | None:
        return self.db.read(group_of, event_id)

    def current_group(self, room_id: str) -> int | None:
        return self.db.read(current_group, room_id)

    def read(self, group: int, keys: Iterable[StateKey] | None = None) -> dict[StateKey, str]:
        """The state of `group`, or only `keys` of it."""
        return self.db.read(read_group, group, keys)

    def state_after(self, event_ids: Iterable[str]) -> dict[str, dict[StateKey, str]]:
        """The state after each of `event_ids` that has a group."""

        def read(tx):
            groups: dict[str, int] = {}
            for chunk, marks in in_lists(list(event_ids)):
                groups.update(
                    tx.fetchall(
                        "SELECT event_id, state_group FROM event_state_groups"
                        f" WHERE event_id IN ({marks})",
                        tuple(chunk),
                    )
                )
            states = {g: read_group(tx, g) for g in set(groups.values())}
            return {event_id: states[g] for event_id, g in groups.items()}

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

    def reject(
        self, event: Event, reason: str, now_ms: int, before: StateIds | GroupRef | None = None
    ) -> None:
        self.db.write(record_rejection, event, reason, now_ms, before)
