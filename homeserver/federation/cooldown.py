"""Address cool-down: fail fast on a resolved address that just never answered us.

Keyed by (ip, port), not by server name, so a swarm of names that all point at one tarpit is
caught after its first timeout. Because any name can point at any address, only what the
address itself did counts (homeserver/federation/transport.py, ``TargetHealth``): it refused
the connection, or stayed silent through a connect, a TLS handshake or the wait for a
response head that had a fair chance. A certificate for another name, an HTTP error, a
malformed body or a deadline while a body streams never cools an address down, so that a
request naming someone else's address cannot shut its real name out (docs/architecture.md,
"What one name can do to another").

A failure cools the address for 30 s, doubling with each further failure up to 10 min (a
failure of an attempt made while it cools, one that began before, adds nothing); any
response head from it ends the cool-down. Only client-triggered calls feed and consult it
(docs/architecture.md, "Budgets"): they are the ones an attacker can aim.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from homeserver.federation.errors import AddressCoolingDown
from homeserver.metrics import Metrics

BASE_COOLDOWN_SECONDS = 30.0
MAX_COOLDOWN_SECONDS = 600.0
# Bounded memory: past this many addresses the least recently failed are forgotten.
MAX_TRACKED_ADDRESSES = 10_000


@dataclass
class _State:
    failures: int
    until: float
    timed_out: bool  # the last failure was a timeout (504) rather than a refusal (502)


@dataclass(frozen=True)
class Cooling:
    """An address that is cooling down: for how long, and after what kind of failure."""

    ip: str
    port: int
    seconds_left: float
    timed_out: bool


class AddressCooldown:
    """Greenlet-safe without a lock: no method yields to the hub."""

    def __init__(self, clock=time.monotonic, max_tracked: int = MAX_TRACKED_ADDRESSES):
        self._clock = clock
        self._max = max_tracked
        self._states: OrderedDict[tuple[str, int], _State] = OrderedDict()
        self.cooldowns_started = 0  # a counter for metrics

    def cooling(self, ip: str, port: int) -> Cooling | None:
        state = self._states.get((ip, port))
        if state is None:
            return None
        left = state.until - self._clock()
        if left <= 0:
            return None  # cooled down: the next call is the probe
        return Cooling(ip, port, left, state.timed_out)

    def record_failure(self, ip: str, port: int, timed_out: bool) -> None:
        key = (ip, port)
        state = self._states.get(key)
        if state is not None and state.until > self._clock():
            # Already cooling: this attempt began before the cool-down, in the same outage.
            # Sixteen fetches that time out together are one failure, not a 10 min cool-down.
            return
        self._states.pop(key, None)
        failures = state.failures + 1 if state else 1
        seconds = min(BASE_COOLDOWN_SECONDS * 2 ** (failures - 1), MAX_COOLDOWN_SECONDS)
        self._states[key] = _State(failures, self._clock() + seconds, timed_out)
        self.cooldowns_started += 1
        while len(self._states) > self._max:
            self._states.popitem(last=False)

    def record_success(self, ip: str, port: int) -> None:
        self._states.pop((ip, port), None)

    # -- the transport's TargetHealth protocol ---------------------------------------------

    def check(self, ip: str, port: int) -> None:
        cooling = self.cooling(ip, port)
        if cooling is not None:
            address = f"{ip}:{port}"
            raise AddressCoolingDown(address, address, cooling.seconds_left, cooling.timed_out)

    def record(self, ip: str, port: int, ok: bool, timed_out: bool) -> None:
        if ok:
            self.record_success(ip, port)
        else:
            self.record_failure(ip, port, timed_out)

    def refuse_if_all_cooling(self, destination: str, targets) -> None:
        """Raises AddressCoolingDown naming `destination` when every target is cooling down."""
        coolings = [self.cooling(ip, port) for ip, port in targets]
        cooling = [c for c in coolings if c is not None]
        if coolings and len(cooling) == len(coolings):
            first = min(cooling, key=lambda c: c.seconds_left)
            raise AddressCoolingDown(
                destination, f"{first.ip}:{first.port}", first.seconds_left, first.timed_out
            )

    def cooling_count(self) -> int:
        now = self._clock()
        return sum(1 for s in self._states.values() if s.until > now)

    def track_figures(self, metrics: Metrics) -> None:
        metrics.track_gauge(
            "weir_cooldown_addresses", "Resolved addresses cooling down", self.cooling_count
        )
        metrics.track_counter(
            "weir_cooldowns_started", "Cool-downs started", lambda: self.cooldowns_started
        )
