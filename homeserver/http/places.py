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

import contextlib
import time

from gevent import getcurrent
from gevent.pool import Pool, PoolFull

from homeserver.core.errors import Codes, MatrixError
from homeserver.http.disconnect import stop_on_client_disconnect

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


class WorkPlaces:
    """The places of one work pool, and the figures of waits for them."""

    def __init__(self, pool: Pool, wait_seconds: float = PLACE_WAIT_SECONDS):
        self.pool = pool
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
        if not self.pool.full():
            self.pool.add(current)  # room: does not block
            return True
        self.waiting += 1
        self.waits += 1
        started = time.monotonic()
        try:
            self.pool.add(current, timeout=self.wait_seconds)
        except PoolFull:
            self.timeouts += 1
            return False
        finally:
            self.waiting -= 1
            self.waited_seconds += time.monotonic() - started
        return True

    def give_back(self) -> None:
        """Frees the current greenlet's place, if it holds one (Pool.discard of a greenlet
        that is not in the pool would free a place that was never taken)."""
        current = getcurrent()
        if current in self.pool:
            self.pool.discard(current)

    @contextlib.contextmanager
    def away(self):
        """Without a place for the body; a place again after it, or 503 if none comes in
        time. Unwinding (a hang-up, a shutdown) needs no place."""
        self.give_back()
        yield
        if not self.take():
            raise server_busy()


@contextlib.contextmanager
def parked(environ: dict):
    """Around a wait that may last long (a /sync with nothing to send yet): the request holds
    no work place meanwhile, and ends at once if its client hangs up."""
    places: WorkPlaces | None = environ.get(PLACES)
    away = places.away() if places is not None else contextlib.nullcontext()
    with away, stop_on_client_disconnect(environ):
        yield
