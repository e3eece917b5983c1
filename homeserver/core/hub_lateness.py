"""How long the hub is held: a greenlet asks to wake every `interval` and records how late
it was woken. Whatever held the hub meanwhile (a state resolution, a big decode, a slow
collection) delayed every ready socket by the same amount, so this is the stall each waiting
request felt, measured inside the process rather than guessed from outside it."""

from __future__ import annotations

import logging
import time
from typing import Callable

import gevent

log = logging.getLogger(__name__)

# Often enough to see a 50 ms stall, cheap enough to leave on: 100 wakes a second.
INTERVAL_SECONDS = 0.01
# A stall this long is logged as well as counted.
LONG_STALL_SECONDS = 0.1


class HubLateness:
    def __init__(self, observe: Callable[[float], None], interval: float = INTERVAL_SECONDS):
        self.observe = observe
        self.interval = interval
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._watch)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()
            self._greenlet = None

    def _watch(self) -> None:
        while True:
            asked = time.perf_counter()
            gevent.sleep(self.interval)
            late = max(0.0, time.perf_counter() - asked - self.interval)
            self.observe(late)
            if late >= LONG_STALL_SECONDS:
                log.warning("the hub was held %.0f ms", late * 1000)
