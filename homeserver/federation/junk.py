"""Servers whose answers were mostly junk: events we did not ask for, or that failed their
checks. Such a server is remembered for a while, and costs less while it is: it is asked
last among the servers that could answer (a join's via servers, a backfill's), and for less
(gaps: rooms/gaps.py). Nothing here is persisted: a restart forgets, and a server that
answers well again is forgotten after `REMEMBERED_SECONDS`.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from homeserver.federation.errors import ResponseTooLarge

# How long a server that gave a junk answer stays remembered.
REMEMBERED_SECONDS = 600.0
# An answer is junk when more than this share of what it held was dropped unchecked or
# failed its checks.
JUNK_SHARE = 0.5
# Servers remembered at once: the oldest is forgotten first past this.
_MAX_REMEMBERED = 10_000


class JunkAnswers:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._until: dict[str, float] = {}

    def note(self, server: str, held: int, useful: int) -> None:
        """An answer of `server` held `held` events, of which `useful` were what we asked
        for and passed their checks."""
        if held > 0 and held - useful > held * JUNK_SHARE:
            self.remember(server)

    def note_failure(self, server: str, error: BaseException) -> None:
        """A call to `server` failed: an answer larger than anything we asked for could be
        is junk too."""
        if isinstance(error, ResponseTooLarge):
            self.remember(server)

    def remember(self, server: str) -> None:
        """`server`'s answer was junk (or larger than anything we asked for could be)."""
        if len(self._until) >= _MAX_REMEMBERED:
            self._until.pop(next(iter(self._until)))
        self._until.pop(server, None)
        self._until[server] = self._clock() + REMEMBERED_SECONDS

    def is_junk(self, server: str) -> bool:
        until = self._until.get(server)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[server]
            return False
        return True

    def last(self, servers: Iterable[str]) -> list[str]:
        """`servers` in their order, those remembered for junk moved to the end."""
        servers = list(servers)
        return [s for s in servers if not self.is_junk(s)] + [s for s in servers if self.is_junk(s)]
