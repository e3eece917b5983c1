"""The pushers' part of the composition root: users' pushers and the push sender that
delivers their notifications to push gateways, on the media parts (runtime/media.py)."""

from __future__ import annotations

import functools

from homeserver.core.components import component
from homeserver.federation.ip_filter import IpFilter
from homeserver.federation.transport import make_ssl_context
from homeserver.federation.web_client import WebClient
from homeserver.runtime.media import MediaComponents
from homeserver.storage.pushers import PUSHERS, PusherStore
from homeserver.sync.push_gateway import PushGateway
from homeserver.sync.push_sender import LIVE, UNPROVEN, PushSender
from homeserver.sync.pushers import PusherService


class PushComponents(MediaComponents):
    @component
    def pusher_store(self) -> PusherStore:
        return PusherStore(self.db)

    @component
    def push_sender(self) -> PushSender:
        """Notifications to push gateways, in a pool of its own, through the `[push]` IP
        filter. Built everywhere, so that a wake-up is always safe; only main starts it
        (processes/main.py)."""
        config, fed = self.config.push, self.config.federation
        client = WebClient(
            self.federation_client.discovery.dns,
            IpFilter(config.ip_range_denylist, config.ip_range_allowlist),
            make_ssl_context(fed.verify_tls, fed.ca_file),
            verify_tls=fed.verify_tls,
        )
        leases = self.queue_leases("push", PUSHERS, config.deadline)
        sender = PushSender(
            self.pusher_store,
            PushGateway(client),
            config.max_in_flight,
            config.deadline,
            leases=leases,
            # Pushers set through other instances are found once a lease time.
            find_every=leases.seconds if self.config.cluster.instances > 1 else None,
        )
        self.metrics.track_pool("push_sender", sender.pool, config.max_in_flight)
        self.metrics.track_gauge("weir_pushers", "Pushers of our users", sender.pushers)
        self.metrics.track_gauge(
            "weir_push_sender_backoff",
            "Pushers backing off after a failed notify",
            sender.in_backoff,
        )
        for lane in (LIVE, UNPROVEN):
            self.metrics.track_gauge(
                f"weir_push_sender_{lane}_in_flight",
                f"Notifies in flight in the {lane} lane",
                functools.partial(sender.in_flight_of, lane),
            )
        for outcome in sender.outcomes:
            self.metrics.track_counter(
                f"weir_push_notifies_{outcome}",
                f"Notifies to push gateways: {outcome}",
                functools.partial(sender.outcomes.__getitem__, outcome),
            )
        return sender

    @component
    def pushers(self) -> PusherService:
        return PusherService(self.pusher_store, self.push_sender)
