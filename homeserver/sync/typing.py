"""Typing notifications: who is typing in which room, in memory only (the spec's ephemeral
events need not survive a restart).

Every change of a room's typing list takes the next position of an in-memory stream, and a
sync token carries the position it has seen. That counter restarts at 0 with the process, so
a token also carries the process's `epoch`, a random tag chosen at start. A token from another
epoch counts as having seen nothing of typing (position 0): after a restart a client is sent
the current typing list of every room where typing changed since the restart, and since an
m.typing event is the whole list, not a delta, re-sending one never misleads a client. Tokens
never go backwards in a way that loses a change.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Callable

import gevent

from homeserver.core.errors import forbidden
from homeserver.core.identifiers import server_of

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


@dataclass
class _RoomTyping:
    position: int = 0  # where the room's list last changed
    expiries: dict = field(default_factory=dict)  # user_id -> the greenlet that ends it


class TypingNotifications:
    def __init__(
        self,
        rooms,
        on_change: Callable[[str], None],
        on_local_typing: Callable[[str, str, bool], None] | None = None,
    ):
        """`on_change(room_id)` runs after a room's typing list changed;
        `on_local_typing(room_id, user_id, typing)` after every typing call of one of our
        users and when it times out (the federation sender's m.typing EDU)."""
        self.rooms = rooms
        self._on_change = on_change
        self._on_local_typing = on_local_typing
        self.epoch = secrets.token_hex(4)
        self.position = 0
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
        seconds = min(timeout_ms or DEFAULT_TYPING_TIMEOUT_MS, MAX_TYPING_TIMEOUT_MS) / 1000
        self._set(room_id, user_id, typing, seconds)
        self._tell_others(room_id, user_id, typing)

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
        self._set(room_id, user_id, typing, REMOTE_TYPING_TIMEOUT_MS / 1000)
        return True

    def _set(self, room_id: str, user_id: str, typing: bool, seconds: float) -> None:
        room = self._rooms.setdefault(room_id, _RoomTyping())
        timer = room.expiries.pop(user_id, None)
        if timer is not None:
            timer.kill(block=False)
        if typing:
            room.expiries[user_id] = gevent.spawn_later(seconds, self._expire, room_id, user_id)
            if timer is None:
                self._changed(room_id, room)
        elif timer is not None:
            self._changed(room_id, room)

    def _tell_others(self, room_id: str, user_id: str, typing: bool) -> None:
        if self._on_local_typing is not None:
            self._on_local_typing(room_id, user_id, typing)

    def _expire(self, room_id: str, user_id: str) -> None:
        room = self._rooms[room_id]
        if room.expiries.get(user_id) is gevent.getcurrent():
            del room.expiries[user_id]
            self._changed(room_id, room)
            self._tell_others(room_id, user_id, False)

    def _changed(self, room_id: str, room: _RoomTyping) -> None:
        self.position += 1
        room.position = self.position
        self._on_change(room_id)

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
