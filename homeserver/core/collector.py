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
import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import gevent

log = logging.getLogger(__name__)

# However long a burst's requests take, the collector runs again after this.
MAX_HOLD_SECONDS = 2.0
# A collection that holds the hub this long is logged (each one is measured: watch_pauses).
LONG_PAUSE_SECONDS = 0.1
# The oldest generation's threshold while full passes are held: never reached.
_NEVER = 1 << 30


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


def watch_pauses(observe: Callable[[int, float], None]) -> Callable[[str, dict], None]:
    """Times every collection: `observe(generation, seconds)`, and a warning for one that
    held the hub `LONG_PAUSE_SECONDS` or more, so that a stall is never a guess. Returns
    the callback (in `gc.callbacks` until removed)."""
    started: list[float] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
            return
        if not started:
            return
        seconds = time.perf_counter() - started.pop()
        observe(info["generation"], seconds)
        if seconds >= LONG_PAUSE_SECONDS:
            log.warning(
                "a generation %d collection held the hub %.0f ms (%d objects collected)",
                info["generation"],
                seconds * 1000,
                info["collected"],
            )

    gc.callbacks.append(timed)
    return timed


_full_pass_holders = 0
_full_pass_threshold = 10


@contextmanager
def without_full_passes() -> Iterator[None]:
    """Holds the collector's full passes (the oldest generation) off meanwhile; the young
    generations are still collected. For a remote join (rooms/remote_membership.py): its
    answer is millions of containers, none of them garbage until it is stored, and each full
    pass walked all of them, holding the hub 0.4 to 0.7 s at 100,000 events. Cyclic garbage
    of the old generation waits for the end of the last hold; none is lost."""
    global _full_pass_holders, _full_pass_threshold
    if _full_pass_holders == 0:
        young, middle, _full_pass_threshold = gc.get_threshold()
        gc.set_threshold(young, middle, _NEVER)
    _full_pass_holders += 1
    try:
        yield
    finally:
        _full_pass_holders -= 1
        if _full_pass_holders == 0:
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, _full_pass_threshold)
