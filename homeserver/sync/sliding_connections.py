"""Sliding sync connections: what each room was last sent on a connection, and its room
subscriptions (MSC4186, "Connections"), in memory for the connections used lately and in
the database for all (storage/sliding_sync.py), so a restart can go on.

A `pos` is `<connection>.<generation>.<sync token>`. The generation names the connection's
entries as of a response: a request with a pos reads them as they were then, so a client
that retries a request whose answer it never got is answered again from where it was. The
sync token (tokens.py) holds the streams' positions the response covered, as /sync's
next_batch does. A pos of another user or device, of a connection replaced or expired, or
of a generation the server never gave, is 400 M_UNKNOWN_POS, and the client starts over.

A room sent up to the events position of the pos' own token is kept as sent "up to the
pos" (`UP_TO_POS`), not as that number: a room that is sent each time it moves is then
the same entry from one response to the next, and a long-poll woken by a message writes
nothing, its pos naming the same generation with a newer token. Only a room's config, a
room leaving the window (its position is then the number it had) or a subscription makes
a new generation.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field

import gevent
from gevent.event import AsyncResult

from homeserver.core.caching import TtlCache
from homeserver.core.errors import Codes, MatrixError
from homeserver.core.requester import Requester
from homeserver.storage.sliding_sync import SlidingSyncStore
from homeserver.sync.sliding_lists import Listing
from homeserver.sync.sliding_request import RoomConfig
from homeserver.sync.tokens import SyncToken

_POS = re.compile(r"^(\d{1,18})\.(\d{1,18})\.(s[0-9a-f_]{1,200})$")
ROOM, SUBSCRIPTION = "room", "sub"
# A SentRoom's position meaning "up to the events position of the pos read with it".
UP_TO_POS = -1
# A connection in use whose entries do not change has its use written down this often:
# its lifetime counts from there after a restart.
TOUCH_EVERY_MS = 3600 * 1000
# Saves written in one transaction at most (_Saves).
SAVE_BATCH = 500


def unknown_pos(why: str) -> MatrixError:
    return MatrixError(400, Codes.UNKNOWN_POS, f"Unknown position: {why}; start over")


@dataclass(frozen=True)
class Pos:
    connection_id: int
    generation: int
    token: SyncToken

    def __str__(self) -> str:
        return f"{self.connection_id}.{self.generation}.{self.token}"

    @classmethod
    def parse(cls, text: str) -> "Pos":
        match = _POS.match(text)
        if match is None:
            raise unknown_pos("not a pos of this server")
        try:
            token = SyncToken.parse(match.group(3))
        except MatrixError:
            raise unknown_pos("not a pos of this server") from None
        return cls(int(match.group(1)), int(match.group(2)), token)


@dataclass(frozen=True)
class SentRoom:
    """What a connection last sent of a room: its events up to `position`, with `config`."""

    position: int
    config: RoomConfig

    def to_json(self) -> str:
        # json.dumps of {"position": ..., "config": config.to_json()}, its config's part kept
        return f'{{"position": {self.position}, "config": {self.config.text}}}'

    @classmethod
    def from_json(cls, text: str) -> "SentRoom":
        data = json.loads(text)
        return cls(data["position"], RoomConfig.from_json(data["config"]))


def resolved(rooms: dict[str, SentRoom], pos_events: int) -> dict[str, SentRoom]:
    """The entries as positions, a pos' token's events position standing for UP_TO_POS."""
    return {
        room_id: SentRoom(pos_events, sent.config) if sent.position == UP_TO_POS else sent
        for room_id, sent in rooms.items()
    }


def kept_form(rooms: dict[str, SentRoom], pos_events: int) -> dict[str, SentRoom]:
    """`resolved`'s inverse: a room sent up to the new pos' events position is UP_TO_POS."""
    return {
        room_id: SentRoom(UP_TO_POS, sent.config) if sent.position == pos_events else sent
        for room_id, sent in rooms.items()
    }


@dataclass
class ConnectionState:
    """A connection's entries as kept (`rooms` with UP_TO_POS), or, while a request
    computes, as positions (`resolved`)."""

    connection_id: int
    user_id: str
    device_id: str
    conn_id: str
    generation: int
    rooms: dict[str, SentRoom] = field(default_factory=dict)
    subscriptions: dict[str, RoomConfig] = field(default_factory=dict)
    touched_ms: int = 0  # when its database row last had its use noted
    ticket: int = 0  # the request it was read for (Connections.commit)
    # The room list its latest response was made from, in memory only: what its next
    # request brings up to date (sliding_lists.py). None read back from the database.
    listing: Listing | None = None

    def copy(self) -> "ConnectionState":
        return ConnectionState(
            self.connection_id,
            self.user_id,
            self.device_id,
            self.conn_id,
            self.generation,
            dict(self.rooms),
            dict(self.subscriptions),
            self.touched_ms,
            self.ticket,
            self.listing,
        )


class Connections:
    def __init__(
        self,
        store: SlidingSyncStore,
        cached: int,
        lifetime_s: float,
        per_device: int,
        clock=time.monotonic,
    ):
        self.store = store
        self.lifetime_ms = int(lifetime_s * 1000)
        self.per_device = per_device
        self._lifetime_s = lifetime_s
        # connection id -> its state at its latest generation
        self._cache = TtlCache(clock, cached)
        # connection id -> the ticket of its latest request: a client that gives up on a
        # request sends the next at once, and the one it left must not write over it.
        self._latest = TtlCache(clock, cached)
        self._tickets = itertools.count(1)
        self._saves = _Saves(store)

    def start(self, requester: Requester, conn_id: str, now_ms: int) -> ConnectionState:
        """A new connection (a request without pos), replacing the device's of that name."""
        device_id = requester.device_id or ""
        self.store.expire(now_ms - self.lifetime_ms)
        connection_id, ended = self.store.open(
            requester.user_id, device_id, conn_id, now_ms, self.per_device
        )
        for old in ended:
            self._cache.discard(old)
        state = ConnectionState(connection_id, requester.user_id, device_id, conn_id, 0)
        state.ticket = self._take_ticket(connection_id)
        return state

    def _take_ticket(self, connection_id: int) -> int:
        ticket = next(self._tickets)
        self._latest.put(connection_id, ticket, self._lifetime_s)
        return ticket

    def resume(self, requester: Requester, conn_id: str, pos: Pos, now_ms: int) -> ConnectionState:
        """The connection's state as of the pos' generation; a copy, changed freely."""
        found: ConnectionState | None = self._cache.get(pos.connection_id)
        if found is None or found.generation != pos.generation:
            row = self.store.connection(pos.connection_id)
            if row is None:
                raise unknown_pos("this connection has ended")
            if row.last_used_ts < now_ms - self.lifetime_ms:
                raise unknown_pos("this connection has expired")
            if pos.generation > row.generation:
                raise unknown_pos("this server never gave that pos")
            found = ConnectionState(row.id, row.user_id, row.device_id, row.conn_id, pos.generation)
            found.touched_ms = row.last_used_ts
            for (kind, room_id), value in self.store.entries(row.id, pos.generation).items():
                if kind == ROOM:
                    found.rooms[room_id] = SentRoom.from_json(value)
                elif kind == SUBSCRIPTION:
                    found.subscriptions[room_id] = RoomConfig.from_json(json.loads(value))
        if (found.user_id, found.device_id, found.conn_id) != (
            requester.user_id,
            requester.device_id or "",
            conn_id,
        ):
            raise unknown_pos("that pos is another connection's")
        state = found.copy()
        state.ticket = self._take_ticket(state.connection_id)
        return state

    def commit(
        self, before: ConnectionState, after: ConnectionState, pos_events: int, now_ms: int
    ) -> int | None:
        """Stores what changed from `before` (as kept) to `after` (as positions, for a pos
        whose token's events position is `pos_events`) as a new generation (none when
        nothing did); returns the generation `after` is at. None when a later request of
        the connection, or a new connection of its name, has taken over: this answer is
        for no one, and nothing of it is kept."""
        if self._latest.get(after.connection_id) not in (None, before.ticket):
            return None
        after.rooms = kept_form(after.rooms, pos_events)
        changes = _changes(ROOM, before.rooms, after.rooms, SentRoom.to_json)
        changes.update(
            _changes(
                SUBSCRIPTION,
                before.subscriptions,
                after.subscriptions,
                lambda config: config.text,
            )
        )
        if not changes and before.generation > 0:
            if now_ms - after.touched_ms > TOUCH_EVERY_MS:
                self.store.touch(after.connection_id, now_ms)
                after.touched_ms = now_ms
            self._cache.put(after.connection_id, after, self._lifetime_s)
            return before.generation
        generation = self._saves.save(after.connection_id, before.generation, changes, now_ms)
        if generation is None:
            return None
        after.generation, after.touched_ms = generation, now_ms
        self._cache.put(after.connection_id, after.copy(), self._lifetime_s)
        return after.generation


class _Saves:
    """Saves waiting for the writer, written together: one message wakes every parked
    connection of its room's members, and a transaction each would queue them one behind
    another. Each still answers once its own save is written."""

    def __init__(self, store: SlidingSyncStore):
        self.store = store
        self._queue: list[tuple[tuple, AsyncResult]] = []
        self._writing = False

    def save(self, connection_id: int, from_generation: int, changes: dict, now_ms: int):
        """SlidingSyncStore.save's answer, written with the saves queued meanwhile."""
        done = AsyncResult()
        self._queue.append(((connection_id, from_generation, changes, now_ms), done))
        if not self._writing:
            self._writing = True
            gevent.spawn(self._write)
        return done.get()

    def _write(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:SAVE_BATCH], self._queue[SAVE_BATCH:]
                try:
                    outcomes = self.store.save_many([save for save, _ in batch])
                except Exception as e:  # each waiting request is told
                    for _, done in batch:
                        done.set_exception(e)
                    continue
                for (_, done), outcome in zip(batch, outcomes):
                    done.set(outcome)
        finally:
            self._writing = False


def _changes(kind: str, before: dict, after: dict, text) -> dict[tuple[str, str], str | None]:
    """The rows that turn `before` into `after`: a value's text, or None once removed."""
    changes: dict[tuple[str, str], str | None] = {
        (kind, room_id): text(value)
        for room_id, value in after.items()
        if before.get(room_id) != value
    }
    changes.update({(kind, room_id): None for room_id in before.keys() - after.keys()})
    return changes
