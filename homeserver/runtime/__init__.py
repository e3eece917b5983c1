"""HomeserverRuntime: the composition root.

Each part of the server (storage, budgets, pools, services) is a `component`: built on first
use, once, with its metrics registered beside it. A command such as `register-user` so builds
only the database and the accounts; `python app.py` calls `build_all()` before serving, so no
request pays for a build and /metrics lists every gauge from the start. There are no
module-level singletons: two runtimes (two test servers) never share state.

A runtime is built with or without pools. With pools (`python app.py`) the gevent servers
use `main_pool`; without (inline mode: the Flask dev server and tests that build the app
alone) every request runs in whatever greenlet serves it.
"""

from __future__ import annotations

import logging

from homeserver.accounts.deactivation import AccountDeactivation
from homeserver.accounts.openid import OpenIdTokens
from homeserver.accounts.passwords import PasswordHasher
from homeserver.accounts.profile import ProfileService
from homeserver.accounts.registration import RegistrationSessions
from homeserver.accounts.service import AccountService
from homeserver.accounts.shared_secret import SharedSecretRegistration
from homeserver.accounts.turn import TurnCredentials
from homeserver.accounts.uia import UserInteractiveAuth
from homeserver.accounts.user_directory import UserDirectory
from homeserver.appservice.sender import AppserviceSender
from homeserver.appservice.service import AppserviceService
from homeserver.core.collector import CollectorHold
from homeserver.core.components import component
from homeserver.directory.remote import RemoteDirectory
from homeserver.directory.service import DirectoryService
from homeserver.e2ee.sync_part import E2eeSync
from homeserver.rooms.backfill import Backfiller
from homeserver.rooms.creation import RoomCreator
from homeserver.rooms.departure import RoomDeparture
from homeserver.rooms.federation_membership import FederationMembership
from homeserver.rooms.federation_reads import FederationReads
from homeserver.rooms.gaps import GapFiller
from homeserver.rooms.held import HeldPdus
from homeserver.rooms.hierarchy import SpaceHierarchy
from homeserver.rooms.hierarchy_remote import RemoteHierarchy
from homeserver.rooms.history import RoomHistory
from homeserver.rooms.join_checks import JoinResponseChecker
from homeserver.rooms.jump_to_date import TimestampLookup
from homeserver.rooms.moderation import RoomModeration
from homeserver.rooms.out_of_room import OutOfRoomEnds
from homeserver.rooms.pdu_checks import PduChecker
from homeserver.rooms.relations import Relations
from homeserver.rooms.remote_membership import RemoteMembership
from homeserver.rooms.reports import ReportService
from homeserver.rooms.search import RoomSearch
from homeserver.rooms.server_acl import ServerAcls
from homeserver.rooms.service import RoomService
from homeserver.rooms.transactions import ShardTransactionReceiver, TransactionProcessor
from homeserver.rooms.upgrades import RoomUpgrader
from homeserver.runtime.admin import AdminComponents
from homeserver.runtime.appservices import build_appservice_sender, build_appservices
from homeserver.runtime.cluster import ClusterComponents
from homeserver.runtime.e2ee import E2eeComponents
from homeserver.runtime.push import PushComponents
from homeserver.storage.accounts import AccountStore
from homeserver.storage.directory import DirectoryStore
from homeserver.storage.openid import OpenIdStore
from homeserver.storage.presence import PresenceStore
from homeserver.storage.profiles import ProfileStore
from homeserver.storage.push import PushStore
from homeserver.storage.remote_invites import RemoteInviteStore
from homeserver.storage.reports import ReportStore
from homeserver.storage.room_graph import RoomGraphStore
from homeserver.storage.rooms import RoomStore
from homeserver.storage.sliding_sync import SlidingSyncStore
from homeserver.storage.sync import SyncStore
from homeserver.storage.transactions import ReceivedTransactionStore, StagingCaps
from homeserver.storage.user_directory import UserDirectoryStore
from homeserver.sync.account_data import AccountDataService
from homeserver.sync.edus import InboundEdus
from homeserver.sync.filters import Filters
from homeserver.sync.notifications import Notifications
from homeserver.sync.notifier import Notifier
from homeserver.sync.presence import PresenceService
from homeserver.sync.push_actions import PushActions
from homeserver.sync.push_ruleset import PushRules
from homeserver.sync.receipts import ReceiptService
from homeserver.sync.service import SyncService
from homeserver.sync.sliding import SlidingSync
from homeserver.sync.sliding_connections import Connections
from homeserver.sync.sliding_lists import RoomLists

log = logging.getLogger(__name__)


class HomeserverRuntime(AdminComponents, E2eeComponents, PushComponents, ClusterComponents):
    """Every domain service, on the admin API's (runtime/admin.py), the encryption parts
    (runtime/e2ee.py), the pushers (runtime/push.py), typing and other instances' wakes
    (runtime/cluster.py), the media parts (runtime/media.py) and the infrastructure
    (runtime/infrastructure.py)."""

    # --- accounts ------------------------------------------------------------------------

    @component
    def accounts(self) -> AccountService:
        accounts = AccountService(AccountStore(self.db), self.server_name, self.password_hasher)
        accounts.add_device_key_listener(lambda u, ds: self._keys_changed(u, devices=ds))
        return accounts

    @component
    def password_hasher(self) -> PasswordHasher:
        hasher = PasswordHasher()
        self.metrics.track_threadpool("password_hashing", hasher.pool)
        return hasher

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

    @component
    def deactivation(self) -> AccountDeactivation:
        """Leaves through the membership service, so that other servers hear of it."""
        departure = RoomDeparture(self.remote_membership, self.remote_invites)
        return AccountDeactivation(
            self.accounts, self.profile_store, departure.leave_all, self.pushers.remove_all
        )

    @component
    def openid_tokens(self) -> OpenIdTokens:
        return OpenIdTokens(OpenIdStore(self.db), self.server_name)

    @component
    def turn(self) -> TurnCredentials:
        return TurnCredentials(self.config.voip)

    @component
    def user_directory(self) -> UserDirectory:
        """User search over the directory written with profiles and memberships."""
        store = UserDirectoryStore(self.db)
        return UserDirectory(store, self.config.user_directory.search_all_users)

    # --- rooms and the directory -----------------------------------------------------------

    @component
    def rooms(self) -> RoomService:
        """Rooms as signed events; member events carry each local user's profile. Every
        stored event wakes the syncs it concerns."""
        rooms = RoomService(
            self.room_store, self.accounts, self.server_name, self.signing_key, self.profile_store
        )
        rooms.add_persist_listener(self.notifier.on_events_persisted)
        rooms.add_persist_listener(lambda stored: self.appservice_sender.wake())
        rooms.add_outbox_listener(self.federation_sender.wake)
        # Looked up when first used: push actions read the rooms.
        rooms.add_write_hook(lambda events: self.push_actions.hook(events))
        return rooms

    # --- application services (bridges) ----------------------------------------------------

    @component
    def appservices(self) -> AppserviceService:
        return build_appservices(self)

    @component
    def appservice_sender(self) -> AppserviceSender:
        return build_appservice_sender(self)

    @component
    def moderation(self) -> RoomModeration:
        """Kick, ban, unban, forget and the joined members' list."""
        return RoomModeration(self.rooms, self.sync_store)

    @component
    def reports(self) -> ReportService:
        """Reports of events, rooms and users, kept for the admins."""
        return ReportService(ReportStore(self.db), self.rooms, self.room_history, self.accounts)

    @component
    def room_history(self) -> RoomHistory:
        """What a user may read of a room, as its history visibility allows."""
        return RoomHistory(self.room_store, self.rooms.room_version, self.backfiller.backfill)

    @component
    def relations(self) -> Relations:
        """An event's children and a room's threads, as the reader may see them."""
        return Relations(self.room_history)

    @component
    def timestamp_lookup(self) -> TimestampLookup:
        """Jump to date: our timeline, then the room's servers (ADR-0079)."""
        return TimestampLookup(
            self.rooms,
            self.room_history,
            self.federation_client,
            self.client_outbound_budget,
            self.address_cooldown,
            self.metrics,
            self.junk_answers,
        )

    @component
    def room_search(self) -> RoomSearch:
        """Full-text search of the user's rooms' events, as the reader may see them."""
        return RoomSearch(self.room_history)

    @component
    def gaps(self) -> GapFiller:
        return GapFiller(
            self.rooms,
            PduChecker(self.keyring, self.rooms),
            self.federation_client,
            self.event_resolution,
            self.junk_answers,
        )

    @component
    def backfiller(self) -> Backfiller:
        """/messages past our oldest event: a client-triggered call (ADR-0079)."""
        return Backfiller(
            self.rooms,
            PduChecker(self.keyring, self.rooms),
            self.federation_client,
            self.client_outbound_budget,
            self.address_cooldown,
            self.metrics,
            self.junk_answers,
        )

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
            JoinResponseChecker(
                PduChecker(self.keyring, self.rooms),
                self.junk_answers,
                self.config.federation.joins.max_events,
            ),
            self.client_outbound_budget,
            self.address_cooldown,
            self.metrics,
            self.directory.resolve_alias_within,
            self.remote_invites,
            self.notifier.notify_users,
            self.config.federation.joins,
        )

    @component
    def room_creator(self) -> RoomCreator:
        return RoomCreator(self.rooms, self.directory, self.server_name, self.remote_membership)

    @component
    def room_upgrader(self) -> RoomUpgrader:
        """Room upgrades: a replacement room, the old one's tombstone, aliases moved."""
        return RoomUpgrader(self.rooms, self.directory, self.server_name)

    @component
    def inbound_transactions(self) -> TransactionProcessor | ShardTransactionReceiver:
        """PUT /send: main checks, authorises and stores the PDUs; a worker shard (given the
        relay to main) checks them under its own budget and relays them."""
        checker = PduChecker(self.keyring, self.rooms, self.out_of_room_ends, self.server_acls)
        received = ReceivedTransactionStore(self.db, self.config.instance_name)
        if self._transaction_relay is None:
            processor = TransactionProcessor(
                checker,
                self.rooms,
                received,
                on_origin=self.federation_sender.on_inbound_transaction,
                on_edus=self._receive_edus,
                gaps=self.gaps,
                out_of_room=self.out_of_room_ends,
                staging_caps=self._staging_caps(),
                held=self._held_pdus(received),
            )
            self.metrics.track_gauge(
                "weir_inbound_transactions_waiting",
                "Inbound transactions waiting for their server's previous one to be applied",
                processor.waiting,
            )
            self.metrics.track_gauge(
                "weir_inbound_staged",
                "Inbound transactions answered 200 and not applied yet (rooms/staging.py)",
                received.staged_count,
            )
            self.metrics.track_counter(
                "weir_inbound_staging_refused",
                "Inbound transactions refused (429) past their server's staging caps",
                lambda: processor.staging_refused,
            )
            return processor
        return ShardTransactionReceiver(checker, received, self._transaction_relay)

    def _staging_caps(self) -> StagingCaps:
        limits = self.config.security.federation
        return StagingCaps(
            limits.staged_per_origin_max_pdus,
            limits.staged_per_origin_max_bytes,
            limits.staged_max_bytes,
        )

    def _held_pdus(self, received: ReceivedTransactionStore) -> HeldPdus:
        """PDUs whose missing events could not be fetched, kept and retried."""
        limits = self.config.security.federation
        held = HeldPdus(
            received,
            self._staging_caps(),
            limits.held_pdu_first_retry,
            limits.held_pdu_max_age,
        )
        self.metrics.track_gauge(
            "weir_inbound_held",
            "Received PDUs held because their missing events could not be fetched yet",
            received.held_count,
        )
        self.metrics.track_counter(
            "weir_inbound_held_retries", "Tries of held PDUs again", lambda: held.retries
        )
        self.metrics.track_counter(
            "weir_inbound_held_given_up",
            "Held PDUs dropped past held_pdu_max_age, their events never fetched",
            lambda: held.given_up,
        )
        return held

    @component
    def room_graph(self) -> RoomGraphStore:
        return RoomGraphStore(self.db, self.room_store)

    @component
    def remote_invites(self) -> RemoteInviteStore:
        return RemoteInviteStore(self.db)

    @component
    def out_of_room_ends(self) -> OutOfRoomEnds:
        """A kept invite rescinded, or a knock refused, by the room's server."""
        return OutOfRoomEnds(self.remote_invites, self.notifier.notify_users)

    @component
    def federation_membership(self) -> FederationMembership:
        """make_*/send_* and invites from other servers; events checked like any PDU."""
        return FederationMembership(
            self.rooms,
            PduChecker(self.keyring, self.rooms),
            self.room_graph,
            self.remote_invites,
            self.notifier.notify_users,
            self.server_acls,
            self._membership_relay,
        )

    @component
    def federation_reads(self) -> FederationReads:
        """What other servers may read of our rooms."""
        return FederationReads(self.rooms, self.room_graph, self.server_acls)

    @component
    def server_acls(self) -> ServerAcls:
        """Which servers each room lets take part (m.room.server_acl)."""
        return ServerAcls(self.room_store)

    @component
    def space_hierarchy(self) -> SpaceHierarchy:
        """The rooms under a space, as a user or another server may see them."""
        remote = RemoteHierarchy(
            self.federation_client,
            self.client_outbound_budget,
            self.address_cooldown,
            self.metrics,
            self.server_name,
        )
        return SpaceHierarchy(self.room_store, self.server_acls, remote)

    # --- /sync: waiting syncs park on the notifier --------------------------------------

    @component
    def notifier(self) -> Notifier:
        collector = CollectorHold()
        notifier = Notifier(
            self.room_store.joined_users, collector, joined_among=self.room_store.joined_among
        )
        self.metrics.track_gauge(
            "weir_sync_waiters", "Syncs registered to be woken", notifier.parked
        )
        self.metrics.track_counter(
            "weir_collector_holds",
            "Wake-ups of many syncs at once that held the garbage collector off",
            lambda: notifier.bursts,
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
    def push_rules(self) -> PushRules:
        return PushRules(PushStore(self.db), self.account_data)

    @component
    def push_actions(self) -> PushActions:
        """Each event's push actions for our users, written with it."""
        return PushActions(
            self.push_rules, self.rooms, self.server_name, on_notify=self.push_sender.wake
        )

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

    def _send_receipt(self, room_id: str, user_id: str, event_id: str, data: dict) -> None:
        """Our user's public read receipt, to the room's other servers (m.receipt EDU)."""
        read = {user_id: {"event_ids": [event_id], "data": data}}
        content = {room_id: {"m.read": read}}
        self.federation_sender.send_edu(self._other_servers(room_id), "m.receipt", content)
        receipt = {event_id: {"m.read": {user_id: data}}}
        self._to_appservices({"type": "m.receipt", "room_id": room_id, "content": receipt})

    def _receive_edus(self, origin: str, edus: list) -> None:
        """Typing and receipts (sync/edus.py), presence, then end-to-end encryption's (e2ee/)."""
        self.inbound_edus.receive(origin, edus)
        applied, dropped = self.presence.receive_remote(origin, edus)
        counter = self.metrics.inbound_edu_items
        if applied:
            counter.labels("m.presence", "accepted").inc(applied)
        if dropped:
            counter.labels("m.presence", "dropped").inc(dropped)
        self.e2ee_federation.inbound.receive(origin, edus)

    @component
    def presence(self) -> PresenceService:
        """Presence: our users' and other servers' (main tracks it; shards relay EDUs); with
        other instances, who is online until when is stored (sync/presence.py)."""
        return PresenceService(
            PresenceStore(self.db),
            self.server_name,
            self.config.presence.enabled,
            self.e2ee_store.users_sharing_a_room,
            self.notifier.notify_presence,
            self.federation_sender.send_edu,
            shared=self.clustered,
        )

    @component
    def inbound_edus(self) -> InboundEdus:
        """Remote users' typing and receipts, from /send (main only: typing is in memory)."""
        counter = self.metrics.inbound_edu_items
        return InboundEdus(
            self.room_store.joined_users,
            self.typing,
            self.receipts,
            self.server_acls.allows,
            lambda edu_type, outcome: counter.labels(edu_type, outcome).inc(),
        )

    @component
    def sync(self) -> SyncService:
        # Bound once: a label lookup costs more than the count, once per woken sync.
        wakes = {k: self.metrics.sync_wakes.labels(k) for k in ("recent_events", "database")}
        service = SyncService(
            self.rooms,
            self.room_history,
            self.sync_store,
            self.notifier,
            self.typing,
            self.filters,
            E2eeSync(self.e2ee_store),
            on_wake=lambda answered_from: wakes[answered_from].inc(),
            presence=self.presence,
            ruleset=self.push_rules.ruleset,
            notifications=Notifications(self.push_rules.store),
        )
        self.metrics.track_counter(
            "weir_sync_held_parks",
            "Long-polls that parked on their last answer's registration, with no computation",
            lambda: service.held.taken,
        )
        return service

    @component
    def sliding_sync(self) -> SlidingSync:
        """Simplified sliding sync (MSC4186) on /sync's parts; its connections kept."""
        config = self.config.sliding_sync
        store = SlidingSyncStore(self.db)
        connections = Connections(
            store,
            config.cached_connections,
            config.connection_lifetime,
            config.connections_per_device,
        )
        made = {k: self.metrics.sliding_lists.labels(k) for k in ("kept", "whole")}
        return SlidingSync(
            self.sync, connections, RoomLists(store), lambda made_from: made[made_from].inc()
        )
