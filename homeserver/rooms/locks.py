"""Per-key gevent locks that exist only while someone holds or waits for them."""

from __future__ import annotations

from contextlib import contextmanager

from gevent.lock import Semaphore


class KeyedLocks:
    """`with locks.hold(room_id):` serialises the greenlets working on one room, and no
    other. An entry is dropped when its last holder or waiter leaves, so memory stays
    proportional to the rooms in use right now, not to every room ever touched."""

    def __init__(self):
        self._entries: dict[str, list] = {}  # key -> [Semaphore, holders and waiters]

    @contextmanager
    def hold(self, key: str):
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = [Semaphore(1), 0]
        entry[1] += 1
        try:
            # A Timeout or kill while waiting leaves the semaphore untouched; the count is
            # undone in `finally` either way.
            with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
