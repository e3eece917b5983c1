"""Device keys, one-time keys and fallback keys: upload, query and claim (client-server
spec, "End-to-End Encryption", "Key management API").

Query and claim split the users they name into ours and other servers'. Other servers'
users go to `remote` (e2ee/remote_keys.py: our cache of their device lists, or
`/_matrix/federation/v1/user/keys/query` and `.../claim` under ADR-0079's budget and
deadline); without it their server is in `failures`.
"""

from __future__ import annotations

import logging
from typing import Iterable, Protocol

from homeserver.core.errors import Codes, MatrixError, invalid_param
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.e2ee.cross_signing import CrossSigning, KeysChanged
from homeserver.e2ee.signatures import has_valid_signature, invalid_signature, single_key
from homeserver.e2ee.sync_part import E2eeSync, Range
from homeserver.federation.admission import Caller
from homeserver.storage.e2ee import E2eeStore

log = logging.getLogger(__name__)

# What a client is told of a server we cannot ask yet (the spec leaves the value open;
# Synapse sends a status and a message).
NOT_FEDERATED = {"status": 503, "message": "Key queries over federation are not supported yet"}
MAX_ONE_TIME_KEYS_PER_DEVICE = 10_000  # clients keep about 50; a cap on what one can store


class RemoteKeyCalls(Protocol):
    """Other servers' users' keys, for a client: `remote` is {server: {user: wanted}};
    answers and `failures` go into `out`, as /keys/query and /keys/claim shape them."""

    def query(self, caller: Caller, remote: dict[str, dict], out: dict) -> None: ...

    def claim(self, caller: Caller, remote: dict[str, dict], out: dict) -> None: ...


class KeyService:
    def __init__(
        self,
        store: E2eeStore,
        server_name: str,
        on_keys_changed: KeysChanged,
    ):
        self.store = store
        self.cross_signing = CrossSigning(store, server_name, on_keys_changed)
        self.cross_signing.remote_master = self._remote_master
        self.server_name = server_name
        self.on_keys_changed = on_keys_changed
        self.device_lists = E2eeSync(store)
        # Other servers' users' keys (e2ee/remote_keys.py), set by the runtime.
        self.remote: RemoteKeyCalls | None = None

    # --- upload -------------------------------------------------------------------------

    def upload(self, requester: Requester, body: dict) -> dict:
        user_id, device_id = requester.user_id, requester.device_id
        device_keys = body.get("device_keys")
        if device_keys is not None:
            self._check_device_keys(requester, device_keys)
            if self.store.put_device_keys(user_id, device_id, device_keys):
                self.on_keys_changed(user_id, devices=(device_id,))
        signing_key = self._device_signing_key(requester, device_keys)
        one_time = self._parse_keys(
            body.get("one_time_keys"), "one_time_keys", (user_id, device_id), signing_key
        )
        if one_time:
            held = sum(self.store.one_time_key_counts(user_id, device_id).values())
            if held + len(one_time) > MAX_ONE_TIME_KEYS_PER_DEVICE:
                raise MatrixError(
                    400, Codes.LIMIT_EXCEEDED, "Too many one-time keys held for this device"
                )
            conflicts = self.store.add_one_time_keys(user_id, device_id, one_time)
            if conflicts:
                raise invalid_param(
                    f"One-time key {conflicts[0]} already exists with other content"
                )
        fallback = self._parse_keys(
            body.get("fallback_keys"), "fallback_keys", (user_id, device_id), signing_key
        )
        if fallback:
            if len({algorithm for algorithm, _, _ in fallback}) != len(fallback):
                raise invalid_param("One fallback key per algorithm")
            self.store.set_fallback_keys(user_id, device_id, fallback)
        return {"one_time_key_counts": self.store.one_time_key_counts(user_id, device_id)}

    def _check_device_keys(self, requester: Requester, keys: object) -> None:
        if not isinstance(keys, dict):
            raise invalid_param("device_keys must be an object")
        if keys.get("user_id") != requester.user_id:
            raise invalid_param("device_keys.user_id is not the uploader's")
        if keys.get("device_id") != requester.device_id:
            raise invalid_param("device_keys.device_id is not the uploader's device")
        algorithms, key_map = keys.get("algorithms"), keys.get("keys")
        if not isinstance(algorithms, list) or not all(isinstance(a, str) for a in algorithms):
            raise invalid_param("device_keys.algorithms must be a list of strings")
        if not isinstance(key_map, dict) or not all(isinstance(v, str) for v in key_map.values()):
            raise invalid_param("device_keys.keys must map key IDs to keys")
        key_id = f"ed25519:{requester.device_id}"
        if key_id not in key_map:
            raise invalid_param(f"device_keys.keys has no {key_id}")
        # The device signs its own keys: without that, anyone could publish keys for it.
        if not has_valid_signature(keys, requester.user_id, key_id, key_map[key_id]):
            raise invalid_signature("device_keys are not signed by the device's own ed25519 key")

    def _device_signing_key(self, requester: Requester, uploaded: object) -> str | None:
        keys = uploaded if isinstance(uploaded, dict) else None
        if keys is None:
            keys = self.store.device_keys(requester.user_id, requester.device_id)
        public = (keys or {}).get("keys", {}).get(f"ed25519:{requester.device_id}")
        return public if isinstance(public, str) else None

    def _parse_keys(
        self, keys: object, name: str, signer: tuple[str, str], signing_key: str | None
    ) -> list[tuple[str, str, object]]:
        """[(algorithm, key_id, key)] of `algorithm:key_id` -> key. A signed key (an
        object) must carry the device's signature, checked when its keys are known."""
        if keys is None:
            return []
        if not isinstance(keys, dict):
            raise invalid_param(f"{name} must be an object")
        out = []
        for full_id, key in keys.items():
            algorithm, sep, key_id = full_id.partition(":")
            if not (sep and algorithm and key_id) or len(full_id) > 255:
                raise invalid_param(f"{name}: {full_id[:80]!r} is not algorithm:key_id")
            if not isinstance(key, (str, dict)):
                raise invalid_param(f"{name}: {full_id} must be a string or an object")
            if isinstance(key, dict) and signing_key is not None:
                user_id, device_id = signer
                if not has_valid_signature(key, user_id, f"ed25519:{device_id}", signing_key):
                    raise invalid_signature(f"{name}: {full_id} is not signed by this device")
            out.append((algorithm, key_id, key))
        return out

    # --- query --------------------------------------------------------------------------

    def query(self, requester: Requester, device_keys: dict, caller: Caller | None = None) -> dict:
        if not isinstance(device_keys, dict):
            raise invalid_param("device_keys must be an object")
        out: dict = {
            "device_keys": {},
            "failures": {},
            "master_keys": {},
            "self_signing_keys": {},
            "user_signing_keys": {},
        }
        remote: dict[str, dict] = {}
        for user_id, wanted in device_keys.items():
            if not is_valid_user_id(user_id) or not isinstance(wanted, list):
                raise invalid_param("device_keys must map user IDs to lists of device IDs")
            if server_of(user_id) != self.server_name:
                remote.setdefault(server_of(user_id), {})[user_id] = wanted
                continue
            self.query_local(requester.user_id, user_id, set(wanted), out)
        self._remote_query(caller or Caller(requester.user_id), remote, out)
        for server_users in remote.values():
            for user_id in server_users:
                self._with_own_signatures(requester.user_id, user_id, out)
        return out

    def _with_own_signatures(self, viewer: str, user_id: str, out: dict) -> None:
        """Another server's user's master key as it came, with `viewer`'s signatures on it
        (made with their user-signing key: e2ee/cross_signing.py)."""
        master = out["master_keys"].get(user_id)
        if not isinstance(master, dict):
            return
        signatures = self.cross_signing.visible_signatures(viewer, user_id)
        try:
            _, public = single_key(master, "master_key")
        except MatrixError:
            return
        if signatures.get(public):
            out["master_keys"][user_id] = self.cross_signing.with_signatures(
                master, signatures[public]
            )

    def _remote_master(self, user_id: str, caller: Caller | None) -> dict | None:
        """Another server's user's master key, as their server gives it now."""
        out: dict = {"device_keys": {}, "failures": {}, "master_keys": {}, "self_signing_keys": {}}
        self._remote_query(caller or Caller(user_id), {server_of(user_id): {user_id: []}}, out)
        master = out["master_keys"].get(user_id)
        return master if isinstance(master, dict) else None

    def query_local(
        self, viewer: str, user_id: str, wanted: set, out: dict, display_names: bool = True
    ) -> None:
        """Our user's keys as `viewer` sees them (a user ID, or "" for another server), into
        `out`. Display names stay home unless `display_names`, as Synapse's default does."""
        devices = self.store.query_device_keys(user_id)
        signatures = self.cross_signing.visible_signatures(viewer, user_id)
        shown = {}
        for device_id, (keys, display_name) in devices.items():
            if wanted and device_id not in wanted:
                continue
            keys = self.cross_signing.with_signatures(keys, signatures.get(device_id, ()))
            # Display names are shown to everyone who may query keys, as the spec's
            # `unsigned.device_display_name` says.
            if display_name is not None and display_names:
                keys["unsigned"] = {**keys.get("unsigned", {}), "device_display_name": display_name}
            shown[device_id] = keys
        out["device_keys"][user_id] = shown
        for key_type, key in self.cross_signing.keys_for(viewer, user_id).items():
            if f"{key_type}_keys" in out:
                out[f"{key_type}_keys"][user_id] = key

    def _remote_query(self, caller: Caller, remote: dict[str, dict], out: dict) -> None:
        if not remote:
            return
        if self.remote is None:
            for server in remote:
                out["failures"][server] = NOT_FEDERATED
            return
        self.remote.query(caller, remote, out)

    # --- changes ------------------------------------------------------------------------

    def changes(self, requester: Requester, span: Range) -> dict:
        """GET /keys/changes: device list changes between two sync tokens."""
        changed, left = self.device_lists.changes(requester.user_id, span)
        return {"changed": changed, "left": left}

    # --- claim --------------------------------------------------------------------------

    def claim(
        self, requester: Requester, one_time_keys: dict, caller: Caller | None = None
    ) -> dict:
        if not isinstance(one_time_keys, dict):
            raise invalid_param("one_time_keys must be an object")
        out: dict = {"one_time_keys": {}, "failures": {}}
        remote: dict[str, dict] = {}
        for user_id, devices in one_time_keys.items():
            if not is_valid_user_id(user_id) or not isinstance(devices, dict):
                raise invalid_param("one_time_keys must map user IDs to devices")
            if not all(isinstance(a, str) for a in devices.values()):
                raise invalid_param("one_time_keys: each device maps to an algorithm")
            if server_of(user_id) != self.server_name:
                remote.setdefault(server_of(user_id), {})[user_id] = devices
                continue
            claimed = self.claim_local(user_id, devices.items())
            if claimed:
                out["one_time_keys"][user_id] = claimed
        self._remote_claim(caller or Caller(requester.user_id), remote, out)
        return out

    def claim_local(self, user_id: str, devices: Iterable[tuple[str, str]]) -> dict:
        claimed = {}
        for device_id, algorithm in devices:
            key = self.store.claim_key(user_id, device_id, algorithm)
            if key is not None:
                claimed[device_id] = {f"{algorithm}:{key[0]}": key[1]}
        return claimed

    def _remote_claim(self, caller: Caller, remote: dict[str, dict], out: dict) -> None:
        if not remote:
            return
        if self.remote is None:
            for server in remote:
                out["failures"][server] = NOT_FEDERATED
            return
        self.remote.claim(caller, remote, out)
