"""RequesterCache: who an access token belongs to, kept in memory so that a request that
authenticates (every /sync, whoami) does not wait on a database read."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

from homeserver.core.requester import Requester

# Tokens in use at once: past this, the least recently used is read again from the database.
CACHE_SIZE = 10_000
# The longest a cached answer is believed: a change this process did not make itself and was
# not told of (a row deleted by hand) is seen within this time. Every change this process
# makes is seen at once, and another instance's as soon as its notification arrives
# (storage/cluster_memory.py, sync/cluster.py).
CACHE_TTL_SECONDS = 30.0


class RequesterCache:
    """Token hash -> Requester, a bounded LRU whose entries expire. Misses are not kept: an
    unknown token costs a read each time, and cannot push the real ones out.

    A read that raced a logout must not put back what the logout removed, so `put` takes the
    `generation` seen before the read and drops the entry if anything was forgotten since.
    """

    def __init__(
        self,
        size: int = CACHE_SIZE,
        ttl: float = CACHE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._size = size
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[Requester, float]] = OrderedDict()
        # (user ID, device ID) -> its token's hash: a device has one token at a time.
        self._by_device: dict[tuple[str, str], str] = {}
        self.generation = 0

    def get(self, token_hash: str) -> Requester | None:
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        requester, expires_at = entry
        if expires_at <= self._clock():
            self._discard(token_hash)
            return None
        self._entries.move_to_end(token_hash)
        return requester

    def put(self, requester: Requester, generation: int) -> None:
        if generation != self.generation:
            return
        device = (requester.user_id, requester.device_id)
        previous = self._by_device.get(device)
        if previous is not None and previous != requester.token_hash:
            self._discard(previous)
        self._entries[requester.token_hash] = (requester, self._clock() + self._ttl)
        self._entries.move_to_end(requester.token_hash)
        self._by_device[device] = requester.token_hash
        while len(self._entries) > self._size:
            oldest = next(iter(self._entries))
            self._discard(oldest)

    def forget_devices(self, user_id: str, device_ids: list[str]) -> None:
        """The devices' tokens are gone (logout, device deletion, a new login that reuses
        the device ID)."""
        self.generation += 1
        for device_id in device_ids:
            token_hash = self._by_device.get((user_id, device_id))
            if token_hash is not None:
                self._discard(token_hash)

    def forget_user(self, user_id: str) -> None:
        """Every token of the user: deactivated, or made or unmade an admin."""
        self.generation += 1
        devices = [device_id for user, device_id in self._by_device if user == user_id]
        for device_id in devices:
            self._discard(self._by_device[(user_id, device_id)])

    def _discard(self, token_hash: str) -> None:
        entry = self._entries.pop(token_hash, None)
        if entry is not None:
            device = (entry[0].user_id, entry[0].device_id)
            if self._by_device.get(device) == token_hash:
                del self._by_device[device]

    def __len__(self) -> int:
        return len(self._entries)
