"""Our users' keys as other servers see them (server-server spec, "End-to-End Encryption"):
the answers to `/user/keys/query`, `/user/keys/claim` and `/user/devices/{userId}`, and the
m.device_list_update and m.signing_key_update EDUs we send when they change.

Only our users are answered; other servers' users in a request are left out, as Synapse
does. Device display names stay home (Synapse's default,
`allow_device_name_lookup_over_federation: false`), and user-signing keys too (the spec:
only the owner sees theirs). A request names at most `MAX_USERS` users or `MAX_DEVICES`
devices to claim: more is 413 M_TOO_LARGE, so one request costs a known number of reads.

Device list updates: each change of a user's devices takes a position in the device list
stream (storage/e2ee.py); its EDUs carry that position as `stream_id` and the previous one
sent as `prev_id` (storage/e2ee_remote.py), which is also what `/user/devices` answers as
its `stream_id`, so a server that holds our list applies the update, and one that missed
one fetches the list again. They go to every server with a user in a room with ours, as
durable EDUs (homeserver/federation/sender.py): queued in the write that takes their
position, sent in order, kept across restarts.
"""

from __future__ import annotations

from typing import Callable, Iterable

from homeserver.core.errors import Codes, MatrixError, invalid_param
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.e2ee.inbound_edus import DeviceListResync, E2eeEdus
from homeserver.e2ee.keys import KeyService
from homeserver.e2ee.to_device import ToDeviceService
from homeserver.federation.client import FederationClient
from homeserver.federation.sender import FederationSender
from homeserver.metrics import Metrics
from homeserver.storage.e2ee import E2eeStore
from homeserver.storage.e2ee_remote import RemoteDeviceStore

MAX_USERS = 1000
MAX_DEVICES = 1000


def _too_large(what: str) -> MatrixError:
    return MatrixError(413, Codes.TOO_LARGE, f"Too many {what} in one request")


def _empty_query() -> dict:
    return {"device_keys": {}, "master_keys": {}, "self_signing_keys": {}}


class FederationKeys:
    def __init__(
        self,
        keys: KeyService,
        store: E2eeStore,
        remote_store: RemoteDeviceStore,
        server_name: str,
        outbound: FederationSender,
    ):
        self.keys = keys
        self.store = store
        self.remote_store = remote_store
        self.server_name = server_name
        self.outbound = outbound

    def _ours(self, user_id: object) -> bool:
        if not isinstance(user_id, str) or not is_valid_user_id(user_id):
            raise invalid_param("Keys are asked for by user ID")
        return server_of(user_id) == self.server_name

    # --- answers ------------------------------------------------------------------------

    def query(self, device_keys: object) -> dict:
        """POST /user/keys/query."""
        if not isinstance(device_keys, dict):
            raise invalid_param("device_keys must be an object")
        if len(device_keys) > MAX_USERS:
            raise _too_large("users")
        out = _empty_query()
        for user_id, wanted in device_keys.items():
            if not isinstance(wanted, list) or not all(isinstance(d, str) for d in wanted):
                raise invalid_param("device_keys must map user IDs to lists of device IDs")
            if self._ours(user_id):
                self.keys.query_local("", user_id, set(wanted), out, display_names=False)
        return out

    def claim(self, one_time_keys: object) -> dict:
        """POST /user/keys/claim."""
        if not isinstance(one_time_keys, dict):
            raise invalid_param("one_time_keys must be an object")
        wanted = list(one_time_keys.items())
        if not all(isinstance(devices, dict) for _, devices in wanted):
            raise invalid_param("one_time_keys must map user IDs to devices")
        if sum(len(devices) for _, devices in wanted) > MAX_DEVICES:
            raise _too_large("devices")
        claimed: dict = {}
        for user_id, devices in wanted:
            if not all(isinstance(a, str) for a in devices.values()):
                raise invalid_param("one_time_keys: each device maps to an algorithm")
            if self._ours(user_id):
                keys = self.keys.claim_local(user_id, devices.items())
                if keys:
                    claimed[user_id] = keys
        return {"one_time_keys": claimed}

    def devices(self, user_id: str) -> dict:
        """GET /user/devices/{userId}: the stream position is read before the keys, so a
        change made meanwhile comes again with a higher one."""
        if not self._ours(user_id):
            raise invalid_param("User is not hosted on this homeserver")
        stream_id = self.remote_store.latest_position(user_id)
        out = _empty_query()
        self.keys.query_local("", user_id, set(), out, display_names=False)
        shown = out["device_keys"].get(user_id, {})
        answer: dict = {
            "user_id": user_id,
            "stream_id": stream_id,
            "devices": [{"device_id": d, "keys": shown[d]} for d in sorted(shown)],
        }
        for key_type in ("master", "self_signing"):
            if user_id in out[f"{key_type}_keys"]:
                answer[f"{key_type}_key"] = out[f"{key_type}_keys"][user_id]
        return answer

    # --- updates we send ------------------------------------------------------------------

    def _servers_sharing(self, user_id: str) -> list[str]:
        servers = {server_of(u) for u in self.store.users_sharing_a_room(user_id)}
        return sorted(servers - {self.server_name})

    def changed(self, user_id: str, devices: Iterable[str] = (), signing: bool = False) -> None:
        """Our user's devices (or master/self-signing keys, `signing`) changed: tell the
        servers that share a room with them."""
        devices = sorted(set(devices))
        servers = self._servers_sharing(user_id)
        if devices and not servers:
            # Taken even with no server to tell, so the chain of prev_ids stays whole.
            self.remote_store.next_outbound(user_id)
        elif devices:
            edus, left_out = self.remote_store.queue_device_updates(
                user_id,
                servers,
                self._device_updates(user_id, devices),
                self.outbound.max_queued_edus,
            )
            self.outbound.durable_edus_queued(edus, left_out)
        if signing and servers:
            out = _empty_query()
            self.keys.query_local("", user_id, {""}, out, display_names=False)
            content: dict = {"user_id": user_id}
            for key_type in ("master", "self_signing"):
                if user_id in out[f"{key_type}_keys"]:
                    content[f"{key_type}_key"] = out[f"{key_type}_keys"][user_id]
            self.outbound.queue_durable_edus(
                [(server, "m.signing_key_update", content) for server in servers]
            )

    def _device_updates(self, user_id: str, devices: list[str]) -> list[dict]:
        """Each device's part of its m.device_list_update: its keys, or that it is gone."""
        out = _empty_query()
        self.keys.query_local("", user_id, set(devices), out, display_names=False)
        shown = out["device_keys"].get(user_id, {})
        existing = {row[0] for row in self.store.devices(user_id)}
        updates = []
        for device_id in devices:
            update: dict = {"device_id": device_id}
            if device_id in shown:
                update["keys"] = shown[device_id]
            elif device_id not in existing:
                update["deleted"] = True
            updates.append(update)
        return updates


class E2eeFederation:
    """What the runtime builds for end-to-end encryption across servers: the answers to
    other servers (`server`), their EDUs (`inbound`) and the resyncs those cause."""

    def __init__(
        self,
        keys: KeyService,
        to_device: ToDeviceService,
        store: E2eeStore,
        remote_store: RemoteDeviceStore,
        client: FederationClient,
        outbound: FederationSender,
        on_changed: Callable[[str], None],
        metrics: Metrics,
    ):
        self.server = FederationKeys(keys, store, remote_store, keys.server_name, outbound)
        self.resync = DeviceListResync(client, remote_store, on_changed)
        metrics.track_budget(self.resync.budget)
        counter = metrics.inbound_edu_items
        self.inbound = E2eeEdus(
            remote_store,
            to_device,
            self.resync,
            on_changed,
            lambda edu_type, outcome: counter.labels(edu_type, outcome).inc(),
        )

    def close(self) -> None:
        self.resync.close()
