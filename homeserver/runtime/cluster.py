"""The runtime's typing and the wakes of other instances' writes: what several instances
share beyond the database (docs/architecture.md, "Several instances"), beside the domain
services runtime/__init__.py builds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from homeserver.core.components import component
from homeserver.runtime.media import MediaComponents
from homeserver.storage.cluster_memory import ClusterMemoryStore
from homeserver.storage.stream_changes import StreamChanges
from homeserver.sync.cluster import ClusterWakes, KeptInMemory
from homeserver.sync.typing import TypingNotifications

if TYPE_CHECKING:
    from homeserver.accounts.service import AccountService
    from homeserver.appservice.sender import AppserviceSender
    from homeserver.appservice.service import AppserviceService
    from homeserver.rooms.service import RoomService
    from homeserver.storage.e2ee import E2eeStore
    from homeserver.sync.notifier import Notifier
    from homeserver.sync.presence import PresenceService
    from homeserver.sync.push_actions import PushActions
    from homeserver.sync.push_ruleset import PushRules


class ClusterComponents(MediaComponents):
    if TYPE_CHECKING:  # built by HomeserverRuntime, which derives from this class
        accounts: AccountService
        appservices: AppserviceService
        appservice_sender: AppserviceSender
        e2ee_store: E2eeStore
        notifier: Notifier
        presence: PresenceService
        push_actions: PushActions
        push_rules: PushRules
        rooms: RoomService

    @property
    def clustered(self) -> bool:
        """Other instances share the (PostgreSQL) database."""
        return self.config.cluster.instances > 1

    @component
    def typing(self) -> TypingNotifications:
        """In memory; with other instances, shared through rows of the database."""
        return TypingNotifications(
            self.rooms,
            self.notifier.notify_room,
            on_local_typing=self._send_typing,
            instance=self.config.instance_name,
            shared=ClusterMemoryStore(self.db) if self.clustered else None,
        )

    def _other_servers(self, room_id: str) -> list[str]:
        return [s for s in self.rooms.joined_servers(room_id) if s != self.server_name]

    def _send_typing(self, room_id: str, user_id: str, typing: bool, here: bool) -> None:
        """Our user's typing, to the room's other servers (spec: m.typing EDU). Every
        instance hears of it; one sends it to each server (`send_edu_where_held`), and the
        instance it happened on (`here`) to the appservices."""
        content = {"room_id": room_id, "user_id": user_id, "typing": typing}
        servers, sender = self._other_servers(room_id), self.federation_sender
        if self.clustered:
            sender.send_edu_where_held(servers, "m.typing", content, here)
        else:
            sender.send_edu(servers, "m.typing", content)
        if here:
            typing_now = {"user_ids": self.typing.changes([room_id], 0).get(room_id, [])}
            self._to_appservices({"type": "m.typing", "room_id": room_id, "content": typing_now})

    def _to_appservices(self, edu: dict) -> None:
        """Typing and receipts to the appservices asking for them, in rooms they watch."""
        wants = self.appservices.interested_in_room
        self.appservice_sender.send_ephemeral(edu, lambda r: wants(r, edu["room_id"]))

    @component
    def cluster_wakes(self) -> ClusterWakes:
        """Other instances' writes, heard through LISTEN/NOTIFY, wake this one's syncs and
        put right what this one keeps in memory."""
        kept = KeptInMemory(
            forget_room=self.push_actions.forget_room,
            forget_rules=self.push_rules.forget,
            forget_presence=self.presence.forget,
            forget_tokens=self.accounts.forget_revoked,
            typing_upto=self.typing.apply_upto,
            keys_written=self.e2ee_store.heard_key_writes,
        )
        wakes = ClusterWakes(
            StreamChanges(self.db), self.notifier, self.e2ee_store.users_sharing_a_room, kept
        )
        self.notifier.others_below = wakes.events_below
        self.metrics.track_counter(
            "weir_cluster_wakes",
            "Ranges of other instances' writes read to wake syncs here",
            lambda: wakes.wakes,
        )
        self.metrics.track_gauges(
            "weir_cluster_position",
            "Position of each stream up to which other instances' writes are applied here",
            "stream",
            wakes.positions,
        )
        return wakes
