"""Admission control for Weir: budgets, rate limits, client keys, deadlines.

A small pure library: it depends on gevent and the standard library only,
and knows nothing of Flask, Matrix or the homeserver. docs/architecture.md, "Budgets",
says where the server uses each piece.
"""

from budget.clientkey import client_key, parse_networks
from budget.deadline import DeadlineExceeded, OutboundDeadline
from budget.inflight import InFlightBudget, Slot
from budget.queued import QueuedBudget, Ticket
from budget.ratelimit import Decision, RateLimiter
from budget.split import split_budget

__all__ = [
    "Decision",
    "DeadlineExceeded",
    "InFlightBudget",
    "OutboundDeadline",
    "QueuedBudget",
    "RateLimiter",
    "Slot",
    "Ticket",
    "client_key",
    "parse_networks",
    "split_budget",
]
