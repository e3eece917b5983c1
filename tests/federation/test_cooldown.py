"""AddressCooldown's arithmetic, on an injected clock (homeserver/federation/cooldown.py)."""

import pytest

from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.errors import AddressCoolingDown


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failure_cools_30_s_and_each_later_one_doubles_it():
    clock = Clock()
    cooldown = AddressCooldown(clock=clock)
    cooldown.record_failure("192.0.2.1", 8448, timed_out=True)
    assert cooldown.cooling("192.0.2.1", 8448).seconds_left == 30
    clock.now += 30  # cooled: the next attempt is the probe, and it fails too
    assert cooldown.cooling("192.0.2.1", 8448) is None
    cooldown.record_failure("192.0.2.1", 8448, timed_out=True)
    assert cooldown.cooling("192.0.2.1", 8448).seconds_left == 60
    with pytest.raises(AddressCoolingDown):
        cooldown.check("192.0.2.1", 8448)


def test_attempts_that_fail_together_are_one_failure():
    """Sixteen fetches parked on one silent address time out together: one 30 s cool-down,
    not 30 s doubled fifteen times."""
    clock = Clock()
    cooldown = AddressCooldown(clock=clock)
    for _ in range(16):
        cooldown.record_failure("192.0.2.2", 8448, timed_out=True)
    assert cooldown.cooling("192.0.2.2", 8448).seconds_left == 30
    assert cooldown.cooldowns_started == 1


def test_a_success_ends_a_cool_down():
    cooldown = AddressCooldown(clock=Clock())
    cooldown.record_failure("192.0.2.3", 8448, timed_out=False)
    cooldown.record(("192.0.2.3"), 8448, ok=True, timed_out=False)
    assert cooldown.cooling("192.0.2.3", 8448) is None
