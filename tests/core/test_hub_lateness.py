"""The hub lateness watch sees a greenlet that holds the hub, and by how much."""

import time

import gevent
from gevent.event import Event

from homeserver.core.hub_lateness import HubLateness


def test_a_greenlet_that_holds_the_hub_is_seen_for_as_long_as_it_held_it():
    seen: list[float] = []
    watching, held_seen = Event(), Event()

    def observe(late: float) -> None:
        seen.append(late)
        watching.set()
        if late >= 0.07:
            held_seen.set()

    watch = HubLateness(observe)
    watch.start()
    try:
        assert watching.wait(5)
        # Held without yielding, as a loop that never pauses would.
        until = time.perf_counter() + 0.08
        while time.perf_counter() < until:
            pass
        assert held_seen.wait(5)
    finally:
        watch.stop()


def test_stopped_it_observes_nothing_more():
    seen: list[float] = []
    first = Event()

    def observe(late: float) -> None:
        seen.append(late)
        first.set()

    watch = HubLateness(observe, interval=0.001)
    watch.start()
    assert first.wait(5)
    watch.stop()
    count = len(seen)
    gevent.sleep(0.02)  # twenty of its intervals
    assert len(seen) == count
