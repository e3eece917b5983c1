"""To-device messages (client-server spec, "Send-to-Device messaging").

A message is stored once per sender device and transaction ID, delivered in the recipient
device's /sync `to_device`, and deleted when that device syncs again with a `since` past
it (storage/e2ee.py).

Other servers' users get theirs in an m.direct_to_device EDU to their server, one per server
and transaction, queued in the federation sender's outbox in the write that stores the local
ones (homeserver/federation/sender.py: durable EDUs, in order, kept across restarts); other
servers' EDUs to our users arrive in `receive_remote` (e2ee/inbound_edus.py checks the
sender's server first).

The bound: a device holds at most MAX_PENDING_PER_DEVICE undelivered messages. Past it, new
messages to that device are dropped (counted in `dropped`, logged), and the request still
succeeds for every other recipient. Dropping the newest, not the oldest, keeps the first
Olm pre-key message of a session, without which nothing later decrypts; a client that
misses a room key asks again (m.room_key_request) once the device syncs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from typing import TYPE_CHECKING, Callable, Iterable

from homeserver.core.clock import now_ms
from homeserver.core.errors import invalid_param
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.metrics import Metrics
from homeserver.storage.e2ee import E2eeStore

if TYPE_CHECKING:
    from homeserver.federation.sender import FederationSender

log = logging.getLogger(__name__)

# A device offline for weeks in many encrypted rooms gathers a few thousand room keys.
MAX_PENDING_PER_DEVICE = 10_000
MAX_TXN_ID = 255
# Recipients of one m.direct_to_device EDU: a room key shared with a large room's devices
# on one server. Past it the EDU is dropped whole.
MAX_REMOTE_MESSAGES = 10_000


class ToDeviceService:
    def __init__(
        self,
        store: E2eeStore,
        server_name: str,
        notify_users: Callable[[Iterable[str]], None],
        outbound: FederationSender,
        max_pending: int = MAX_PENDING_PER_DEVICE,
        on_local: Callable[[str, str, list], None] = lambda sender, event_type, local: None,
    ):
        self.store = store
        self.server_name = server_name
        self.notify_users = notify_users
        self.outbound = outbound
        self.max_pending = max_pending
        # (sender, type, [(user, device, content)]) of each stored batch: appservices' users'
        # messages go to their appservice too (MSC3202).
        self._on_local = on_local
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
        remote: dict[str, dict] = {}
        for user_id, by_device in messages.items():
            if not is_valid_user_id(user_id) or not isinstance(by_device, dict):
                raise invalid_param("messages must map user IDs to devices")
            if not all(isinstance(c, dict) for c in by_device.values()):
                raise invalid_param("Each message content must be an object")
            if server_of(user_id) != self.server_name:
                remote.setdefault(server_of(user_id), {})[user_id] = by_device
                continue
            local += self._expand(user_id, by_device)
        sender = (requester.user_id, requester.device_id)
        # The message ID is the transaction's: a server that gets it twice (our retry after
        # a lost answer) stores it once.
        digest = hashlib.sha256(json.dumps([*sender, txn_id]).encode()).digest()
        message_id = base64.urlsafe_b64encode(digest[:18]).decode()
        edus = [
            (
                server,
                "m.direct_to_device",
                {
                    "sender": requester.user_id,
                    "type": event_type,
                    "message_id": message_id,
                    "messages": by_user,
                },
            )
            for server, by_user in sorted(remote.items())
        ]
        self._store(sender, txn_id, event_type, local, edus)

    def _store(
        self,
        sender: tuple[str, str],
        txn_id: str,
        event_type: str,
        local: list,
        edus: list[tuple[str, str, dict]] | None = None,
    ) -> bool:
        """Stores the messages, and queues the EDUs for other servers, once per transaction
        ID: False if it was seen before."""
        stored, full, left_out = self.store.send_to_device(
            sender,
            txn_id,
            event_type,
            local,
            self.max_pending,
            now_ms(),
            edus or (),
            self.outbound.max_queued_edus,
        )
        if full:
            self.dropped += len(full)
            log.warning("to-device messages dropped, devices full: %s", full[:10])
        if stored:
            self.notify_users({user_id for user_id, _, _ in local})
            if local:
                self._on_local(sender[0], event_type, local)
            if edus:
                self.outbound.durable_edus_queued(edus, left_out)
        return stored

    def receive_remote(self, sender: str, content: dict) -> bool:
        """An m.direct_to_device EDU from `sender`'s server (checked by the caller): stored
        once per message ID, for our users' devices only. False if malformed."""
        event_type, message_id = content.get("type"), content.get("message_id")
        messages = content.get("messages")
        if not (isinstance(event_type, str) and 0 < len(event_type) <= MAX_TXN_ID):
            return False
        if not (isinstance(message_id, str) and 0 < len(message_id) <= MAX_TXN_ID):
            return False
        if not isinstance(messages, dict):
            return False
        local: list[tuple[str, str, dict]] = []
        for user_id, by_device in messages.items():
            if not isinstance(user_id, str) or not is_valid_user_id(user_id):
                return False
            if not isinstance(by_device, dict) or server_of(user_id) != self.server_name:
                continue
            local += self._expand(
                user_id, {d: c for d, c in by_device.items() if isinstance(c, dict)}
            )
            if len(local) > MAX_REMOTE_MESSAGES:
                return False
        # A remote sender has no device here: "" keys its message IDs apart from ours.
        self._store((sender, ""), message_id, event_type, local)
        return True

    def _expand(self, user_id: str, by_device: dict) -> list[tuple[str, str, dict]]:
        """`*` is every device of the user; a device that does not exist gets nothing."""
        devices = {row[0] for row in self.store.devices(user_id)}
        out = []
        for device_id, content in by_device.items():
            targets = devices if device_id == "*" else {device_id} & devices
            out += [(user_id, d, content) for d in sorted(targets)]
        return out
