"""Bounded in-flight admission (ADR-0079, ADR-0121).

An :class:`InFlightBudget` counts work in flight, in total and per key (a
client key), and refuses at once when either cap is reached. It never waits:
a refused request must cost nothing, and a queue would only turn an overload
into a slower overload holding the same resources. Where a client's ordinary
burst exceeds its cap (a screen of images), budget/queued.py adds a short,
bounded queue per key.
"""

from __future__ import annotations

import operator
from types import TracebackType
from typing import Literal

from budget._lock import allocate_lock

__all__ = ["InFlightBudget", "Slot"]


def _cap(value: int, what: str, minimum: int = 1) -> int:
    # operator.index refuses floats and strings; a fractional cap is a bug.
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {n}")
    return n


class Slot:
    """One admitted unit of work, returned by :meth:`InFlightBudget.try_acquire`.

    Use it as a context manager so it is released on every path, including
    ``gevent.Timeout`` and ``GreenletExit`` (both BaseException). ``release()``
    is idempotent and may be called from any greenlet or OS thread.
    """

    __slots__ = ("_budget", "_key", "_released")

    def __init__(self, budget: InFlightBudget, key: str) -> None:
        self._budget = budget
        self._key = key
        self._released = False

    @property
    def key(self) -> str:
        return self._key

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        # The flag is checked and set under the budget's lock, so two threads
        # releasing the same slot decrement the counts exactly once.
        self._budget._release(self)

    def __enter__(self) -> Slot:
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
        state = "released" if self._released else "held"
        return f"<Slot {self._budget.name!r} key={self._key!r} {state}>"

    # No __del__: a finalizer can run while this thread already holds the
    # budget's (non-reentrant) lock, and would deadlock it.


class InFlightBudget:
    """A global cap plus an optional per-key cap on work in flight.

    ``try_acquire(key)`` returns a :class:`Slot`, or ``None`` at once when
    the global cap or the key's cap is reached. Keys whose count drops to
    zero are forgotten, so memory is bounded by the number of slots held.

    Thread- and greenlet-safe: see :mod:`budget._lock`.
    """

    __slots__ = (
        "_name",
        "_global_cap",
        "_per_key_cap",
        "_lock",
        "_counts",
        "_in_flight",
        "_refusals",
    )

    def __init__(self, global_cap: int, per_key_cap: int | None, name: str = "") -> None:
        self._name = name
        self._global_cap = _cap(global_cap, "global_cap")
        self._per_key_cap = None if per_key_cap is None else _cap(per_key_cap, "per_key_cap")
        self._lock = allocate_lock()
        self._counts: dict[str, int] = {}
        self._in_flight = 0
        self._refusals = 0

    def try_acquire(self, key: str) -> Slot | None:
        """Take a slot for ``key``, or return None at once if a cap is reached."""
        per_key_cap = self._per_key_cap
        with self._lock:
            if self._in_flight >= self._global_cap:
                self._refusals += 1
                return None
            n = self._counts.get(key, 0)
            if per_key_cap is not None and n >= per_key_cap:
                self._refusals += 1
                return None
            self._counts[key] = n + 1
            self._in_flight += 1
        return Slot(self, key)

    def _release(self, slot: Slot) -> None:
        with self._lock:
            if slot._released:
                return
            slot._released = True
            key = slot._key
            n = self._counts[key] - 1
            if n:
                self._counts[key] = n
            else:
                # Forget idle keys: memory stays proportional to what is held.
                del self._counts[key]
            self._in_flight -= 1

    # Single int/dict reads are atomic under the GIL; no lock needed.

    @property
    def name(self) -> str:
        return self._name

    @property
    def global_cap(self) -> int:
        return self._global_cap

    @property
    def per_key_cap(self) -> int | None:
        return self._per_key_cap

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def in_flight_for(self, key: str) -> int:
        return self._counts.get(key, 0)

    @property
    def refusals(self) -> int:
        """Total refused acquires since creation (a metric; never reset)."""
        return self._refusals

    def snapshot(self) -> dict:
        """A consistent view for metrics and admin endpoints."""
        with self._lock:
            return {
                "name": self._name,
                "in_flight": self._in_flight,
                "global_cap": self._global_cap,
                "per_key_cap": self._per_key_cap,
                "keys": len(self._counts),
                "refusals": self._refusals,
            }

    def __repr__(self) -> str:
        return (
            f"<InFlightBudget {self._name!r} {self._in_flight}/{self._global_cap}"
            f" per_key_cap={self._per_key_cap} keys={len(self._counts)}>"
        )
