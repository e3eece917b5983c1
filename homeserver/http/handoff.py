"""Pool mode's handoff of remote media requests to the media pool (ADR-0121;
docs/architecture.md, "Processes").

A request holds a main-pool place while the application runs (http/places.py). A remote
media request that misses the cache would hold it for as long as the remote peer takes, so
it gives it back first:

1. `admitted`: take a `media_fetch_budget` slot (429 at once over either cap), then the
   request's greenlet leaves the main pool (`Pool.discard`), which at once has room for
   another request. Every greenlet away from the main pool holds a slot, so there are never
   more of them than `media_fetch_max_in_flight`.
2. `fetch_place`: only the request that starts a fetch (the coalescer's leader) joins the
   media pool (`Pool.add`, waiting while it is full, inside the request's deadline). Waiters
   on a fetch already running wait outside it, holding only their slot.
3. After the response is written, the connection's handler calls `HandedOff.come_back`: the
   slot is freed, and the connection goes back to its listener's waiting stage like any
   other, to take a main-pool place again for its next request.

Shutdown: after `stop()`, a request that would be handed off answers 503, and one queued for
a media-pool place gives up with 503 when it gets one. A request whose client hangs up while
handed off is stopped (`stop_on_client_disconnect`): if it was still queued, nothing is fetched.
"""

from __future__ import annotations

import contextlib

from gevent import getcurrent
from gevent.pool import Group, Pool

from budget import InFlightBudget, OutboundDeadline, Slot
from homeserver.core.errors import Codes, MatrixError, limit_exceeded
from homeserver.federation.admission import REFUSAL_RETRY_AFTER_MS, Caller

# Where a handed-off request leaves its HandedOff for the connection's handler.
HANDED_OFF = "weir.handed_off"


def shutting_down() -> MatrixError:
    return MatrixError(503, Codes.UNKNOWN, "The server is shutting down")


class MediaFetchHandoff:
    def __init__(self, main_pool: Pool, media_pool: Pool, budget: InFlightBudget):
        self.main_pool = main_pool
        self.media_pool = media_pool
        self.budget = budget
        # Every request greenlet away from the main pool, handed off now.
        self.away = Group()
        self.stopped = False

    @contextlib.contextmanager
    def admitted(self, caller: Caller):
        """Holds a media_fetch_budget slot, with the request out of the main pool, for the
        body and until its response is written; or refuses at once (429, or 503 once stopped).
        """
        if self.stopped:
            raise shutting_down()
        slot = self.budget.try_acquire(caller.client_key)
        if slot is None:
            raise limit_exceeded(
                REFUSAL_RETRY_AFTER_MS,
                "Too many remote media requests in flight; try again shortly",
            )
        current = getcurrent()
        if current not in self.main_pool:
            slot.release()
            raise RuntimeError("a media handoff must start on a request with a main-pool place")
        # From here on the slot is the handler's to release, once the response is written.
        caller.environ[HANDED_OFF] = HandedOff(self, slot, current)
        self.main_pool.discard(current)
        self.away.add(current)
        with caller.watch_hang_up():
            yield

    @contextlib.contextmanager
    def fetch_place(self, deadline: OutboundDeadline):
        """A media-pool place for the body, for the request that runs a fetch."""
        current = getcurrent()
        with deadline:
            self.media_pool.add(current)  # waits while the pool is full, within the deadline
        try:
            if self.stopped:
                raise shutting_down()
            yield
        finally:
            self.media_pool.discard(current)

    def stop(self) -> None:
        """No more handoffs: later ones answer 503. Called first thing on shutdown."""
        self.stopped = True


class HandedOff:
    """A request away from the main pool: its slot, and its way back."""

    def __init__(self, handoff: MediaFetchHandoff, slot: Slot, greenlet):
        self._handoff = handoff
        self._slot = slot
        self._greenlet = greenlet

    def come_back(self, keep_alive: bool) -> bool:
        """Called by the connection's handler once the response is written (or failed).
        Frees the slot; returns whether the connection may serve another request (not after
        a shutdown began)."""
        self._slot.release()
        handoff = self._handoff
        handoff.away.discard(self._greenlet)
        return keep_alive and not handoff.stopped
