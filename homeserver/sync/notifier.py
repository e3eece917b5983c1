"""Wakes waiting /sync requests when something they would return has happened.

A waiting sync registers under its user and parks on its own gevent Event: no polling, and no
timer but its own timeout. It registers *before* it computes its response, so anything stored
while it computes sets the Event and the sync computes again instead of parking: there is no
window in which a wake-up can be lost.

Whom to wake comes from an index user_id -> registrations. A room event concerns the room's
joined members (read once per stored batch, and only while anyone is waiting at all) and the
target of a membership event, who may have just left or been invited; account data concerns
its owner; receipts and typing the room's members. Waking costs O(users concerned), never
O(waiting syncs).

A sync woken only by new room events may answer from the recent events themselves
(sync/woken.py); anything else marks it to compute its whole answer again.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable, Iterable

from gevent.event import Event

from homeserver.storage.rooms import StoredEvent
from homeserver.sync.woken import RecentEvents

log = logging.getLogger(__name__)


class Waiter:
    """One registered sync, registered for as long as its `with` block runs. `woken` is set
    by anything that concerns its user; `recompute` too, unless that was only new room
    events. A class rather than a generator context: every parked sync keeps one."""

    __slots__ = ("woken", "recompute", "_notifier", "_user_id")

    def __init__(self, notifier: "Notifier", user_id: str):
        self.woken = Event()
        self.recompute = False
        self._notifier = notifier
        self._user_id = user_id

    def __enter__(self) -> "Waiter":
        self._notifier._add(self._user_id, self)
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self._notifier._remove(self._user_id, self)

    def clear(self) -> None:
        self.woken.clear()
        self.recompute = False

    def wake(self, recompute: bool) -> None:
        self.recompute = self.recompute or recompute
        self.woken.set()


class Notifier:
    def __init__(self, joined_users: Callable[[str], Iterable[str]]):
        """`joined_users(room_id)`: the room's joined members now (a database read)."""
        self._joined_users = joined_users
        self._waiting: dict[str, set[Waiter]] = {}
        self._count = 0
        self.closed = False
        self.recent = RecentEvents()  # heard before anyone is woken: what they answer from

    def registered(self, user_id: str) -> Waiter:
        """A sync of `user_id`, registered while its `with` block runs: woken whenever
        something concerning the user happens, and removed on every way out, a client
        hang-up (GreenletExit) included."""
        return Waiter(self, user_id)

    def _add(self, user_id: str, waiter: Waiter) -> None:
        if self.closed:
            waiter.wake(recompute=True)
        self._waiting.setdefault(user_id, set()).add(waiter)
        self._count += 1

    def _remove(self, user_id: str, waiter: Waiter) -> None:
        waiters = self._waiting[user_id]
        waiters.discard(waiter)
        self._count -= 1
        if not waiters:
            del self._waiting[user_id]

    def waiting(self) -> int:
        """Syncs registered now (the weir_sync_waiters gauge)."""
        return self._count

    def notify_users(self, user_ids: Iterable[str], recompute: bool = True) -> None:
        for user_id in user_ids:
            for waiter in self._waiting.get(user_id, ()):
                waiter.wake(recompute)

    def notify_room(self, room_id: str, also: Iterable[str] = (), recompute: bool = True) -> None:
        """Wakes the room's joined members, and `also`. Nobody waiting: no database read."""
        if not self._waiting:
            return
        try:
            members = self._joined_users(room_id)
        except Exception:
            # A wake-up, not the record: a sync that misses it still catches up from stream
            # positions at its next wake-up or timeout.
            log.exception("could not read the members of %s to wake their syncs", room_id)
            members = ()
        self.notify_users(itertools.chain(members, also), recompute)

    def on_events_persisted(self, stored: list[StoredEvent]) -> None:
        """The rooms persist listener: one batch of events, all in one room."""
        self.recent.add(stored)
        # A member event's state_key is the user it is about; one without it names nobody.
        members = (s.event.state_key for s in stored if s.event.type == "m.room.member")
        targets = {user_id for user_id in members if user_id is not None}
        self.notify_room(stored[0].event.room_id, targets, recompute=False)

    def close(self) -> None:
        """Shutting down: every waiting sync returns now, and none parks again."""
        self.closed = True
        for waiters in list(self._waiting.values()):
            for waiter in waiters:
                waiter.wake(recompute=True)
