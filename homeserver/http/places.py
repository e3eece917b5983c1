"""Work places: the main pool counts requests being worked on, not connections
(docs/architecture.md, "A request's path").

A connection lives in its listener's waiting stage (a pool of `server.http.max_connections`)
for its whole life. It takes a place in the work pool (the main pool, or the federation
listener's) only once a request head has been read, to run the application, and gives it back
when the response is written. A parked /sync gives its place back while it waits (`parked`),
and a remote media request while it is handed off (http/handoff.py).

A full work pool makes a ready request wait for a place, at most PLACE_WAIT_SECONDS; the wait
is counted for /metrics (weir_pool_waiting, weir_pool_waits_total,
weir_pool_wait_seconds_total, weir_pool_wait_timeouts_total).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from gevent import getcurrent
from gevent.event import Event
from gevent.pool import Pool

from homeserver.core.errors import Codes, MatrixError
from homeserver.http.disconnect import HangUpWatch, watch_for_hang_up

# Where the handler leaves its listener's WorkPlaces for a blueprint (a parked /sync).
PLACES = "weir.places"
# How long a ready request waits for a place before it is refused with 503. A client's own
# timeout is usually longer; past this the server is overloaded, and saying so lets a load
# balancer or the client retry elsewhere instead of piling up more waiting connections.
PLACE_WAIT_SECONDS = 10.0
BUSY_RETRY_AFTER_SECONDS = 1


def server_busy() -> MatrixError:
    return MatrixError(
        503,
        Codes.UNKNOWN,
        "The server is busy; try again shortly",
        headers={"Retry-After": str(BUSY_RETRY_AFTER_SECONDS)},
    )


class WorkPool(Pool):
    """A work pool that says when a place is freed, however it is (given back, handed off
    to the media pool, or its greenlet ended): WorkPlaces hands it to the first in line."""

    on_release: Callable[[], None] | None = None

    def _discard(self, greenlet):
        super()._discard(greenlet)
        if self.on_release is not None:
            self.on_release()


class WorkPlaces:
    """The places of one work pool, and the figures of waits for them.

    Waiters are served first come, first served: a freed place is handed straight to the
    longest waiting request. The pool's own semaphore would let a request that just arrived
    take it first, so syncs woken together by one event would wait behind their own
    clients' next requests, and the last of them past wait_seconds (503)."""

    def __init__(self, pool: WorkPool, wait_seconds: float = PLACE_WAIT_SECONDS):
        if not isinstance(pool, WorkPool):
            # A plain Pool never says when a place is freed: its waiters would starve.
            raise TypeError("WorkPlaces needs a WorkPool")
        self.pool = pool
        pool.on_release = self._hand_on
        self._queue: deque[tuple[object, Event]] = deque()
        self.wait_seconds = wait_seconds
        self.waiting = 0  # requests waiting for a place now
        self.waits = 0  # requests that found the pool full
        self.waited_seconds = 0.0
        self.timeouts = 0  # requests refused after waiting wait_seconds

    def take(self) -> bool:
        """A place for the current greenlet: at once, or after a wait of at most
        `wait_seconds`. False if none came in time."""
        current = getcurrent()
        if current in self.pool:
            return True
        if not self._queue and not self.pool.full():
            self.pool.add(current)  # room: does not block
            return True
        self.waiting += 1
        self.waits += 1
        started = time.monotonic()
        entry = (current, Event())
        self._queue.append(entry)
        try:
            granted = entry[1].wait(self.wait_seconds)
        finally:
            self.waiting -= 1
            self.waited_seconds += time.monotonic() - started
            if not entry[1].is_set():
                self._queue.remove(entry)
        if not granted:
            self.timeouts += 1
        return granted

    def _hand_on(self) -> None:
        """Freed places to the requests waiting longest, already taken in their name."""
        while self._queue and not self.pool.full():
            greenlet, granted = self._queue.popleft()
            self.pool.add(greenlet)
            granted.set()

    def give_back(self) -> None:
        """Frees the current greenlet's place, if it holds one (Pool.discard of a greenlet
        that is not in the pool would free a place that was never taken)."""
        current = getcurrent()
        if current in self.pool:
            self.pool.discard(current)


class parked:
    """Around a wait that may last long (a /sync with nothing to send yet): the request holds
    no work place meanwhile, and ends at once if its client hangs up. Then a place again, or
    503 if none comes in time; unwinding (a hang-up, a shutdown) needs no place.

    A class, not a generator: every parked sync keeps one, and a suspended generator is
    several objects more to hold and for the collector to walk, thousands of times over."""

    __slots__ = ("_environ", "_places", "_watch")

    def __init__(self, environ: dict):
        self._environ = environ
        self._places: WorkPlaces | None = environ.get(PLACES)
        self._watch: HangUpWatch | None = None

    def __enter__(self) -> None:
        if self._places is not None:
            self._places.give_back()
        self._watch = watch_for_hang_up(self._environ)

    def __exit__(self, kind, value, traceback) -> None:
        if self._watch is not None:
            self._watch.close()
        if kind is None and self._places is not None and not self._places.take():
            raise server_busy()
