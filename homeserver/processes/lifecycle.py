"""One server life cycle for main and for a shard: a stop requested by SIGTERM or SIGINT,
then a bounded drain of the listeners and the runtime's close."""

from __future__ import annotations

import logging
import signal
from typing import Callable, Iterable

import gevent
from gevent.event import Event

from homeserver.processes.listeners import HomeserverServer
from homeserver.runtime import HomeserverRuntime

log = logging.getLogger(__name__)


def stop_on_signals() -> Event:
    """An Event that SIGTERM or SIGINT sets."""
    stop = Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(sig, stop.set)
    return stop


def wait_then_drain(
    stop: Event,
    server: HomeserverServer,
    runtime: HomeserverRuntime,
    *,
    before: Iterable[Callable[[], None]] = (),
    after: Iterable[Callable[[], None]] = (),
) -> None:
    """Waits for `stop`, then drains: `before`, the listeners (in-flight requests finish
    within the grace), `after`, and the runtime last."""
    stop.wait()
    log.info("stopping: draining in-flight requests")
    for step in before:
        step()
    server.stop()
    for step in after:
        step()
    runtime.close()
    log.info("stopped")
