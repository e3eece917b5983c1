"""Typing notifications: who is typing in which room, in memory (the spec's ephemeral
events need not survive a restart).

Every typing change takes the next position of a stream, and a sync token carries the
position it has seen. One process alone counts in memory: that counter restarts at 0 with
the process, so a token also carries the process's `epoch`, a random tag chosen at start. A
token from another epoch counts as having seen nothing of typing (position 0): after a
restart a client is sent the current typing list of every room where typing changed since
the restart, and since an m.typing event is the whole list, not a delta, re-sending one
never misleads a client. Tokens never go backwards in a way that loses a change.

With several instances (`shared`), every instance keeps every room's list: a change is a
row with a position of the database's `typing` stream (storage/cluster_memory.py), and each
instance applies the rows in position order, its own after their write and the others'
when their NOTIFY arrives (sync/cluster.py). So a position means the same on every
instance, they share one epoch (`CLUSTER_EPOCH`), and a token from one works on all.
Typing is shared rather than given an owner instance per room because a sync on any
instance must show every room's typing anyway, and the rows cost one small write per
change (docs/architecture.md, "Several instances"). The instance a change happened on
times it out with a row of its own; the others hold a later timer (`ORPHAN_GRACE_SECONDS`)
that writes the stop if that instance died first.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Callable

import gevent
from gevent.lock import Semaphore

from homeserver.core.errors import forbidden
from homeserver.core.identifiers import server_of
from homeserver.storage.cluster_memory import TYPING_STREAM, ClusterMemoryStore, TypingChange

log = logging.getLogger(__name__)

# How long a user stays "typing" without a refresh: the client's timeout, capped so a client
# cannot pin itself as typing for hours; and the default when it gives none.
DEFAULT_TYPING_TIMEOUT_MS = 30_000
MAX_TYPING_TIMEOUT_MS = 120_000
# A remote user's typing lasts this long unless its server says it again: the m.typing EDU
# carries no timeout, and Synapse re-sends a still-typing user's EDU every 40 s and times
# remote typing out after 60 s, as we do.
REMOTE_TYPING_TIMEOUT_MS = 60_000
# Remote users shown typing at once in one room: a longer list tells a client nothing more,
# and it bounds the timers a room full of one server's users can hold.
MAX_REMOTE_TYPING_PER_ROOM = 100
# Several instances: every one shares this epoch, their positions being the database's.
CLUSTER_EPOCH = "00000000"
# Another instance's typing user is timed out here this long after that instance should
# have done it: only if it died first.
ORPHAN_GRACE_SECONDS = 10.0

# on_local_typing(room_id, user_id, typing, here): `here` when it happened on this instance.
LocalTyping = Callable[[str, str, bool, bool], None]
_Tell = tuple[str, str, bool, bool]


@dataclass
class _RoomTyping:
    position: int = 0  # where the room's list last changed
    expiries: dict = field(default_factory=dict)  # user_id -> the greenlet that ends it


class TypingNotifications:
    def __init__(
        self,
        rooms,
        on_change: Callable[[str], None],
        on_local_typing: LocalTyping | None = None,
        instance: str = "main",
        shared: ClusterMemoryStore | None = None,
    ):
        """`on_change(room_id)` runs after a room's typing list changed;
        `on_local_typing(room_id, user_id, typing, here)` after every typing call of one of
        our users and when it times out (the federation sender's m.typing EDU); `shared`:
        the rows other instances share typing through."""
        self.rooms = rooms
        self._on_change = on_change
        self._on_local_typing = on_local_typing
        self.instance = instance
        self._shared = shared
        self.epoch = secrets.token_hex(4) if shared is None else CLUSTER_EPOCH
        # Every change up to here is applied.
        self.position = 0 if shared is None else shared.position(TYPING_STREAM)
        self._applying = Semaphore()
        # Rooms stay here once typing happened in them since the start, so that a client is
        # told when a list becomes empty; an entry is a few dozen bytes.
        self._rooms: dict[str, _RoomTyping] = {}

    def set_typing(
        self, requester, room_id: str, user_id: str, typing: bool, timeout_ms: int | None
    ) -> None:
        if requester.user_id != user_id:
            raise forbidden("You can only set your own typing state")
        self.rooms.room_version(room_id)  # 404 for an unknown room
        if self.rooms.membership(room_id, user_id) != "join":
            raise forbidden("You are not in this room")
        timeout = min(timeout_ms or DEFAULT_TYPING_TIMEOUT_MS, MAX_TYPING_TIMEOUT_MS)
        self._publish(TypingChange(room_id, user_id, typing, timeout, self.instance))

    def set_remote_typing(self, room_id: str, user_id: str, typing: bool) -> bool:
        """A remote user's m.typing EDU, already checked (homeserver/sync/edus.py): shown
        for REMOTE_TYPING_TIMEOUT_MS, and never sent on. False when the room's list of
        remote typers is full and this user is not on it."""
        room = self._rooms.get(room_id)
        if typing and room is not None and user_id not in room.expiries:
            ours = self.rooms.server_name
            remote = sum(1 for u in room.expiries if server_of(u) != ours)
            if remote >= MAX_REMOTE_TYPING_PER_ROOM:
                return False
        change = TypingChange(room_id, user_id, typing, REMOTE_TYPING_TIMEOUT_MS, self.instance)
        self._publish(change)
        return True

    def _publish(self, change: TypingChange) -> None:
        if self._shared is None:
            self._tell_others(self._apply(self.position + 1, change))
        else:
            self.apply_upto(self._shared.add_typing(change))

    def apply_upto(self, upto: int) -> None:
        """Applies the shared changes up to `upto`, in order, from the last one applied."""
        if self._shared is None or upto <= self.position:
            return
        tells = []
        with self._applying:  # reading the rows yields: one greenlet applies at a time
            if upto > self.position:
                for position, change in self._shared.typing_changes(self.position, upto):
                    tells.append(self._apply(position, change))
                self.position = max(self.position, upto)
        for tell in tells:  # outside: sending reads the database too
            self._tell_others(tell)

    def _apply(self, position: int, change: TypingChange) -> _Tell | None:
        """Applies a change (no yield before the position is set, then the room's syncs are
        woken); returns what to tell other servers."""
        room_id, user_id = change.room_id, change.user_id
        room = self._rooms.setdefault(room_id, _RoomTyping())
        timer = room.expiries.pop(user_id, None)
        if timer is not None and timer is not gevent.getcurrent():
            timer.kill(block=False)
        here = change.instance == self.instance
        if change.typing:
            seconds = change.timeout_ms / 1000 + (0 if here else ORPHAN_GRACE_SECONDS)
            room.expiries[user_id] = gevent.spawn_later(seconds, self._expire, room_id, user_id)
        changed = (timer is None) == change.typing
        self.position = position
        if changed:
            room.position = position
            self._on_change(room_id)
        if (changed or change.typing) and server_of(user_id) == self.rooms.server_name:
            return (room_id, user_id, change.typing, here)
        return None

    def _tell_others(self, tell: _Tell | None) -> None:
        if tell is None or self._on_local_typing is None:
            return
        try:
            self._on_local_typing(*tell)
        except Exception:  # the change stands for syncs; only its EDU is lost
            log.exception("could not send typing of %s in %s", tell[1], tell[0])

    def _expire(self, room_id: str, user_id: str) -> None:
        if self._rooms[room_id].expiries.get(user_id) is not gevent.getcurrent():
            return
        try:
            self._publish(TypingChange(room_id, user_id, False, 0, self.instance))
        except Exception:  # the database: another instance's timer ends it
            log.exception("could not time out typing of %s in %s", user_id, room_id)

    def changes(self, room_ids, since: int) -> dict[str, list[str]]:
        """{room_id: users typing now} for those of `room_ids` whose list changed after
        position `since` of this epoch."""
        out = {}
        for room_id in room_ids:
            room = self._rooms.get(room_id)
            if room is not None and room.position > since:
                out[room_id] = sorted(room.expiries)
        return out

    def close(self) -> None:
        gevent.killall(
            [t for room in self._rooms.values() for t in room.expiries.values()], block=False
        )
