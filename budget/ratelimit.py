"""Per-key token-bucket rate limiting (key_resolution_per_ip_rate and friends)."""

from __future__ import annotations

import math
import operator
import time
from collections import OrderedDict
from typing import Callable, NamedTuple

from budget._lock import allocate_lock

__all__ = ["Decision", "RateLimiter"]

# Float slack when comparing times, so a caller who waits exactly the
# retry_after_ms it was given is not refused by a rounding error.
_EPSILON = 1e-9


class Decision(NamedTuple):
    """The answer of :meth:`RateLimiter.check` / :meth:`RateLimiter.peek`.

    ``retry_after_ms`` is 0 when allowed; when refused it is the time until
    one token is available, rounded up, at least 1.

    Truthiness follows ``allowed`` (a plain tuple would always be true, and
    ``if limiter.check(key):`` would then admit everything).
    """

    allowed: bool
    retry_after_ms: int

    def __bool__(self) -> bool:
        return self.allowed


_ALLOWED = Decision(True, 0)


class RateLimiter:
    """A token bucket per key.

    Each key has a bucket of ``max_requests`` tokens, refilled continuously
    at ``max_requests / per_seconds`` tokens a second; ``check`` spends one.

    Storage: one float per key, the time at which its bucket will be full
    again (a bucket that is full is the same as no entry at all, so it is
    dropped). The entries are kept in least-recently-used order.

    Memory bound: at most ``max_keys`` entries, ever. Only a new key grows
    the table, and before it is added, full buckets are dropped from the LRU
    end (amortised O(1)); any entry untouched for ``per_seconds`` is full,
    so idle keys make way for new ones. If a new key arrives while
    ``max_keys`` entries are all still refilling, the least recently used
    one is evicted anyway. That errs toward allowing: the evicted key starts
    again with a full bucket. Under a flood of distinct keys this can only
    let an individual key through early, never refuse one.

    Thread- and greenlet-safe: see :mod:`budget._lock`.
    """

    __slots__ = (
        "_max_requests",
        "_per_seconds",
        "_interval",
        "_slack",
        "_clock",
        "_max_keys",
        "_full_at",
        "_lock",
        "_refusals",
    )

    def __init__(
        self,
        max_requests: int,
        per_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        try:
            max_requests = operator.index(max_requests)
        except TypeError:
            raise ValueError(
                f"max_requests must be an integer >= 1, got {max_requests!r}"
            ) from None
        if isinstance(max_requests, bool) or max_requests < 1:
            raise ValueError(f"max_requests must be an integer >= 1, got {max_requests!r}")
        per_seconds = float(per_seconds)
        if not (per_seconds > 0 and math.isfinite(per_seconds)):
            raise ValueError(f"per_seconds must be a finite number > 0, got {per_seconds!r}")
        max_keys = operator.index(max_keys)
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        self._max_requests = max_requests
        self._per_seconds = per_seconds
        # Seconds to refill one token.
        self._interval = per_seconds / max_requests
        # Debt a bucket may carry and still have a token: max_requests - 1 intervals.
        self._slack = per_seconds - self._interval
        self._clock = clock
        self._max_keys = max_keys
        self._full_at: OrderedDict[str, float] = OrderedDict()
        self._lock = allocate_lock()
        self._refusals = 0

    @property
    def max_requests(self) -> int:
        return self._max_requests

    @property
    def per_seconds(self) -> float:
        return self._per_seconds

    @property
    def max_keys(self) -> int:
        return self._max_keys

    # A property, not __len__: an empty limiter must not be falsy, or
    # "if limiter:" (is one configured?) would read as "no".
    @property
    def tracked_keys(self) -> int:
        """Number of keys currently tracked (buckets not yet full)."""
        return len(self._full_at)

    @property
    def refusals(self) -> int:
        """Total refused ``check`` calls since creation (a metric; never reset)."""
        return self._refusals

    def check(self, key: str) -> Decision:
        """Spend one token of ``key``'s bucket if there is one."""
        with self._lock:
            now = self._clock()
            buckets = self._full_at
            full_at = buckets.get(key)
            if full_at is None:
                # A new (or forgotten) key has a full bucket. Only new keys
                # grow the table, so this is where it is kept in bounds.
                self._make_room(now)
                buckets[key] = now + self._interval
                return _ALLOWED
            # Debt = seconds until the bucket is full; each token is one interval.
            debt = full_at - now
            # Touched even when refused: a key being hammered is the last
            # one we want to forget (forgetting it errs toward allowing).
            buckets.move_to_end(key)
            if debt <= 0.0:
                debt = 0.0
            elif debt > self._slack + _EPSILON:
                self._refusals += 1
                return self._refusal(debt - self._slack)
            buckets[key] = now + debt + self._interval
            return _ALLOWED

    def peek(self, key: str) -> Decision:
        """What ``check`` would answer now, without spending a token."""
        with self._lock:
            full_at = self._full_at.get(key)
            if full_at is None:
                return _ALLOWED
            debt = full_at - self._clock()
            if debt > self._slack + _EPSILON:
                return self._refusal(debt - self._slack)
            return _ALLOWED

    @staticmethod
    def _refusal(wait_seconds: float) -> Decision:
        # Round to the nanosecond first so float noise (2000.0000000001 ms)
        # does not add a whole millisecond. Never coarser: rounding 40.0004
        # down to 40 would send the caller back too early. What rounding
        # drops (<= 0.5 ns) is within _EPSILON, so the retry is allowed.
        ms = math.ceil(round(wait_seconds * 1000.0, 6))
        return Decision(False, max(1, ms))

    def _make_room(self, now: float) -> None:
        # Called with the lock held, before inserting a new key. Full
        # buckets at the LRU end carry no information: drop them (each
        # entry is dropped once, so this is amortised O(1)). Stop at the
        # first one still refilling.
        buckets = self._full_at
        while buckets:
            oldest = next(iter(buckets))
            if buckets[oldest] > now:
                break
            del buckets[oldest]
        while len(buckets) >= self._max_keys:
            # Everything left is still refilling. Forget the least recently
            # used: errs toward allowing (it starts again with a full bucket).
            buckets.popitem(last=False)

    def __repr__(self) -> str:
        return f"<RateLimiter {self._max_requests}/{self._per_seconds}s keys={len(self._full_at)}>"
