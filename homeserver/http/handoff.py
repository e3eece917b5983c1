"""Pool mode's handoff of remote media requests to the media pool (ADR-0121, as carried
over in docs/architecture.md, "Budgets" and "Processes").

A request holds a main-pool place while the application runs (http/places.py). A remote
media request that misses the cache would hold it for as long as the remote peer takes, so
it gives it back first:

1. `admitted`: the request's greenlet leaves the main pool (`Pool.discard`), which at once
   has room for another request. It waits on its file outside any pool, like a parked /sync,
   and costs a connection (bounded by `max_connections`) and a greenlet.
2. `new_fetch`: only a request that starts a fetch (the coalescer's leader) takes a
   `media_fetch_budget` ticket (budget/queued.py): one of its client's
   `media_fetch_max_per_client` running fetches, or a place in its client's FIFO queue of
   `media_fetch_max_queued_per_client`; `media_fetch_max_in_flight` in all. Past any cap,
   429 at once. A request for a file already being fetched, by anyone, takes none: it waits
   on that fetch.
3. `fetch_place`: the leader waits for its ticket's turn, then joins the media pool
   (`Pool.add`, waiting while it is full), all inside the request's deadline. So a client
   holds at most `media_fetch_max_per_client` media-pool places, and a tarpit origin at most
   `media_fetch_threads` connections.
4. After the response is written, the connection's handler calls `HandedOff.come_back`, and
   the connection goes back to its listener's waiting stage like any other, to take a
   main-pool place again for its next request.

ADR-0121 refused a client's ninth request at once. A browser's screen asks for every image
and its thumbnail together, and Element does not retry a media 429, so that showed broken
images; a short per-client queue serves the screen and still refuses a flood at once.

Shutdown: after `stop()`, a request that would be handed off answers 503, and one queued for
a media-pool place gives up with 503 when it gets one. A request whose client hangs up while
handed off is stopped (`stop_on_client_disconnect`): if it was still queued, nothing is fetched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gevent import getcurrent
from gevent.pool import Group, Pool

from budget import OutboundDeadline, QueuedBudget, Ticket
from homeserver.core.errors import Codes, MatrixError, limit_exceeded
from homeserver.federation.admission import REFUSAL_RETRY_AFTER_MS, Caller

# Where a handed-off request leaves its HandedOff for the connection's handler.
HANDED_OFF = "weir.handed_off"


def shutting_down() -> MatrixError:
    return MatrixError(503, Codes.UNKNOWN, "The server is shutting down")


class MediaFetchHandoff:
    def __init__(self, main_pool: Pool, media_pool: Pool, fetches: QueuedBudget):
        self.main_pool = main_pool
        self.media_pool = media_pool
        self.fetches = fetches
        # Every request greenlet away from the main pool, handed off now.
        self.away = Group()
        self.stopped = False

    @contextlib.contextmanager
    def admitted(self, caller: Caller):
        """The request out of the main pool, for the body and until its response is written;
        or 503 at once once stopped."""
        if self.stopped:
            raise shutting_down()
        current = getcurrent()
        if current not in self.main_pool:
            raise RuntimeError("a media handoff must start on a request with a main-pool place")
        # From here on the connection's handler brings the request back, once it is answered.
        caller.environ[HANDED_OFF] = HandedOff(self, current)
        self.main_pool.discard(current)
        self.away.add(current)
        with caller.watch_hang_up():
            yield

    @contextlib.contextmanager
    def new_fetch(self, caller: Caller) -> Iterator[Ticket]:
        """A ticket for a fetch this request starts, held until the fetch ends; 429 at once
        when its client's running and queued fetches, or all fetches, are at their caps.
        Never yields to the hub before it returns or refuses."""
        ticket = self.fetches.try_enter(caller.client_key)
        if ticket is None:
            raise limit_exceeded(
                REFUSAL_RETRY_AFTER_MS,
                "Too many remote media requests in flight; try again shortly",
            )
        with ticket:
            yield ticket

    @contextlib.contextmanager
    def fetch_place(self, ticket: Ticket | None, deadline: OutboundDeadline):
        """A media-pool place for the body, once it is the ticket's turn."""
        current = getcurrent()
        with deadline:
            if ticket is not None:
                ticket.wait()  # its client's earlier fetches first
            self.media_pool.add(current)  # waits while the pool is full
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
    """A request away from the main pool, and its way back."""

    def __init__(self, handoff: MediaFetchHandoff, greenlet):
        self._handoff = handoff
        self._greenlet = greenlet

    def come_back(self, keep_alive: bool) -> bool:
        """Called by the connection's handler once the response is written (or failed).
        Returns whether the connection may serve another request (not after a shutdown
        began)."""
        handoff = self._handoff
        handoff.away.discard(self._greenlet)
        return keep_alive and not handoff.stopped
