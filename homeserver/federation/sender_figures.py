"""The federation sender's pool and figures as metrics (docs/operations.md lists them)."""

from __future__ import annotations

import functools

from homeserver.federation.sender import LANES, FederationSender
from homeserver.metrics import Metrics


def track_sender_figures(sender: FederationSender, metrics: Metrics) -> None:
    metrics.track_pool("federation_sender", sender.pool, sender.max_in_flight)
    metrics.track_gauge(
        "weir_federation_sender_queue",
        "PDU deliveries to other servers still owed (the outbox's rows)",
        sender.store.depth,
    )
    metrics.track_gauge(
        "weir_federation_sender_edu_queue",
        "Durable EDUs (to-device, device list updates) to other servers still owed",
        sender.store.edu_depth,
    )
    metrics.track_gauge(
        "weir_federation_sender_ephemeral_queue",
        "Typing, receipt and presence EDUs waiting in memory for their destinations",
        sender.ephemeral_queued,
    )
    metrics.track_gauge(
        "weir_federation_sender_backoff",
        "Destinations backing off after a failed transaction",
        sender.in_backoff,
    )
    metrics.track_gauge(
        "weir_federation_sender_failing_in_flight",
        "Transactions in flight to destinations whose last attempt failed",
        sender.failing_in_flight,
    )
    for lane in LANES:
        metrics.track_gauge(
            f"weir_federation_sender_{lane}_in_flight",
            f"Transactions in flight in the {lane} lane",
            functools.partial(sender.in_flight_of, lane),
        )
    metrics.track_gauge(
        "weir_federation_sender_oldest_wait_seconds",
        "How long the destination that has waited longest for a slot has waited",
        sender.oldest_wait,
    )
    metrics.track_counter(
        "weir_federation_sender_revivals",
        "Destinations backing off whose transaction to us ended the backoff",
        lambda: sender.revivals,
    )
    metrics.track_counter(
        "weir_federation_sender_preempted",
        "Late transactions stopped to give their slot to a waiting live destination",
        lambda: sender.preempted,
    )
