"""HomeserverRuntime: the composition root.

Each part of the server is a `component`: built on first use, once, with its metrics beside
it (`register-user` builds only the database and the accounts); `python app.py` calls
`build_all()` before serving, so /metrics lists every gauge from the start. No module-level
singletons: two runtimes never share state. With pools (`python app.py`) the gevent servers
use `main_pool`; without (inline mode: the Flask dev server, tests building the app alone)
a request runs in whatever greenlet serves it.
"""

from __future__ import annotations

import logging
import os

from gevent.lock import RLock
from gevent.pool import Pool
from gevent.threadpool import ThreadPool
from nacl.signing import SigningKey

from budget import InFlightBudget, RateLimiter, parse_networks
from homeserver.accounts.profile import ProfileService
from homeserver.accounts.registration import RegistrationSessions
from homeserver.accounts.service import AccountService
from homeserver.accounts.shared_secret import SharedSecretRegistration
from homeserver.accounts.uia import UserInteractiveAuth
from homeserver.config import Config
from homeserver.core.components import component
from homeserver.core.identifiers import host_of
from homeserver.directory.remote import RemoteDirectory
from homeserver.directory.service import DirectoryService
from homeserver.e2ee.devices import DeviceService
from homeserver.e2ee.federation import E2eeFederation
from homeserver.e2ee.key_backup import KeyBackupService
from homeserver.e2ee.keys import KeyService
from homeserver.e2ee.remote_keys import RemoteKeys
from homeserver.e2ee.sync_part import E2eeSync
from homeserver.e2ee.to_device import ToDeviceService
from homeserver.federation.admission import make_client_outbound_budget
from homeserver.federation.client import FederationClient
from homeserver.federation.cooldown import AddressCooldown
from homeserver.federation.keyring import Keyring, shard_key_resolution_budget
from homeserver.federation.sender import FederationSender
from homeserver.federation.signing_key import key_id, load_or_create_signing_key
from homeserver.http.handoff import MediaFetchHandoff
from homeserver.media.files import MediaFileStore
from homeserver.media.remote import (
    FetchAdmission,
    InlineFetchAdmission,
    RemoteMediaRepository,
)
from homeserver.media.service import MediaService
from homeserver.metrics import Metrics
from homeserver.rooms.creation import RoomCreator
from homeserver.rooms.federation_membership import FederationMembership, MembershipRelay
from homeserver.rooms.federation_reads import FederationReads
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.join_checks import JoinResponseChecker
from homeserver.rooms.pdu_checks import PduChecker
from homeserver.rooms.remote_membership import RemoteMembership
from homeserver.rooms.service import RoomService
from homeserver.rooms.transactions import (
    Relay,
    ShardTransactionReceiver,
    TransactionProcessor,
)
from homeserver.storage.accounts import AccountStore
from homeserver.storage.database import Database, open_database
from homeserver.storage.directory import DirectoryStore
from homeserver.storage.e2ee import E2eeStore
from homeserver.storage.e2ee_remote import RemoteDeviceStore
from homeserver.storage.key_backup import KeyBackupStore
from homeserver.storage.keys import ServerKeyStore
from homeserver.storage.media import MediaStore
from homeserver.storage.migrations import migrate
from homeserver.storage.outbox import OutboxStore
from homeserver.storage.profiles import ProfileStore
from homeserver.storage.remote_invites import RemoteInviteStore
from homeserver.storage.room_graph import RoomGraphStore
from homeserver.storage.rooms import RoomStore
from homeserver.storage.sync import SyncStore
from homeserver.storage.transactions import ReceivedTransactionStore
from homeserver.sync.account_data import AccountDataService
from homeserver.sync.edus import InboundEdus
from homeserver.sync.filters import Filters
from homeserver.sync.notifier import Notifier
from homeserver.sync.receipts import ReceiptService
from homeserver.sync.service import SyncService
from homeserver.sync.typing import TypingNotifications

log = logging.getLogger(__name__)


class HomeserverRuntime:
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
        self._key_resolution_shards = key_resolution_shards
        self._transaction_relay = transaction_relay
        self._membership_relay = membership_relay
        self._building = RLock()

    def build_all(self) -> None:
        """Builds every component now, as a server does before it accepts a connection."""
        for name, value in vars(type(self)).items():
            if isinstance(value, component):
                getattr(self, name)

    def close(self) -> None:
        """Closes what was built, and only that."""
        built = self.__dict__
        for name, close in (
            ("federation_client", "close"),
            ("notifier", "close"),
            ("typing", "close"),
            ("e2ee_federation", "close"),
            ("thumbnail_pool", "kill"),
            ("db", "close"),
        ):
            if name in built:
                getattr(built[name], close)()

    # --- storage and identity ----------------------------------------------------------------

    @component
    def db(self) -> Database:
        """The database, migrated to the newest schema."""
        os.makedirs(self.config.data_dir, exist_ok=True)
        db = open_database(self.config.database.url)
        migrate(db)
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
    def main_pool(self) -> Pool | None:
        """Every client connection holds one greenlet of it for its keep-alive life."""
        if not self.pools:
            return None
        size = self.config.server.http.main_pool_size
        pool = Pool(size)
        self.metrics.track_pool("main", pool, size)
        return pool

    @component
    def client_outbound_budget(self) -> InFlightBudget:
        """ADR-0079: the share of the main pool that may wait on remote peers."""
        budget = make_client_outbound_budget(self.config.server.http.main_pool_size)
        self.metrics.track_budget(budget)
        return budget

    @component
    def address_cooldown(self) -> AddressCooldown:
        cooldown = AddressCooldown()
        self.metrics.track_gauge(
            "weir_cooldown_addresses", "Resolved addresses cooling down", cooldown.cooling_count
        )
        self.metrics.track_counter(
            "weir_cooldowns_started", "Cool-downs started", lambda: cooldown.cooldowns_started
        )
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
    def media_fetch_budget(self) -> InFlightBudget | None:
        if not self.pools:
            return None
        http = self.config.server.http
        budget = InFlightBudget(
            http.media_fetch_max_in_flight, http.media_fetch_max_per_client, name="media_fetch"
        )
        self.metrics.track_budget(budget)
        return budget

    @component
    def media_handoff(self) -> MediaFetchHandoff | None:
        if self.main_pool is None or self.media_pool is None or self.media_fetch_budget is None:
            return None
        return MediaFetchHandoff(self.main_pool, self.media_pool, self.media_fetch_budget)

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

    # --- accounts ------------------------------------------------------------------------

    @component
    def accounts(self) -> AccountService:
        accounts = AccountService(AccountStore(self.db), self.server_name)
        accounts.add_device_key_listener(lambda u, ds: self._keys_changed(u, devices=ds))
        return accounts

    @component
    def uia(self) -> UserInteractiveAuth:
        return UserInteractiveAuth(self.registration_sessions, self.accounts)

    @component
    def registration_sessions(self) -> RegistrationSessions:
        return RegistrationSessions()

    @component
    def shared_secret_registration(self) -> SharedSecretRegistration:
        return SharedSecretRegistration(
            self.config.registration.shared_secret, self.registration_sessions, self.accounts
        )

    @component
    def profile_store(self) -> ProfileStore:
        return ProfileStore(self.db)

    @component
    def profiles(self) -> ProfileService:
        return ProfileService(self.profile_store, self.accounts, self.rooms, self.server_name)

    # --- federation: one outbound client, and the keyring behind inbound authentication --

    @component
    def federation_client(self) -> FederationClient:
        return FederationClient.from_config(self.config, self.signing_key)

    @component
    def key_resolution_budget(self) -> InFlightBudget:
        """A worker shard gets its share of the key-resolution budget; main keeps the whole of
        it (docs/architecture.md, "Processes")."""
        keys = shard_key_resolution_budget(self.config, self._key_resolution_shards)
        budget = InFlightBudget(keys.key_resolution_max_in_flight, None, name="key_resolution")
        self.metrics.track_budget(budget)
        return budget

    @component
    def key_resolution_rate(self) -> RateLimiter:
        keys = shard_key_resolution_budget(self.config, self._key_resolution_shards)
        rate = keys.key_resolution_per_ip_rate
        limiter = RateLimiter(rate.max_requests, rate.per_seconds)
        self.metrics.track_rate_limiter("key_resolution_per_ip", limiter)
        return limiter

    @component
    def keyring(self) -> Keyring:
        keys = shard_key_resolution_budget(self.config, self._key_resolution_shards)
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
        sender = FederationSender(
            self.server_name,
            OutboxStore(self.db),
            self.federation_client,
            self.config.federation.sender.max_in_flight,
            on_outcome=lambda outcome: outcomes.labels(outcome).inc(),
        )
        sender.track(self.metrics)
        return sender

    # --- rooms and the directory -----------------------------------------------------------

    @component
    def rooms(self) -> RoomService:
        """Rooms as signed events; member events carry each local user's profile. Every
        stored event wakes the syncs it concerns."""
        rooms = RoomService(
            self.room_store, self.accounts, self.server_name, self.signing_key, self.profile_store
        )
        rooms.add_persist_listener(self.notifier.on_events_persisted)
        rooms.add_outbox_listener(self.federation_sender.wake)
        return rooms

    @component
    def room_history(self) -> RoomHistory:
        """What a user may read of a room, as its history visibility allows."""
        return RoomHistory(self.room_store, self.rooms.room_version)

    @component
    def room_store(self) -> RoomStore:
        return RoomStore(self.db)

    @component
    def remote_directory(self) -> RemoteDirectory:
        return RemoteDirectory(
            self.federation_client, self.client_outbound_budget, self.address_cooldown, self.metrics
        )

    @component
    def directory(self) -> DirectoryService:
        return DirectoryService(
            DirectoryStore(self.db), self.rooms, self.server_name, self.remote_directory
        )

    @component
    def remote_membership(self) -> RemoteMembership:
        """Our users' joins, invites and invite rejections through other servers."""
        return RemoteMembership(
            self.rooms,
            self.federation_client,
            self.keyring,
            JoinResponseChecker(PduChecker(self.keyring, self.rooms)),
            self.client_outbound_budget,
            self.address_cooldown,
            self.metrics,
            self.directory.resolve_alias_within,
            self.remote_invites,
            self.notifier.notify_users,
        )

    @component
    def room_creator(self) -> RoomCreator:
        return RoomCreator(self.rooms, self.directory, self.server_name)

    @component
    def inbound_transactions(self) -> TransactionProcessor | ShardTransactionReceiver:
        """PUT /send: main checks, authorises and stores the PDUs; a worker shard (given the
        relay to main) checks them under its own budget and relays them."""
        checker = PduChecker(self.keyring, self.rooms)
        received = ReceivedTransactionStore(self.db)
        if self._transaction_relay is None:
            return TransactionProcessor(
                checker,
                self.rooms,
                received,
                on_origin=self.federation_sender.on_inbound_transaction,
                on_edus=self._receive_edus,
            )
        return ShardTransactionReceiver(checker, received, self._transaction_relay)

    @component
    def room_graph(self) -> RoomGraphStore:
        return RoomGraphStore(self.db, self.room_store)

    @component
    def remote_invites(self) -> RemoteInviteStore:
        return RemoteInviteStore(self.db)

    @component
    def federation_membership(self) -> FederationMembership:
        """make_*/send_* and invites from other servers; events checked like any PDU."""
        return FederationMembership(
            self.rooms,
            PduChecker(self.keyring, self.rooms),
            self.room_graph,
            self.remote_invites,
            self.notifier.notify_users,
            self._membership_relay,
        )

    @component
    def federation_reads(self) -> FederationReads:
        """What other servers may read of our rooms."""
        return FederationReads(self.rooms, self.room_graph)

    # --- /sync: waiting syncs park on the notifier --------------------------------------

    @component
    def notifier(self) -> Notifier:
        notifier = Notifier(self.room_store.joined_users)
        self.metrics.track_gauge(
            "weir_sync_waiters", "Syncs registered to be woken", notifier.waiting
        )
        return notifier

    @component
    def sync_store(self) -> SyncStore:
        return SyncStore(self.db)

    @component
    def filters(self) -> Filters:
        return Filters(self.sync_store)

    @component
    def account_data(self) -> AccountDataService:
        return AccountDataService(self.sync_store, self.notifier)

    @component
    def receipts(self) -> ReceiptService:
        return ReceiptService(
            self.rooms,
            self.room_history,
            self.sync_store,
            self.account_data,
            self.notifier,
            on_read_receipt=self._send_receipt,
        )

    def _other_servers(self, room_id: str) -> list[str]:
        return [s for s in self.rooms.joined_servers(room_id) if s != self.server_name]

    def _send_typing(self, room_id: str, user_id: str, typing: bool) -> None:
        """Our user's typing, to the room's other servers (spec: m.typing EDU)."""
        content = {"room_id": room_id, "user_id": user_id, "typing": typing}
        self.federation_sender.send_edu(self._other_servers(room_id), "m.typing", content)

    def _send_receipt(self, room_id: str, user_id: str, event_id: str, data: dict) -> None:
        """Our user's public read receipt, to the room's other servers (m.receipt EDU)."""
        read = {user_id: {"event_ids": [event_id], "data": data}}
        content = {room_id: {"m.read": read}}
        self.federation_sender.send_edu(self._other_servers(room_id), "m.receipt", content)

    @component
    def typing(self) -> TypingNotifications:
        return TypingNotifications(
            self.rooms, self.notifier.notify_room, on_local_typing=self._send_typing
        )

    def _receive_edus(self, origin: str, edus: list) -> None:
        """Typing and receipts (sync/edus.py), then end-to-end encryption's (e2ee/)."""
        self.inbound_edus.receive(origin, edus)
        self.e2ee_federation.inbound.receive(origin, edus)

    @component
    def inbound_edus(self) -> InboundEdus:
        """Remote users' typing and receipts, from /send (main only: typing is in memory)."""
        counter = self.metrics.inbound_edu_items
        return InboundEdus(
            self.room_store.joined_users,
            self.typing,
            self.receipts,
            lambda edu_type, outcome: counter.labels(edu_type, outcome).inc(),
        )

    @component
    def sync(self) -> SyncService:
        return SyncService(
            self.rooms,
            self.room_history,
            self.sync_store,
            self.notifier,
            self.typing,
            self.filters,
            E2eeSync(self.e2ee_store),
        )

    # --- end-to-end encryption: keys, devices, to-device messages ------------------------

    @component
    def e2ee_store(self) -> E2eeStore:
        return E2eeStore(self.db)

    def _keys_changed(self, user_id: str, devices=(), signing: bool = False) -> None:
        """Wakes the syncs of all who share a room with the user; tells other servers."""
        if self.notifier.waiting():
            self.notifier.notify_users(self.e2ee_store.users_sharing_a_room(user_id))
        if (devices or signing) and user_id.endswith(":" + self.server_name):
            self.e2ee_federation.server.changed(user_id, devices, signing)

    @component
    def keys(self) -> KeyService:
        """Keys and cross-signing; other servers' users' under ADR-0079 (e2ee/remote_keys.py)."""
        keys = KeyService(self.e2ee_store, self.server_name, self._keys_changed)
        budget, cooldown = self.client_outbound_budget, self.address_cooldown
        remote = RemoteKeys(
            self.federation_client, budget, cooldown, self.metrics, RemoteDeviceStore(self.db)
        )
        keys.remote = remote
        return keys

    @component
    def e2ee_federation(self) -> E2eeFederation:
        """Our users' keys for other servers, and their E2EE EDUs (main applies them)."""
        return E2eeFederation(
            self.keys,
            self.to_device,
            self.e2ee_store,
            RemoteDeviceStore(self.db),
            self.federation_client,
            self.federation_sender.send_edu,
            self._keys_changed,
            self.metrics,
        )

    @component
    def devices(self) -> DeviceService:
        return DeviceService(self.e2ee_store, self.accounts, self._keys_changed)

    @component
    def to_device(self) -> ToDeviceService:
        service = ToDeviceService(self.e2ee_store, self.server_name, self.notifier.notify_users)
        service.send_edu = self.federation_sender.send_edu
        service.track(self.metrics)
        return service

    @component
    def key_backup(self) -> KeyBackupService:
        return KeyBackupService(KeyBackupStore(self.db))

    # --- media -----------------------------------------------------------------------------

    @component
    def media_store(self) -> MediaStore:
        return MediaStore(self.db)

    @component
    def media_files(self) -> MediaFileStore:
        return MediaFileStore(os.path.join(self.config.data_dir, "media"), self.server_name)

    @component
    def remote_media(self) -> RemoteMediaRepository:
        """Pool mode hands a fetch off to the media pool; inline, it falls under ADR-0079."""
        admission: FetchAdmission = self.media_handoff or InlineFetchAdmission(
            self.client_outbound_budget
        )
        remote = RemoteMediaRepository(
            self.config.media,
            self.config.security.media,
            self.media_store,
            self.media_files,
            self.federation_client,
            admission,
            self.remote_media_rate_limiter,
            self.address_cooldown,
            self.metrics,
        )
        self.metrics.track_gauge(
            "weir_remote_media_fetches", "Remote files being fetched", lambda: len(remote.coalescer)
        )
        return remote

    @component
    def thumbnail_pool(self) -> ThreadPool:
        """Pillow decoding and encoding is CPU-bound and would block the hub: native threads."""
        return ThreadPool(self.config.media.thumbnail_threads)

    @component
    def media(self) -> MediaService:
        return MediaService(
            self.config.media,
            self.server_name,
            self.media_store,
            self.media_files,
            self.thumbnail_pool,
            self.remote_media,
        )
