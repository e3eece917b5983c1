"""The infrastructure half of the composition root (homeserver/runtime/__init__.py): the
parts that know no domain service. Each is a `component`, built on first use, once."""

from __future__ import annotations

import logging
import os

from gevent.lock import RLock
from gevent.pool import Pool
from nacl.signing import SigningKey

from budget import InFlightBudget, QueuedBudget, RateLimiter, parse_networks
from homeserver.config import Config
from homeserver.core.components import component
from homeserver.core.identifiers import host_of
from homeserver.federation.admission import make_client_outbound_budget
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.event_resolution import EventResolutionBudget
from homeserver.federation.ip_filter import IpFilter
from homeserver.federation.junk import JunkAnswers
from homeserver.federation.keyring import Keyring, shard_key_resolution_budget
from homeserver.federation.sender import FederationSender
from homeserver.federation.sender_figures import track_sender_figures
from homeserver.federation.signing_key import key_id, load_or_create_signing_key
from homeserver.federation.transport import make_ssl_context
from homeserver.federation.web_client import WebClient
from homeserver.http.handoff import MediaFetchHandoff
from homeserver.http.places import WorkPool
from homeserver.media.web_fetch import WebFetcher
from homeserver.metrics import Metrics
from homeserver.rooms.federation_membership import MembershipRelay
from homeserver.rooms.transactions import (
    Relay,
)
from homeserver.storage.database import Database, open_database
from homeserver.storage.keys import ServerKeyStore
from homeserver.storage.leases import LeasedTable, QueueLeases, lease_seconds
from homeserver.storage.migrations import migrate
from homeserver.storage.outbox import DESTINATIONS, OutboxStore

log = logging.getLogger(__name__)


class Infrastructure:
    """What the services stand on: storage and identity, metrics, pools and admission
    budgets, rate limits, and the federation client, keyring and sender."""

    def __init__(
        self,
        config: Config,
        *,
        pools: bool = False,
        key_resolution_shards: int = 1,
        transaction_relay: Relay | None = None,
        membership_relay: MembershipRelay | None = None,
    ):
        self.config = config
        self.server_name = config.server_name
        # What /.well-known/matrix/server delegates to: our host, the federation port.
        self.federation_address = f"{host_of(config.server_name)}:{config.federation.port}"
        self.pools = pools
        self.trusted_proxies = parse_networks(config.server.http.trusted_proxies)
        self.metrics_allowed_networks = parse_networks(config.metrics.allowed_networks)
        # Key and event resolution are split across every process that resolves:
        # `cluster.instances` times this instance's shards, or the instances alone for
        # main, which keeps its instance's whole share (adr/key-resolution-shards.md's rule;
        # docs/architecture.md, "Budgets").
        self._resolution_shares = key_resolution_shards * config.cluster.instances
        self._transaction_relay = transaction_relay
        self._membership_relay = membership_relay
        self._building = RLock()

    def build_all(self) -> None:
        """Builds every component now, as a server does before it accepts a connection."""
        for cls in type(self).__mro__:
            for name, value in vars(cls).items():
                if isinstance(value, component):
                    getattr(self, name)

    def close(self) -> None:
        """Closes what was built, and only that."""
        built = self.__dict__
        for name, close in (
            ("inbound_transactions", "close"),
            ("federation_client", "close"),
            ("notifier", "close"),
            ("typing", "close"),
            ("e2ee_federation", "close"),
            ("thumbnail_pool", "kill"),
            ("password_hasher", "close"),
            ("db", "close"),
        ):
            if name in built:
                getattr(built[name], close)()

    # --- storage and identity ----------------------------------------------------------------

    @component
    def db(self) -> Database:
        """The database, migrated to the newest schema."""
        os.makedirs(self.config.data_dir, exist_ok=True)
        # With other instances on the database, its writes announce their stream positions.
        clustered = self.config.cluster.instances > 1
        db = open_database(
            self.config.database.url, announce_as=self.config.instance_name if clustered else None
        )
        migrate(db)
        if db.readers:  # SQLite: connections on threads of its own; PostgreSQL waits on sockets
            self.metrics.track_queue("database_read", lambda: db.waiting_reads, db.readers)
            self.metrics.track_queue("database_write", lambda: db.waiting_writes, 1)
        return db

    @component
    def signing_key(self) -> SigningKey:
        return load_or_create_signing_key(self.config.data_dir)

    @component
    def signing_key_id(self) -> str:
        return key_id(self.signing_key)

    @component
    def metrics(self) -> Metrics:
        return Metrics()

    # --- pools and admission (ADR-0079, ADR-0121) ----------------------------------------

    @component
    def main_pool(self) -> WorkPool | None:
        """Every client connection holds one greenlet of it for its keep-alive life."""
        if not self.pools:
            return None
        size = self.config.server.http.main_pool_size
        pool = WorkPool(size)
        self.metrics.track_pool("main", pool, size)
        return pool

    @component
    def client_outbound_budget(self) -> InFlightBudget:
        """ADR-0079: the share of the main pool that may wait on remote peers."""
        budget = make_client_outbound_budget(self.config.server.http.main_pool_size)
        self.metrics.track_budget(budget)
        return budget

    @component
    def junk_answers(self) -> JunkAnswers:
        """Servers whose last answers were mostly junk: asked last, and for less."""
        return JunkAnswers()

    @component
    def address_cooldown(self) -> AddressCooldown:
        cooldown = AddressCooldown()
        cooldown.track_figures(self.metrics)
        return cooldown

    @component
    def media_pool(self) -> Pool | None:
        """ADR-0121: in pool mode remote media fetches leave the main pool for this one."""
        if not self.pools:
            return None
        size = self.config.server.http.media_fetch_threads
        pool = Pool(size)
        self.metrics.track_pool("media", pool, size)
        return pool

    @component
    def media_fetch_budget(self) -> QueuedBudget | None:
        if not self.pools:
            return None
        http = self.config.server.http
        budget = QueuedBudget(
            http.media_fetch_max_in_flight,
            http.media_fetch_max_per_client,
            http.media_fetch_max_queued_per_client,
            name="media_fetch",
        )
        self.metrics.track_budget(budget)
        return budget

    @component
    def media_handoff(self) -> MediaFetchHandoff | None:
        if self.main_pool is None or self.media_pool is None or self.media_fetch_budget is None:
            return None
        handoff = MediaFetchHandoff(self.main_pool, self.media_pool, self.media_fetch_budget)
        self.metrics.track_gauge(
            "weir_media_handed_off",
            "Remote media requests away from the main pool (fetching, queued or waiting)",
            lambda: len(handoff.away),
        )
        return handoff

    # --- rate limits -----------------------------------------------------------------------

    def _rate_limiter(self, name: str) -> RateLimiter:
        rate = getattr(self.config.ratelimiting, name)
        limiter = RateLimiter(rate.max_requests, rate.per_seconds)
        self.metrics.track_rate_limiter(name, limiter)
        return limiter

    @component
    def login_rate_limiter(self) -> RateLimiter:
        return self._rate_limiter("login")

    @component
    def registration_rate_limiter(self) -> RateLimiter:
        return self._rate_limiter("registration")

    @component
    def media_create_rate_limiter(self) -> RateLimiter:
        return self._rate_limiter("media_create")

    @component
    def remote_media_rate_limiter(self) -> RateLimiter:
        return self._rate_limiter("remote_media")

    @component
    def user_directory_rate_limiter(self) -> RateLimiter:
        return self._rate_limiter("user_directory")

    # --- federation: one outbound client, and the keyring behind inbound authentication --

    @component
    def federation_client(self) -> FederationClient:
        return FederationClient.from_config(self.config, self.signing_key)

    @component
    def web_fetcher(self) -> WebFetcher:
        """Web pages for link previews: the IP filter of `[url_preview]`, the federation
        client's DNS and TLS trust."""
        config = self.config.url_preview
        fed = self.config.federation
        return WebFetcher(
            WebClient(
                self.federation_client.discovery.dns,
                IpFilter(config.ip_range_denylist, config.ip_range_allowlist),
                make_ssl_context(fed.verify_tls, fed.ca_file),
                verify_tls=fed.verify_tls,
            )
        )

    @component
    def key_resolution_budget(self) -> InFlightBudget:
        """A worker shard gets its share of its instance's key-resolution budget; main keeps
        its instance's whole share (docs/architecture.md, "Processes")."""
        keys = shard_key_resolution_budget(self.config, self._resolution_shares)
        budget = InFlightBudget(keys.key_resolution_max_in_flight, None, name="key_resolution")
        self.metrics.track_budget(budget)
        return budget

    @component
    def key_resolution_rate(self) -> RateLimiter:
        keys = shard_key_resolution_budget(self.config, self._resolution_shares)
        rate = keys.key_resolution_per_ip_rate
        limiter = RateLimiter(rate.max_requests, rate.per_seconds)
        self.metrics.track_rate_limiter("key_resolution_per_ip", limiter)
        return limiter

    @component
    def keyring(self) -> Keyring:
        keys = shard_key_resolution_budget(self.config, self._resolution_shares)
        return Keyring(
            self.server_name,
            self.signing_key,
            ServerKeyStore(self.db),
            self.federation_client,
            self.key_resolution_budget,
            self.key_resolution_rate,
            keys.trusted_key_servers,
            self.config.federation.remote_timeout,
            metrics=self.metrics,
        )

    @component
    def federation_sender(self) -> FederationSender:
        """Our PDUs and EDUs to other servers, in a pool of its own. Built everywhere, so
        that a wake-up is always safe; only main starts it (processes/main.py)."""
        outcomes = self.metrics.federation_transactions
        dropped = self.metrics.federation_edus_dropped
        sender = FederationSender(
            self.server_name,
            OutboxStore(self.db),
            self.federation_client,
            self.config.federation.sender.max_in_flight,
            live_window=self.config.federation.sender.live_window,
            unproven_timeout=self.config.federation.sender.unproven_timeout,
            late_after=self.config.federation.sender.late_after,
            max_queued_edus=self.config.federation.sender.max_queued_edus,
            on_outcome=lambda outcome: outcomes.labels(outcome).inc(),
            on_edu_dropped=lambda edu_type, reason: dropped.labels(edu_type, reason).inc(),
            # A destination's lease names the instance that sends to it.
            leases=self.queue_leases(
                "federation", DESTINATIONS, self.config.federation.remote_timeout
            ),
        )
        track_sender_figures(sender, self.metrics)
        return sender

    def queue_leases(self, queue: str, table: LeasedTable, call_deadline: float) -> QueueLeases:
        """This instance's leases on one kind of outbound queue (storage/leases.py), each
        lasting `cluster.queue_lease`, or longer where one call may take longer."""
        seconds = lease_seconds(self.config.cluster.queue_lease, call_deadline)
        leases = QueueLeases(self.db, table, self.config.instance_name, seconds)
        self.metrics.track_gauge(
            f"weir_{queue}_leases", f"Outbound {queue} queues this instance holds", leases.held
        )
        return leases

    @component
    def event_resolution(self) -> EventResolutionBudget:
        """Calls inbound PDUs cause (rooms/gaps.py); a shard's share, or main's whole
        (of its instance's share)."""
        budget = EventResolutionBudget.from_config(self.config, self._resolution_shares)
        self.metrics.track_budget(budget.budget)
        self.metrics.track_rate_limiter("event_resolution_per_origin", budget.rate)
        return budget
