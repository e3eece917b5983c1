"""To-device messages (client-server spec, "Send-to-Device messaging").

A message is stored once per sender device and transaction ID, delivered in the recipient
device's /sync `to_device`, and deleted when that device syncs again with a `since` past
it (storage/e2ee.py).

The bound: a device holds at most MAX_PENDING_PER_DEVICE undelivered messages. Past it, new
messages to that device are dropped (counted in `dropped`, logged), and the request still
succeeds for every other recipient. Dropping the newest, not the oldest, keeps the first
Olm pre-key message of a session, without which nothing later decrypts; a client that
misses a room key asks again (m.room_key_request) once the device syncs.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from homeserver.core.clock import now_ms
from homeserver.core.errors import invalid_param
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.metrics import Metrics
from homeserver.storage.e2ee import E2eeStore

log = logging.getLogger(__name__)

# A device offline for weeks in many encrypted rooms gathers a few thousand room keys.
MAX_PENDING_PER_DEVICE = 10_000
MAX_TXN_ID = 255


class ToDeviceService:
    def __init__(
        self,
        store: E2eeStore,
        server_name: str,
        notify_users: Callable[[Iterable[str]], None],
        max_pending: int = MAX_PENDING_PER_DEVICE,
    ):
        self.store = store
        self.server_name = server_name
        self.notify_users = notify_users
        self.max_pending = max_pending
        self.dropped = 0

    def track_figures(self, metrics: Metrics) -> None:
        metrics.track_counter(
            "weir_to_device_dropped",
            "To-device messages dropped because their device held too many undelivered",
            lambda: self.dropped,
        )

    def send(self, requester: Requester, event_type: str, txn_id: str, messages: object) -> None:
        if not (0 < len(txn_id) <= MAX_TXN_ID):
            raise invalid_param("txnId must be 1 to 255 characters")
        if not isinstance(messages, dict):
            raise invalid_param("messages must be an object")
        local: list[tuple[str, str, dict]] = []
        for user_id, by_device in messages.items():
            if not is_valid_user_id(user_id) or not isinstance(by_device, dict):
                raise invalid_param("messages must map user IDs to devices")
            if not all(isinstance(c, dict) for c in by_device.values()):
                raise invalid_param("Each message content must be an object")
            if server_of(user_id) != self.server_name:
                # Federation hook: an m.direct_to_device EDU to the user's server. Until
                # then nothing is sent there.
                log.info("to-device message for %s not sent: no federation yet", user_id)
                continue
            local += self._expand(user_id, by_device)
        stored, full = self.store.send_to_device(
            (requester.user_id, requester.device_id),
            txn_id,
            event_type,
            local,
            self.max_pending,
            now_ms(),
        )
        if full:
            self.dropped += len(full)
            log.warning("to-device messages dropped, devices full: %s", full[:10])
        if stored:
            self.notify_users({user_id for user_id, _, _ in local})

    def _expand(self, user_id: str, by_device: dict) -> list[tuple[str, str, dict]]:
        """`*` is every device of the user; a device that does not exist gets nothing."""
        devices = {row[0] for row in self.store.devices(user_id)}
        out = []
        for device_id, content in by_device.items():
            targets = devices if device_id == "*" else {device_id} & devices
            out += [(user_id, d, content) for d in sorted(targets)]
        return out
