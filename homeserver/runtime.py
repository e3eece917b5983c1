"""HomeserverRuntime: the composition root.

It builds storage, the signing key, budgets, pools and services once, and hands them out.
There are no module-level singletons: two runtimes (two test servers) never share state.

A runtime is built with or without pools. With pools (`python app.py`) the gevent servers
use `main_pool`; without (inline mode: the Flask dev server and tests that build the app
alone) every request runs in whatever greenlet serves it.
"""

from __future__ import annotations

import logging
import os

from gevent.pool import Pool
from gevent.threadpool import ThreadPool

from budget import InFlightBudget, RateLimiter, parse_networks

from .accounts.profile import ProfileService
from .accounts.registration import RegistrationSessions
from .accounts.service import AccountService
from .config import Config
from .directory.remote import RemoteDirectory
from .directory.service import DirectoryService
from .federation.client import FederationClient
from .federation.cooldown import AddressCooldown
from .federation.keyring import Keyring, shard_key_resolution_budget
from .federation.pdus import PduChecker
from .federation.signing_key import key_id, load_or_create_signing_key
from .federation.transactions import Relay, ShardTransactionReceiver, TransactionProcessor
from .http.handoff import MediaFetchHandoff
from .media.files import MediaFileStore
from .media.remote import InlineFetchAdmission, RemoteMediaRepository
from .media.service import MediaService
from .metrics import Metrics
from .outbound import make_client_outbound_budget
from .rooms.creation import RoomCreator
from .rooms.service import RoomService
from .storage.accounts import AccountStore
from .storage.database import Database, open_database
from .storage.directory import DirectoryStore
from .storage.keys import ServerKeyStore
from .storage.media import MediaStore
from .storage.migrations import migrate
from .storage.profiles import ProfileStore
from .storage.rooms import RoomStore
from .storage.sync import SyncStore
from .storage.transactions import ReceivedTransactionStore
from .sync.account_data import AccountDataService
from .sync.filters import Filters
from .sync.notifier import Notifier
from .sync.receipts import ReceiptService
from .sync.service import SyncService
from .sync.typing import TypingNotifications

log = logging.getLogger(__name__)


class HomeserverRuntime:
    def __init__(self, config: Config, *, pools: bool = False, key_resolution_shards: int = 1,
                 transaction_relay: Relay | None = None):
        self.config = config
        self.server_name = config.server_name
        # What /.well-known/matrix/server delegates to: our host, the federation port.
        self.federation_address = f"{_host_of(config.server_name)}:{config.federation.port}"
        self.pools = pools
        os.makedirs(config.data_dir, exist_ok=True)

        self.db: Database = open_database(config.database.url)
        self.schema_version = migrate(self.db)
        self.signing_key = load_or_create_signing_key(config.data_dir)
        self.signing_key_id = key_id(self.signing_key)

        http = config.server.http
        self.trusted_proxies = parse_networks(http.trusted_proxies)
        # Main pool: every client connection holds one greenlet for its keep-alive life.
        self.main_pool: Pool | None = Pool(http.main_pool_size) if pools else None

        # ADR-0079: the share of the main pool that may wait on remote peers.
        self.client_outbound_budget = make_client_outbound_budget(http.main_pool_size)
        self.address_cooldown = AddressCooldown()

        self.metrics = Metrics()
        self.metrics_allowed_networks = parse_networks(config.metrics.allowed_networks)
        self.metrics.track_budget(self.client_outbound_budget)
        if self.main_pool is not None:
            self.metrics.track_pool("main", self.main_pool, http.main_pool_size)
        self.metrics.track_gauge("weir_cooldown_addresses", "Resolved addresses cooling down",
                                 self.address_cooldown.cooling_count)
        self.metrics.track_counter("weir_cooldowns_started", "Cool-downs started",
                                   lambda: self.address_cooldown.cooldowns_started)

        limits = config.ratelimiting
        self.login_rate_limiter = RateLimiter(limits.login.max_requests, limits.login.per_seconds)
        self.registration_rate_limiter = RateLimiter(limits.registration.max_requests,
                                                     limits.registration.per_seconds)
        self.media_create_rate_limiter = RateLimiter(limits.media_create.max_requests,
                                                     limits.media_create.per_seconds)
        self.remote_media_rate_limiter = RateLimiter(limits.remote_media.max_requests,
                                                     limits.remote_media.per_seconds)
        for name, limiter in (("login", self.login_rate_limiter),
                              ("registration", self.registration_rate_limiter),
                              ("media_create", self.media_create_rate_limiter),
                              ("remote_media", self.remote_media_rate_limiter)):
            self.metrics.track_rate_limiter(name, limiter)

        self.accounts = AccountService(AccountStore(self.db), config.server_name)
        self.registration_sessions = RegistrationSessions()

        # Federation: one outbound client, and the keyring behind inbound authentication.
        # A worker shard (key_resolution_shards = N) gets its share of the key-resolution
        # budget; main keeps the whole of it (adr/key-resolution-shards.md).
        self.federation_client = FederationClient.from_config(config, self.signing_key)
        keys = shard_key_resolution_budget(config, key_resolution_shards)
        self.key_resolution_budget = InFlightBudget(keys.key_resolution_max_in_flight, None,
                                                    name="key_resolution")
        self.key_resolution_rate = RateLimiter(keys.key_resolution_per_ip_rate.max_requests,
                                               keys.key_resolution_per_ip_rate.per_seconds)
        self.keyring = Keyring(
            config.server_name, self.signing_key, ServerKeyStore(self.db), self.federation_client,
            self.key_resolution_budget, self.key_resolution_rate, keys.trusted_key_servers,
            config.federation.remote_timeout, metrics=self.metrics)
        self.metrics.track_budget(self.key_resolution_budget)
        self.metrics.track_rate_limiter("key_resolution_per_ip", self.key_resolution_rate)

        # Rooms as signed events, member events carrying each local user's profile.
        profile_store = ProfileStore(self.db)
        self.rooms = RoomService(RoomStore(self.db), self.accounts, config.server_name,
                                 self.signing_key, profile_store)
        self.profiles = ProfileService(profile_store, self.accounts, self.rooms,
                                       config.server_name)
        self.remote_directory = RemoteDirectory(self.federation_client,
                                                self.client_outbound_budget,
                                                self.address_cooldown, self.metrics)
        self.directory = DirectoryService(DirectoryStore(self.db), self.rooms,
                                          config.server_name, self.remote_directory)
        self.room_creator = RoomCreator(self.rooms, self.directory, config.server_name)

        # /sync: waiting syncs park on the notifier, which every stored event, account data
        # change, receipt and typing change wakes for the users it concerns.
        self.notifier = Notifier(self.rooms.store.joined_users)
        self.rooms.add_persist_listener(self.notifier.on_events_persisted)
        self.metrics.track_gauge("weir_sync_waiters", "Syncs registered to be woken",
                                 self.notifier.waiting)
        sync_store = SyncStore(self.db)
        self.filters = Filters(sync_store)
        self.account_data = AccountDataService(sync_store, self.notifier)
        self.receipts = ReceiptService(self.rooms, sync_store, self.account_data,
                                       self.notifier)
        self.typing = TypingNotifications(self.rooms, self.notifier.notify_room)
        self.sync = SyncService(self.rooms, sync_store, self.notifier, self.typing,
                                self.filters)

        # ADR-0121: in pool mode remote media fetches leave the main pool for a media pool of
        # their own, under their own budget; inline, they fall under ADR-0079's budget.
        self.media_pool: Pool | None = None
        self.media_fetch_budget: InFlightBudget | None = None
        self.media_handoff: MediaFetchHandoff | None = None
        if pools:
            self.media_pool = Pool(http.media_fetch_threads)
            self.media_fetch_budget = InFlightBudget(
                http.media_fetch_max_in_flight, http.media_fetch_max_per_client,
                name="media_fetch")
            self.media_handoff = MediaFetchHandoff(self.main_pool, self.media_pool,
                                                   self.media_fetch_budget)
            self.metrics.track_budget(self.media_fetch_budget)
            self.metrics.track_pool("media", self.media_pool, http.media_fetch_threads)
        media_store = MediaStore(self.db)
        media_files = MediaFileStore(os.path.join(config.data_dir, "media"), config.server_name)
        self.remote_media = RemoteMediaRepository(
            config.media, config.security.media, media_store, media_files,
            self.federation_client,
            self.media_handoff or InlineFetchAdmission(self.client_outbound_budget),
            self.remote_media_rate_limiter, self.address_cooldown, self.metrics)
        self.metrics.track_gauge("weir_remote_media_fetches", "Remote files being fetched",
                                 lambda: len(self.remote_media.coalescer))
        # Pillow decoding and encoding is CPU-bound and would block the hub: native threads.
        self.thumbnail_pool = ThreadPool(config.media.thumbnail_threads)
        self.media = MediaService(config.media, config.server_name, media_store, media_files,
                                  self.thumbnail_pool, self.remote_media)

        # Inbound transactions (PUT /send): main checks, authorises and stores their PDUs; a
        # worker shard (given the `transaction_relay` to main) checks them under its own
        # budget and relays them (federation/transactions.py).
        pdu_checker = PduChecker(self.keyring, self.rooms)
        received = ReceivedTransactionStore(self.db)
        self.inbound_transactions: TransactionProcessor | ShardTransactionReceiver = (
            TransactionProcessor(pdu_checker, self.rooms, received) if transaction_relay is None
            else ShardTransactionReceiver(pdu_checker, received, transaction_relay))

    def close(self) -> None:
        self.federation_client.close()
        self.notifier.close()
        self.typing.close()
        self.thumbnail_pool.kill()
        self.db.close()

def _host_of(server_name: str) -> str:
    """The host part of a server name: `[::1]:8008` -> `[::1]`, `a.b:80` -> `a.b`."""
    if server_name.startswith("["):
        return server_name[: server_name.index("]") + 1]
    return server_name.rsplit(":", 1)[0] if server_name.count(":") == 1 else server_name
