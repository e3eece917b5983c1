"""TtlCache: a bounded LRU map whose entries expire, for answers worth keeping a little while
(discovery results, remote room lists). Bounded, so distinct keys cannot grow it."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable


class TtlCache:
    def __init__(self, clock: Callable[[], float], size: int):
        self._clock = clock
        self._size = size
        self._entries: OrderedDict = OrderedDict()

    def get(self, key):
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key, value, ttl: float) -> None:
        self._entries[key] = (value, self._clock() + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def discard(self, key) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
