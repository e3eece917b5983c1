"""Other servers' end-to-end encryption EDUs: m.device_list_update, m.signing_key_update and
m.direct_to_device (server-server spec, "Device Management" and "Send-to-device messaging"),
from /send; homeserver/rooms/transactions.py hands them to main after the PDUs.

Every item is checked on its own and dropped alone when it fails (EDUs get no answer): the
user it is about (the sender, for a to-device message) belongs to the transaction's origin,
and IDs and numbers are well formed.

Device lists: we keep a user's list only while they share a room with ours (otherwise no
update reaches us and a copy would go stale), starting with the first update we hear of.
Updates whose `prev_id`s are all our copy's `stream_id` (or earlier updates of the same
transaction) are applied; otherwise one was missed, and the list is fetched again with
`/user/devices` (`DeviceListResync`). Either way our users' /sync names the user in
`device_lists.changed`.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable
from urllib.parse import quote

import gevent
from gevent.pool import Group

from budget import DeadlineExceeded, InFlightBudget
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.e2ee.to_device import ToDeviceService
from homeserver.federation.client import FederationClient
from homeserver.federation.errors import FederationError
from homeserver.storage.e2ee_remote import RemoteDeviceStore

log = logging.getLogger(__name__)

MAX_ID_BYTES = 255
MAX_STREAM_ID = 2**63 - 1
# Resyncs are calls another server causes: a budget of their own, a share per origin, so
# one server's churn cannot take them all. Refused, the copy is dropped (queries then go to
# the user's server), never queued.
RESYNC_MAX_IN_FLIGHT = 10
RESYNC_PER_ORIGIN = 2
RESYNC_DEADLINE_SECONDS = 30.0
DEVICES_MAX_BYTES = 8 * 1024 * 1024
MAX_DEVICES_PER_USER = 10_000

# outcome(edu_type, "accepted" | "dropped")
Outcome = Callable[[str, str], None]


def _is_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value.encode()) <= MAX_ID_BYTES


def _is_stream_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STREAM_ID


def _user_of(content: object, origin: str, key: str = "user_id") -> str | None:
    user_id = content.get(key) if isinstance(content, dict) else None
    if isinstance(user_id, str) and is_valid_user_id(user_id) and server_of(user_id) == origin:
        return user_id
    return None


def parse_devices(body: object, user_id: str) -> tuple[int, dict]:
    """(stream_id, cached list) from a /user/devices answer; ValueError if malformed."""
    if not isinstance(body, dict) or body.get("user_id") != user_id:
        raise ValueError("user/devices answer is not about the user asked for")
    stream_id, devices = body.get("stream_id"), body.get("devices")
    if not _is_stream_id(stream_id) or not isinstance(devices, list):
        raise ValueError("user/devices answer has no stream_id or devices")
    if len(devices) > MAX_DEVICES_PER_USER:
        raise ValueError("user/devices answer has too many devices")
    doc: dict = {"devices": {}}
    for device in devices:
        keys = device.get("keys") if isinstance(device, dict) else None
        device_id = device.get("device_id") if isinstance(device, dict) else None
        if _is_id(device_id) and isinstance(keys, dict) and keys.get("user_id") == user_id:
            doc["devices"][device_id] = keys
    for key_type in ("master_key", "self_signing_key"):
        key = body.get(key_type)
        if isinstance(key, dict) and key.get("user_id") == user_id:
            doc[key_type] = key
    return int(stream_id), doc  # type: ignore[arg-type]


class DeviceListResync:
    """Fetches a user's whole list from their server, in a greenlet of its own, under
    `RESYNC_MAX_IN_FLIGHT` (and `RESYNC_PER_ORIGIN`) and a deadline. One per user at a
    time; an update arriving meanwhile runs it once more after."""

    def __init__(
        self,
        client: FederationClient,
        store: RemoteDeviceStore,
        on_changed: Callable[[str], None],
    ):
        self.client = client
        self.store = store
        self.on_changed = on_changed
        self.budget = InFlightBudget(RESYNC_MAX_IN_FLIGHT, RESYNC_PER_ORIGIN, name="device_resync")
        self.group = Group()
        self._running: set[str] = set()
        self._again: set[str] = set()
        self.refused = 0

    def request(self, user_id: str) -> None:
        if user_id in self._running:
            self._again.add(user_id)
            return
        slot = self.budget.try_acquire(server_of(user_id))
        if slot is None:
            self.refused += 1
            self.store.forget(user_id)
            self.on_changed(user_id)
            return
        self._running.add(user_id)
        self.group.spawn(self._run, slot, user_id)

    def _run(self, slot, user_id: str) -> None:
        try:
            with slot:
                self._fetch(user_id)
        finally:
            self._running.discard(user_id)
            self.on_changed(user_id)
            if user_id in self._again:
                self._again.discard(user_id)
                gevent.spawn(self.request, user_id)

    def _fetch(self, user_id: str) -> None:
        server = server_of(user_id)
        path = f"/_matrix/federation/v1/user/devices/{quote(user_id, safe='')}"
        deadline = self.client.deadline(RESYNC_DEADLINE_SECONDS, what=f"devices of {user_id}")
        try:
            body = self.client.get_json(
                server, path, deadline=deadline, max_bytes=DEVICES_MAX_BYTES
            )
            stream_id, doc = parse_devices(body, user_id)
        except (FederationError, DeadlineExceeded, ValueError) as e:
            log.info("device list resync of %s failed: %s", user_id, e)
            self.store.forget(user_id)
            return
        self.store.put(user_id, stream_id, doc)

    def close(self) -> None:
        self.group.kill(block=True, timeout=5)


class E2eeEdus:
    def __init__(
        self,
        store: RemoteDeviceStore,
        to_device: ToDeviceService,
        resync: DeviceListResync,
        on_changed: Callable[[str], None],
        outcome: Outcome | None = None,
    ):
        self.store = store
        self.to_device = to_device
        self.resync = resync
        self.on_changed = on_changed
        self._outcome = outcome or (lambda edu_type, outcome: None)

    def receive(self, origin: str, edus: Iterable[dict]) -> None:
        updates: dict[str, list[dict]] = {}
        for edu in edus:
            edu_type, content = edu.get("edu_type"), edu.get("content")
            if edu_type == "m.device_list_update":
                user_id = _user_of(content, origin)
                if user_id is None or not isinstance(content, dict) or not _is_update(content):
                    self._outcome(edu_type, "dropped")
                    continue
                updates.setdefault(user_id, []).append(content)
            elif edu_type == "m.signing_key_update":
                self._signing_keys(origin, content)
            elif edu_type == "m.direct_to_device":
                sender = _user_of(content, origin, "sender")
                accepted = (
                    sender is not None
                    and isinstance(content, dict)
                    and self.to_device.receive_remote(sender, content)
                )
                self._outcome(edu_type, "accepted" if accepted else "dropped")
        for user_id, user_updates in updates.items():
            self._device_updates(user_id, user_updates)

    def _device_updates(self, user_id: str, updates: list[dict]) -> None:
        if not self.store.is_joined_anywhere(user_id):
            for _ in updates:
                self._outcome("m.device_list_update", "dropped")
            return
        for _ in updates:
            self._outcome("m.device_list_update", "accepted")
        cached = self.store.cached(user_id)
        if cached is None:
            self.resync.request(user_id)
            return
        stream_id, doc = cached
        fresh = [u for u in updates if u["stream_id"] > stream_id]
        if not fresh:
            return  # already applied (a transaction sent again)
        if not _chained(stream_id, fresh):
            self.resync.request(user_id)
            return
        devices = doc.setdefault("devices", {})
        for update in fresh:
            _apply(devices, user_id, update)
        if len(devices) > MAX_DEVICES_PER_USER:
            self.store.forget(user_id)
        else:
            self.store.put(user_id, max(u["stream_id"] for u in fresh), doc)
        self.on_changed(user_id)

    def _signing_keys(self, origin: str, content: object) -> None:
        user_id = _user_of(content, origin)
        if user_id is None or not self.store.is_joined_anywhere(user_id):
            self._outcome("m.signing_key_update", "dropped")
            return
        assert isinstance(content, dict)
        cached = self.store.cached(user_id)
        if cached is not None:
            stream_id, doc = cached
            for key_type in ("master_key", "self_signing_key"):
                key = content.get(key_type)
                if isinstance(key, dict) and key.get("user_id") == user_id:
                    doc[key_type] = key
            self.store.put(user_id, stream_id, doc)
        else:
            self.store.mark_changed([user_id])
        self._outcome("m.signing_key_update", "accepted")
        self.on_changed(user_id)


def _is_update(content: dict) -> bool:
    prev = content.get("prev_id", [])
    if not isinstance(prev, list) or len(prev) > 100 or not all(_is_stream_id(p) for p in prev):
        return False
    content.setdefault("prev_id", prev)
    return _is_id(content.get("device_id")) and _is_stream_id(content.get("stream_id"))


def _chained(stream_id: int, updates: list[dict]) -> bool:
    """Each update follows our copy (`stream_id`) or an earlier update of the batch: none
    was missed. An update with no prev_id cannot say, as Synapse also reads it."""
    known = {stream_id}
    for update in updates:
        if not update["prev_id"] or not set(update["prev_id"]) <= known:
            return False
        known.add(update["stream_id"])
    return True


def _apply(devices: dict, user_id: str, update: dict) -> None:
    keys = update.get("keys")
    if update.get("deleted") is True:
        devices.pop(update["device_id"], None)
    elif isinstance(keys, dict) and keys.get("user_id") == user_id:
        devices[update["device_id"]] = keys
