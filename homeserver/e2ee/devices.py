"""A user's devices (client-server spec, "Device management"): list, read, rename, delete.
Deleting logs the device out and forgets its keys (AccountService.remove_devices); the
blueprint asks for user-interactive auth first (accounts/uia.py)."""

from __future__ import annotations

from homeserver.accounts.service import AccountService
from homeserver.core.errors import not_found
from homeserver.core.requester import Requester
from homeserver.storage.e2ee import E2eeStore

MAX_DISPLAY_NAME = 512


def _device(row: tuple) -> dict:
    device_id, display_name, last_seen_ts = row
    out: dict = {"device_id": device_id}
    if display_name is not None:
        out["display_name"] = display_name
    if last_seen_ts is not None:
        out["last_seen_ts"] = last_seen_ts
    return out


class DeviceService:
    def __init__(self, store: E2eeStore, accounts: AccountService, on_keys_changed):
        self.store = store
        self.accounts = accounts
        self.on_keys_changed = on_keys_changed

    def all(self, requester: Requester) -> list[dict]:
        return [_device(row) for row in self.store.devices(requester.user_id)]

    def get(self, requester: Requester, device_id: str) -> dict:
        for row in self.store.devices(requester.user_id):
            if row[0] == device_id:
                return _device(row)
        raise not_found("No such device")

    def rename(self, requester: Requester, device_id: str, display_name: str | None) -> None:
        if not self.store.set_display_name(requester.user_id, device_id, display_name):
            raise not_found("No such device")
        # The name shows in others' /keys/query: wake them as for a key change.
        self.on_keys_changed(requester.user_id, devices=(device_id,))

    def delete(self, requester: Requester, device_ids: list[str]) -> None:
        """Unknown device IDs are ignored: deleting is idempotent, as in Synapse."""
        self.accounts.remove_devices(requester.user_id, device_ids)
