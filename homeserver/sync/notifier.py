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

A wake-up of BURST_WAKES syncs or more holds the garbage collector off until each of them has
taken its wake-up (core/collector.py): its pause would delay them all.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable, Iterable

from gevent.event import Event

from homeserver.core.collector import Burst, CollectorHold
from homeserver.storage.rooms import StoredEvent
from homeserver.sync.woken import RecentEvents

log = logging.getLogger(__name__)

# Syncs woken at once from which the collector waits for them (a room of this many members,
# all parked, and one message).
BURST_WAKES = 100

# Up to this many users waiting, a room event reads their memberships alone (a lookup each),
# not the room's whole member list (a row each, 2,000 in a room of 2,000).
FEW_WAITING = 500


class Waiter:
    """One registered sync, registered for as long as its `with` block runs. `woken` is set
    by anything that concerns its user; `recompute` too, unless that was only new room
    events. A class rather than a generator context: every parked sync keeps one."""

    __slots__ = ("woken", "recompute", "burst", "presence", "_notifier", "_user_id")

    def __init__(self, notifier: "Notifier", user_id: str, presence: bool = True):
        self.woken = Event()
        self.recompute = False
        self.burst: Burst | None = None  # the burst it was woken in, until it takes the wake
        self.presence = presence  # woken by presence changes (a sliding sync carries none)
        self._notifier = notifier
        self._user_id = user_id

    def __enter__(self) -> "Waiter":
        self._notifier._add(self._user_id, self)
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self._took_wake()
        self._notifier._remove(self._user_id, self)

    def clear(self) -> None:
        """Taken: what woke it is being computed."""
        self._took_wake()
        self.woken.clear()
        self.recompute = False

    def wake(self, recompute: bool) -> bool:
        """Whether this woke it (it was not woken already)."""
        self.recompute = self.recompute or recompute
        if self.woken.is_set():
            return False
        self.woken.set()
        return True

    def _took_wake(self) -> None:
        if self.burst is not None:
            self.burst.done()
            self.burst = None


class Notifier:
    def __init__(
        self,
        joined_users: Callable[[str], Iterable[str]],
        collector: CollectorHold | None = None,
        joined_among: Callable[[str, list[str]], Iterable[str]] | None = None,
    ):
        """`joined_users(room_id)`: the room's joined members now (a database read);
        `collector`, held while a burst of woken syncs takes its wake-up; `joined_among(
        room_id, user_ids)`: those of `user_ids` joined now (a read of their rows only)."""
        self._joined_users = joined_users
        self._joined_among = joined_among
        self._collector = collector
        self.bursts = 0  # wake-ups that held the collector (weir_collector_holds_total)
        self._waiting: dict[str, set[Waiter]] = {}
        self._count = 0
        # Of those, registrations held between a long-poll's requests
        # (held_registrations.py): woken as any, but no request waits on them.
        self.held = 0
        self.closed = False
        self.recent = RecentEvents()  # heard before anyone is woken: what they answer from
        # With other instances: reads theirs below a local write's positions before the
        # write wakes anyone (sync/cluster.py, `events_below`).
        self.others_below: Callable[[int], None] | None = None

    def registered(self, user_id: str, presence: bool = True) -> Waiter:
        """A sync of `user_id`, registered while its `with` block runs: woken whenever
        something concerning the user happens (presence changes only if `presence`), and
        removed on every way out, a client hang-up (GreenletExit) included."""
        return Waiter(self, user_id, presence)

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
        """Registrations now: whether anyone is to be woken."""
        return self._count

    def parked(self) -> int:
        """Syncs waiting now (the weir_sync_waiters gauge)."""
        return self._count - self.held

    def notify_users(
        self, user_ids: Iterable[str], recompute: bool = True, presence: bool = False
    ) -> None:
        """`presence`: a presence change, which wakes only the syncs that carry it."""
        woken = []
        for user_id in user_ids:
            for waiter in self._waiting.get(user_id, ()):
                if (waiter.presence or not presence) and waiter.wake(recompute):
                    woken.append(waiter)
        if self._collector is not None and len(woken) >= BURST_WAKES:
            burst = self._collector.begin(len(woken))
            self.bursts += 1
            for waiter in woken:
                waiter.burst = burst

    def notify_room(self, room_id: str, also: Iterable[str] = (), recompute: bool = True) -> None:
        """Wakes the room's joined members, and `also`. Nobody waiting: no database read."""
        if not self._waiting:
            return
        # With many syncs waiting, reading the members (a row each) is part of the burst.
        reading: Burst | None = None
        if self._collector is not None and self._count >= BURST_WAKES:
            reading = self._collector.begin(1)
        try:
            try:
                # Only users waiting now can be woken: one who registers during the read
                # registered after the events were stored, and computes with them.
                waiting = list(self._waiting)
                if self._joined_among is not None and len(waiting) <= FEW_WAITING:
                    members = self._joined_among(room_id, waiting)
                else:
                    members = self._joined_users(room_id)
            except Exception:
                # A wake-up, not the record: a sync that misses it still catches up from
                # stream positions at its next wake-up or timeout.
                log.exception("could not read the members of %s to wake their syncs", room_id)
                members = ()
            self.notify_users(itertools.chain(members, also), recompute)
        finally:
            if reading is not None:
                reading.done()

    def notify_presence(self, user_ids: Iterable[str]) -> None:
        """A presence change of someone sharing a room with `user_ids`."""
        self.notify_users(user_ids, presence=True)

    def on_events_persisted(self, stored: list[StoredEvent]) -> None:
        """The rooms persist listener: one batch of events, all in one room."""
        if self.others_below is not None:
            try:
                self.others_below(stored[0].stream_ordering)
            except Exception:  # a sync reaching over the gap reads the database
                log.exception("could not read other instances' events before ours")
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
