"""Holding the cyclic garbage collector off while a burst of waiting requests is answered.

One message wakes every parked /sync of its room's members at once. A collection that runs
in that moment delays every one of them, and with thousands of connections open a full one
walks all of their objects (a third of a second and more: docs/operations.md, "Sizing"). The
allocations of the burst itself are what would start one. So the notifier holds the
collector for a large wake-up (sync/notifier.py): it runs again once the last woken request
is done with its wake-up, or after `max_seconds` whatever happens. Reference counting frees
everything meanwhile, and a request leaves no reference cycle (http/routing.py), so nothing
piles up; a collection that was due runs right after the burst.
"""

from __future__ import annotations

import gc

import gevent

# However long a burst's requests take, the collector runs again after this.
MAX_HOLD_SECONDS = 2.0


class Burst:
    """One burst of `left` requests; each says `done` once, and the last ends the hold."""

    __slots__ = ("left", "_hold", "_timer")

    def __init__(self, hold: "CollectorHold", left: int, timer):
        self.left = left
        self._hold: CollectorHold | None = hold  # None once ended
        self._timer = timer

    def done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.end()

    def end(self) -> None:
        """Ends the burst now (its time is up); once is enough, and more are harmless."""
        hold, self._hold = self._hold, None
        if hold is not None:
            self._timer.close()
            hold._ended(self)


class CollectorHold:
    """Off while any burst is running; on again after the last, unless it was off before."""

    def __init__(self, max_seconds: float = MAX_HOLD_SECONDS):
        self.max_seconds = max_seconds
        self._bursts: set[Burst] = set()
        self._turned_off = False

    def begin(self, requests: int) -> Burst:
        timer = gevent.get_hub().loop.timer(self.max_seconds)
        burst = Burst(self, requests, timer)
        timer.start(burst.end)
        self._bursts.add(burst)
        if not self._turned_off and gc.isenabled():
            gc.disable()
            self._turned_off = True
        return burst

    def held(self) -> bool:
        return bool(self._bursts)

    def _ended(self, burst: Burst) -> None:
        self._bursts.discard(burst)
        if not self._bursts and self._turned_off:
            self._turned_off = False
            gc.enable()
