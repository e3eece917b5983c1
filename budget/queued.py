"""Running places per key, with a short FIFO queue per key behind them (ADR-0121, as Weir
carries it over: docs/architecture.md, "Budgets").

An :class:`InFlightBudget` refuses the moment a key's cap is reached. That is right for work
whose every unit is a separate attacker's lever, but it refuses a browser's ordinary burst: a
screen of twenty images from one address. A :class:`QueuedBudget` lets a key run up to
``running_per_key`` units at once and queue up to ``queued_per_key`` more, first come first
served, while every key together holds at most ``global_cap`` units, running or queued. Past
any of the three caps :meth:`try_enter` refuses at once, as the ADR asks: the queue is short
and bounded, so an overload still costs nothing.

Greenlet-only (it waits on gevent events): every method runs in the hub's thread, and none
yields except :meth:`Ticket.wait`.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType
from typing import Literal

from gevent.event import Event

from budget.inflight import _cap

__all__ = ["QueuedBudget", "Ticket"]

_QUEUED, _RUNNING, _RELEASED = "queued", "running", "released"


class Ticket:
    """One admitted unit of work: queued behind its key's running ones, or running.

    :meth:`wait` returns once it runs. Use the ticket as a context manager (or call
    :meth:`release`) so that it is given up on every path, a timeout while queued included.
    """

    __slots__ = ("_budget", "key", "_state", "_turn")

    def __init__(self, budget: QueuedBudget, key: str, running: bool) -> None:
        self._budget = budget
        self.key = key
        self._state = _RUNNING if running else _QUEUED
        self._turn: Event | None = None if running else Event()

    @property
    def running(self) -> bool:
        return self._state == _RUNNING

    def wait(self) -> None:
        """Until this ticket's turn comes. Bound it with the caller's deadline."""
        if self._turn is not None:
            self._turn.wait()

    def release(self) -> None:
        """Idempotent. A running ticket hands its place to the next one queued for its key."""
        self._budget._release(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self.release()
        return False

    def __repr__(self) -> str:
        return f"<Ticket {self._budget.name!r} key={self.key!r} {self._state}>"


class _KeyState:
    __slots__ = ("running", "queue")

    def __init__(self) -> None:
        self.running = 0
        self.queue: deque[Ticket] = deque()


class QueuedBudget:
    """``running_per_key`` running and ``queued_per_key`` queued per key; ``global_cap`` in
    all. Keys with nothing running or queued are forgotten."""

    def __init__(
        self, global_cap: int, running_per_key: int, queued_per_key: int, name: str = ""
    ) -> None:
        self._name = name
        self._global_cap = _cap(global_cap, "global_cap")
        self._running_cap = _cap(running_per_key, "running_per_key")
        self._queued_cap = _cap(queued_per_key, "queued_per_key", minimum=0)
        self._keys: dict[str, _KeyState] = {}
        self._in_flight = 0
        self._queued = 0
        self._refusals = 0

    def try_enter(self, key: str) -> Ticket | None:
        """A ticket for ``key``, running or queued; None at once when a cap is reached."""
        state = self._keys.get(key)
        if state is None:
            state = _KeyState()
        can_run = state.running < self._running_cap and not state.queue
        if self._in_flight >= self._global_cap or (
            not can_run and len(state.queue) >= self._queued_cap
        ):
            self._refusals += 1
            return None
        self._keys[key] = state
        ticket = Ticket(self, key, running=can_run)
        if can_run:
            state.running += 1
        else:
            state.queue.append(ticket)
            self._queued += 1
        self._in_flight += 1
        return ticket

    def _release(self, ticket: Ticket) -> None:
        if ticket._state == _RELEASED:
            return
        state = self._keys[ticket.key]
        if ticket._state == _QUEUED:
            state.queue.remove(ticket)
            self._queued -= 1
        else:
            state.running -= 1
            if state.queue:
                self._start(state, state.queue.popleft())
        ticket._state = _RELEASED
        self._in_flight -= 1
        if not state.running and not state.queue:
            del self._keys[ticket.key]

    def _start(self, state: _KeyState, ticket: Ticket) -> None:
        self._queued -= 1
        state.running += 1
        ticket._state = _RUNNING
        assert ticket._turn is not None
        ticket._turn.set()

    @property
    def name(self) -> str:
        return self._name

    @property
    def global_cap(self) -> int:
        return self._global_cap

    @property
    def in_flight(self) -> int:
        """Tickets held, running or queued."""
        return self._in_flight

    @property
    def queued(self) -> int:
        return self._queued

    def running_for(self, key: str) -> int:
        state = self._keys.get(key)
        return state.running if state else 0

    def queued_for(self, key: str) -> int:
        state = self._keys.get(key)
        return len(state.queue) if state else 0

    @property
    def refusals(self) -> int:
        """Total refused entries since creation (a metric; never reset)."""
        return self._refusals

    def snapshot(self) -> dict:
        """The figures for metrics, shaped as InFlightBudget's, plus the queue."""
        return {
            "name": self._name,
            "in_flight": self._in_flight,
            "queued": self._queued,
            "global_cap": self._global_cap,
            "per_key_cap": self._running_cap,
            "keys": len(self._keys),
            "refusals": self._refusals,
        }

    def __repr__(self) -> str:
        return (
            f"<QueuedBudget {self._name!r} {self._in_flight}/{self._global_cap}"
            f" ({self._queued} queued) keys={len(self._keys)}>"
        )
