"""Registrations kept from a long-poll's answer for its client's next request.

A client sends its next long-poll as soon as it has an answer, with the token (/sync's
`next_batch`) or pos (sliding sync's) that answer gave. The answer's registration with the
notifier was made before the computation behind it, so if nothing has woken it when that
request arrives, nothing concerning the user has happened since: the request, computed,
would find nothing new. It parks on that registration with no computation. If something
woke it meanwhile, the request goes on from that wake as a parked one woken then would: by
room events alone, from the recent events (sync/woken.py), not a whole computation. A
different request, or a client that never comes back (HELD_SECONDS), drops it, and the
request computes as any other.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

from homeserver.sync.notifier import Notifier, Waiter

# How long an answered long-poll's registration waits for its client's next request.
HELD_SECONDS = 30.0

Request = TypeVar("Request")
Kept = TypeVar("Kept")


class HeldRegistrations(Generic[Request, Kept]):
    """By the token an answer gave (with whose it is, where tokens are shared): when kept,
    the request answered, its registration, and what its next computation goes on from;
    oldest first."""

    def __init__(self, notifier: Notifier):
        self._notifier = notifier
        self._by_token: OrderedDict[Hashable, tuple[float, Request, Waiter, Kept]] = OrderedDict()
        self.taken = 0  # requests that parked on one, unwoken, with no computation

    def keep(self, token: Hashable, request: Request, waiter: Waiter, kept: Kept) -> None:
        now = time.monotonic()
        self._drop(token)
        self._by_token[token] = (now, request, waiter, kept)
        self._notifier.held += 1
        self._drop_older(now - HELD_SECONDS)

    def take(self, token: Hashable, request: Request) -> tuple[Waiter, Kept] | None:
        """The registration kept for `token` and what goes with it, woken since or not, if
        `request` is the one answered; else None, and it is dropped."""
        self._drop_older(time.monotonic() - HELD_SECONDS)
        found = self._by_token.pop(token, None)
        if found is None:
            return None
        self._notifier.held -= 1
        _, answered, waiter, kept = found
        if answered is not request and answered != request:
            waiter.__exit__(None, None, None)
            return None
        if not waiter.woken.is_set():
            self.taken += 1
        return waiter, kept

    def __len__(self) -> int:
        return len(self._by_token)

    def _drop_older(self, than: float) -> None:
        """Drops those kept before `than`: their clients never came back."""
        while self._by_token:
            oldest = next(iter(self._by_token))
            if self._by_token[oldest][0] >= than:
                break
            self._drop(oldest)

    def _drop(self, token: Hashable) -> None:
        found = self._by_token.pop(token, None)
        if found is not None:
            self._notifier.held -= 1
            found[2].__exit__(None, None, None)
