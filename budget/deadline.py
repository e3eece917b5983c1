"""One total deadline across all the steps of an outbound call (ADR-0079).

Discovery (well-known, DNS) and every request after it draw from one
:class:`OutboundDeadline`. Entering it arms a ``gevent.Timeout`` for what is
left, which interrupts whatever the greenlet is blocked on (connect, TLS,
body reads, a pool place). ``step_timeout`` gives each step's socket
timeouts the same remainder, so the socket and the deadline agree.
"""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import Literal

import gevent
from gevent import getcurrent

__all__ = ["DeadlineExceeded", "OutboundDeadline"]


class DeadlineExceeded(Exception):
    """An outbound call ran out of its total deadline.

    An ``Exception`` (unlike ``gevent.Timeout``) so that ordinary error
    handling maps it, e.g. to 504.
    """

    def __init__(self, seconds: float, elapsed: float, what: str = "") -> None:
        # All fields go to args, so the exception pickles (shard IPC) and
        # compares as a plain value.
        super().__init__(seconds, elapsed, what)
        self.seconds = seconds
        self.elapsed = elapsed
        self.what = what

    def __str__(self) -> str:
        msg = f"deadline of {self.seconds!r}s exceeded after {self.elapsed:.2f}s"
        return f"{msg} ({self.what})" if self.what else msg


class _DeadlineTimeout(gevent.Timeout):
    """The Timeout a deadline arms, tagged with its owner.

    Only a Timeout whose owner is this deadline is converted; any other
    (another deadline's, or a foreign ``gevent.Timeout``) passes through.
    """

    def __init__(self, seconds: float, owner: OutboundDeadline) -> None:
        super().__init__(seconds)
        self.owner = owner


class OutboundDeadline:
    """A total deadline of ``seconds``, counted from construction.

    The clock starts when the object is made, not when it is entered: time
    spent before the first step (waiting for a pool place, queueing for a
    slot) counts against it. Make it as early as the request is known.

    Use::

        d = OutboundDeadline(10, what="publicRooms from example.org")
        with d:
            target = discover(server, timeout=d.step_timeout(5))
        d.check()                     # between steps, outside any ``with``
        with d:
            http.request(..., timeout=d.step_timeout(None))

    Entering arms a ``gevent.Timeout`` for ``remaining()``; if it fires inside
    the ``with``, ``__exit__`` turns it into :class:`DeadlineExceeded`. The
    conversion happens at exit on purpose: ``gevent.Timeout`` is a
    BaseException, so it gets through code that catches ``Exception``
    broadly, where a ``DeadlineExceeded`` raised mid-step could be swallowed.

    Entering an already expired deadline raises :class:`DeadlineExceeded` at
    once. The same object may be entered again (for the next step) or nested;
    nested deadlines each convert only their own Timeout, so an outer,
    shorter deadline firing inside an inner one propagates through the inner
    and is converted by the outer.

    A deadline belongs to one request but may be entered by several
    greenlets of it at once: armed timeouts are kept per greenlet.
    """

    __slots__ = ("_seconds", "_what", "_start", "_armed")

    def __init__(self, seconds: float, what: str = "") -> None:
        seconds = float(seconds)
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        self._seconds = seconds
        self._what = what
        self._start = time.monotonic()
        # greenlet -> stack of armed timeouts (re-entry and nesting)
        self._armed: dict = {}

    @property
    def seconds(self) -> float:
        return self._seconds

    @property
    def what(self) -> str:
        return self._what

    def elapsed(self) -> float:
        """Seconds since construction."""
        return time.monotonic() - self._start

    def remaining(self) -> float:
        """Seconds left, never negative."""
        left = self._seconds - (time.monotonic() - self._start)
        return left if left > 0 else 0.0

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0

    def check(self, slack: float = 0.0) -> None:
        """Raise :class:`DeadlineExceeded` now if the deadline has passed, or has at most
        ``slack`` seconds left. A socket given ``step_timeout()`` may time out a moment
        before the deadline's own timer (the event loop's clock lags ``time.monotonic``):
        checking with a little slack then names the deadline, not the socket."""
        if self.remaining() <= slack:
            raise self._exceeded()

    def step_timeout(self, cap: float | None = None) -> float:
        """The timeout to give one step: ``min(cap, remaining())``.

        For urllib3's and dnspython's own timeouts. Raises
        :class:`DeadlineExceeded` if nothing is left, rather than returning 0,
        which a socket would take to mean "non-blocking" and fail with a
        misleading connection error.
        """
        left = self.remaining()
        if left <= 0:
            raise self._exceeded()
        return left if cap is None or cap > left else cap

    def start(self) -> OutboundDeadline:
        """Arm a ``gevent.Timeout`` for what is left, in the current greenlet.

        ``with`` does this and its undo; call ``start``/``cancel`` in pairs
        only where a ``with`` cannot be used, and note that without the
        ``with`` the raw ``gevent.Timeout`` is not converted (see :meth:`owns`).
        """
        left = self.remaining()
        if left <= 0:
            raise self._exceeded()
        timeout = _DeadlineTimeout(left, self)
        g = getcurrent()
        stack = self._armed.get(g)
        if stack is None:
            stack = self._armed[g] = []
        stack.append(timeout)
        timeout.start()
        return self

    def cancel(self) -> None:
        """Disarm the timeout most recently armed in this greenlet by :meth:`start`."""
        g = getcurrent()
        stack = self._armed.get(g)
        if not stack:
            return
        timeout = stack.pop()
        if not stack:
            del self._armed[g]
        timeout.close()

    def owns(self, exc: BaseException | None) -> bool:
        """True if ``exc`` is a Timeout this deadline armed."""
        return type(exc) is _DeadlineTimeout and exc.owner is self

    def __enter__(self) -> OutboundDeadline:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self.cancel()
        if exc is not None and self.owns(exc):
            raise self._exceeded() from exc
        return False

    def _exceeded(self) -> DeadlineExceeded:
        return DeadlineExceeded(self._seconds, self.elapsed(), self._what)

    def __repr__(self) -> str:
        label = f" {self._what!r}" if self._what else ""
        return f"<OutboundDeadline{label} {self._seconds!r}s remaining={self.remaining():.3f}s>"
