"""The event-resolution budget: admission for the calls an inbound PDU makes us make
(docs/architecture.md, "Budgets").

A PDU whose prev_events or auth_events we lack makes us ask its origin for them
(homeserver/rooms/gaps.py: ``/get_missing_events``, ``/state_ids``, ``/event``). Like a key
fetch, that is work another server caused, so it is admitted first:

- one slot of ``event_resolution_max_in_flight`` (whole process; each of several instances,
  and each of an instance's shards, gets its share by the shard rule,
  ``shard_event_resolution_budget``) is held for the whole fetch, and the fetch's
  calls run one after another under it, so calls in flight never exceed the slots;
- one token of ``event_resolution_per_origin_rate`` for the origin server, per fetch;
- one total deadline for the fetch, all its calls included.

Refused, the caller raises ``EventResolutionRefused``: the transaction gets 429 with nothing
applied, and the sender retries.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from budget import InFlightBudget, OutboundDeadline, RateLimiter, split_budget
from homeserver.config import Config, FederationSecurityConfig
from homeserver.federation.errors import EventResolutionRefused

# One fetch (missing events, then the state at the gap) takes at most this, and never more
# than federation.remote_timeout.
EVENT_FETCH_SECONDS = 20.0
# Retry-After when the budget is full: fetches end within their deadline.
BUDGET_REFUSAL_RETRY_MS = 1000


def shard_event_resolution_budget(config: Config, shards: int) -> FederationSecurityConfig:
    """``security.federation`` with the event-resolution limits of one of ``shards``: the
    in-flight limit and the rate's ``max_requests`` divided, rounded down, at least 1."""
    sec = config.security.federation
    in_flight, max_requests = split_budget(
        sec.event_resolution_max_in_flight,
        sec.event_resolution_per_origin_rate.max_requests,
        shards,
    )
    rate = dataclasses.replace(sec.event_resolution_per_origin_rate, max_requests=max_requests)
    return dataclasses.replace(
        sec, event_resolution_max_in_flight=in_flight, event_resolution_per_origin_rate=rate
    )


class EventResolutionBudget:
    def __init__(self, budget: InFlightBudget, rate: RateLimiter, remote_timeout: float):
        self.budget = budget
        self.rate = rate
        self.fetch_seconds = min(EVENT_FETCH_SECONDS, remote_timeout)

    @classmethod
    def from_config(cls, config: Config, shards: int) -> EventResolutionBudget:
        sec = shard_event_resolution_budget(config, shards)
        rate = sec.event_resolution_per_origin_rate
        return cls(
            InFlightBudget(sec.event_resolution_max_in_flight, None, name="event_resolution"),
            RateLimiter(rate.max_requests, rate.per_seconds),
            config.federation.remote_timeout,
        )

    @contextlib.contextmanager
    def fetch(self, origin: str, what: str) -> Iterator[OutboundDeadline]:
        """Holds a slot for the body and gives it its one deadline; or refuses at once,
        before any call, with ``EventResolutionRefused``."""
        slot = self.budget.try_acquire(origin)
        if slot is None:
            raise EventResolutionRefused(
                origin, BUDGET_REFUSAL_RETRY_MS, "too many event fetches in flight"
            )
        with slot:
            decision = self.rate.check(origin)
            if not decision.allowed:
                raise EventResolutionRefused(
                    origin, decision.retry_after_ms, f"event fetch rate exceeded for {origin}"
                )
            yield OutboundDeadline(self.fetch_seconds, what=what)
