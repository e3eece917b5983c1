"""Admission for client-triggered outbound calls (ADR-0079; docs/architecture.md, "Budgets").

Some client requests make us call another server before we can answer: a remote room
directory, a remote alias, other servers' users' keys, and remote media when there is no
media pool. Each one holds a
main-pool greenlet for the whole call, so a peer that never answers could otherwise pin the
pool. This module is the one place that rule lives:

- at most half the main pool, and one request per client key, may wait on remote peers;
  over either cap the request is refused with 429 at once, before any discovery or byte;
- every admitted call runs under one total deadline (discovery included);
- the slot is released on every path, including a client that hangs up mid-call.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from budget import DeadlineExceeded, InFlightBudget, Slot
from homeserver.core.errors import ContentTooLarge, limit_exceeded
from homeserver.federation.errors import (
    AddressCoolingDown,
    DestinationUnreachable,
    FederationError,
    RemoteError,
)
from homeserver.metrics import Metrics

# Total deadlines, discovery included; FederationClient.deadline caps them at
# federation.remote_timeout.
DIRECTORY_DEADLINE_SECONDS = 10.0
# Remote /keys/query and /keys/claim: the client-server spec's recommended 10 s.
KEYS_DEADLINE_SECONDS = 10.0
MEDIA_DEADLINE_SECONDS = 30.0

# One request per client address at a time: a single client cannot take the budget alone.
PER_CLIENT_CAP = 1
REFUSAL_RETRY_AFTER_MS = 1000


def client_outbound_caps(main_pool_size: int) -> tuple[int, int]:
    """(global cap, per-client cap) of the client outbound budget.

    Derived from the pool size in code, never configured: a setting would let an operator
    raise the cap to the pool size, and then a peer that never answers pins the whole pool
    again, which is the very bug the cap exists to prevent. Half the pool stays free for
    requests that never leave this server, whatever remote peers do.
    """
    return max(1, main_pool_size // 2), PER_CLIENT_CAP


def make_client_outbound_budget(main_pool_size: int) -> InFlightBudget:
    global_cap, per_client = client_outbound_caps(main_pool_size)
    return InFlightBudget(global_cap, per_client, name="client_outbound")


@dataclass(frozen=True)
class Caller:
    """Whom a client-triggered outbound call is for: the key its admission is counted under;
    `watch_hang_up`, a context manager that ends its body when that client hangs up (the
    HTTP layer gives one; none when there is no connection to watch); and its WSGI environ,
    which only the HTTP layer reads (homeserver/http/handoff.py)."""

    client_key: str
    environ: dict = field(default_factory=dict, compare=False)
    watch_hang_up: Callable[[], AbstractContextManager[object]] = field(
        default=contextlib.nullcontext, compare=False
    )


@contextlib.contextmanager
def admitted(budget: InFlightBudget, caller: Caller) -> Iterator[Slot]:
    """Holds a slot of `budget` for the body, or refuses at once with 429.

    The body also ends (and the slot is freed) if the client hangs up meanwhile.
    """
    slot = budget.try_acquire(caller.client_key)
    if slot is None:
        raise limit_exceeded(
            REFUSAL_RETRY_AFTER_MS,
            "Too many concurrent requests to remote servers; try again shortly",
        )
    with slot, caller.watch_hang_up():
        yield slot


def failure_outcome(e: Exception) -> str:
    """The `outcome` label of a client-triggered call that failed with `e`
    (weir_outbound_calls_total; docs/operations.md lists them)."""
    if isinstance(e, DeadlineExceeded):
        return "deadline"
    if isinstance(e, ContentTooLarge):
        return "too_large"
    if isinstance(e, AddressCoolingDown):
        return "cooling_down"
    if isinstance(e, DestinationUnreachable):
        return "unreachable"
    if isinstance(e, RemoteError):
        return "remote_error"
    if isinstance(e, FederationError):
        return "malformed"
    return "error"


def count_failure(metrics: Metrics, call: str, e: Exception) -> None:
    """Counts a failed client-triggered call, and a deadline expiry or cool-down refusal."""
    outcome = failure_outcome(e)
    if outcome == "deadline":
        metrics.deadline_expiries.labels(call).inc()
    elif outcome == "cooling_down":
        metrics.cooldown_refusals.inc()
    metrics.outbound_calls.labels(call, outcome).inc()
