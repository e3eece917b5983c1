"""Short-lived registration state: user-interactive auth sessions and admin nonces.

Both live in memory with an expiry and a size cap, so a flood of unauthenticated
requests cannot grow them without bound. A restart forgets them, and clients start over.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict

SESSION_TTL_SECONDS = 600
NONCE_TTL_SECONDS = 60
MAX_ENTRIES = 10_000


class _ExpiringSet:
    def __init__(self, ttl: float, max_entries: int = MAX_ENTRIES, clock=time.monotonic):
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._items: OrderedDict[str, float] = OrderedDict()

    def _expire(self) -> None:
        now = self._clock()
        while self._items:
            key, created = next(iter(self._items.items()))
            if now - created < self._ttl and len(self._items) <= self._max:
                break
            self._items.popitem(last=False)

    def new(self) -> str:
        key = secrets.token_urlsafe(18)
        self._items[key] = self._clock()
        self._expire()
        return key

    def __contains__(self, key: str) -> bool:
        self._expire()
        return key in self._items

    def take(self, key: str) -> bool:
        """True once for a live key, then never again."""
        self._expire()
        return self._items.pop(key, None) is not None


class RegistrationSessions:
    def __init__(self, clock=time.monotonic):
        self.uia = _ExpiringSet(SESSION_TTL_SECONDS, clock=clock)
        self.admin_nonces = _ExpiringSet(NONCE_TTL_SECONDS, clock=clock)
