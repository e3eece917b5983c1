"""The end-to-end encryption part of the composition root: keys, devices, to-device
messages and key backups (runtime/__init__.py builds the rest)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeserver.core.components import component
from homeserver.core.identifiers import server_of
from homeserver.e2ee.devices import DeviceService
from homeserver.e2ee.federation import E2eeFederation
from homeserver.e2ee.key_backup import KeyBackupService
from homeserver.e2ee.keys import KeyService
from homeserver.e2ee.remote_keys import RemoteKeys
from homeserver.e2ee.to_device import ToDeviceService
from homeserver.runtime.infrastructure import Infrastructure
from homeserver.storage.e2ee import E2eeStore
from homeserver.storage.e2ee_remote import RemoteDeviceStore
from homeserver.storage.key_backup import KeyBackupStore

if TYPE_CHECKING:
    from homeserver.accounts.service import AccountService
    from homeserver.appservice.sender import AppserviceSender
    from homeserver.sync.notifier import Notifier


class E2eeComponents(Infrastructure):
    if TYPE_CHECKING:  # built by HomeserverRuntime, which derives from this class
        notifier: Notifier
        accounts: AccountService
        appservice_sender: AppserviceSender

    @component
    def e2ee_store(self) -> E2eeStore:
        # Shards claim one-time keys over federation, unheard: counts cannot be kept across
        # a wake. Other instances announce theirs (sync/cluster.py).
        elsewhere = self.config.federation.worker.shards > 0
        return E2eeStore(self.db, keys_written_elsewhere=elsewhere)

    def _keys_changed(self, user_id: str, devices=(), signing: bool = False) -> None:
        """Wakes the syncs of all who share a room with the user; tells other servers."""
        if self.notifier.waiting():
            self.notifier.notify_users(self.e2ee_store.users_sharing_a_room(user_id))
        if (devices or signing) and server_of(user_id) == self.server_name:
            self.e2ee_federation.server.changed(user_id, devices, signing)

    @component
    def keys(self) -> KeyService:
        """Keys and cross-signing; other servers' users' under ADR-0079 (e2ee/remote_keys.py)."""
        keys = KeyService(self.e2ee_store, self.server_name, self._keys_changed)
        budget, cooldown = self.client_outbound_budget, self.address_cooldown
        keys.remote = RemoteKeys(
            self.federation_client,
            budget,
            cooldown,
            self.metrics,
            RemoteDeviceStore(self.db),
            # Their whole list, fetched in the background (e2ee/inbound_edus.py).
            cache_user=lambda user_id: self.e2ee_federation.resync.request(user_id),
        )
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
            self.federation_sender,
            self._keys_changed,
            self.metrics,
        )

    @component
    def devices(self) -> DeviceService:
        return DeviceService(self.e2ee_store, self.accounts, self._keys_changed)

    @component
    def to_device(self) -> ToDeviceService:
        service = ToDeviceService(
            self.e2ee_store,
            self.server_name,
            self.notifier.notify_users,
            self.federation_sender,
            on_local=lambda *message: self.appservice_sender.send_to_device(*message),
        )
        service.track_figures(self.metrics)
        return service

    @component
    def key_backup(self) -> KeyBackupService:
        return KeyBackupService(KeyBackupStore(self.db))
