"""Every cyclic collection is timed, and a long one is logged (core/collector.py)."""

import gc
import logging

from homeserver.core import collector


def test_each_collection_is_timed_and_a_long_one_is_logged(caplog, monkeypatch):
    seen: list[tuple[int, float]] = []
    callback = collector.watch_pauses(lambda generation, s: seen.append((generation, s)))
    try:
        gc.collect(0)
        assert seen and seen[-1][0] == 0 and seen[-1][1] >= 0
        assert not [r for r in caplog.records if "collection held the hub" in r.message]
        monkeypatch.setattr(collector, "LONG_PAUSE_SECONDS", 0.0)  # every one is long now
        with caplog.at_level(logging.WARNING, logger="homeserver.core.collector"):
            gc.collect(2)
        assert seen[-1][0] == 2
        assert [r for r in caplog.records if "generation 2 collection held the hub" in r.message]
    finally:
        gc.callbacks.remove(callback)


def test_full_passes_are_held_until_the_last_hold_ends():
    before = gc.get_threshold()
    with collector.without_full_passes():
        held = gc.get_threshold()
        assert held[:2] == before[:2] and held[2] > 1_000_000
        with collector.without_full_passes():
            assert gc.get_threshold() == held
        assert gc.get_threshold() == held  # the outer hold still stands
        gc.collect(1)  # the young generations are still collected
    assert gc.get_threshold() == before
