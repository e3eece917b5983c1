"""Read receipts and read markers (client-server spec, "Receipts", "Read and unread
markers"). Receipts are stored (they outlive a restart, as clients expect of read state) and
reach the room's members through /sync; the fully-read marker is room account data."""

from __future__ import annotations

from typing import Callable

from homeserver.core.clock import now_ms
from homeserver.core.errors import forbidden, invalid_param
from homeserver.storage.sync import Receipt, SyncStore

RECEIPT_TYPES = ("m.read", "m.read.private", "m.fully_read")
FULLY_READ = "m.fully_read"


class ReceiptService:
    def __init__(
        self,
        rooms,
        history,
        store: SyncStore,
        account_data,
        notifier,
        on_read_receipt: Callable[[str, str, str, dict], None] | None = None,
    ):
        """`on_read_receipt(room_id, user_id, event_id, data)` runs after a public m.read
        receipt was stored (the federation sender's m.receipt EDU)."""
        self.rooms = rooms
        self.history = history
        self.store = store
        self.account_data = account_data
        self.notifier = notifier
        self._on_read_receipt = on_read_receipt

    def _check_readable(self, requester, room_id: str, event_id: str) -> None:
        """The sender is in the room, and the event is in it and visible to them."""
        self.history.event(requester, room_id, event_id)  # 404 unless it exists and is visible
        if self.rooms.membership(room_id, requester.user_id) != "join":
            raise forbidden("You are not in this room")

    def send(
        self,
        requester,
        room_id: str,
        receipt_type: str,
        event_id: str,
        thread_id: str | None = None,
    ) -> None:
        if receipt_type not in RECEIPT_TYPES:
            raise invalid_param("receiptType must be one of " + ", ".join(RECEIPT_TYPES))
        if thread_id is not None and (receipt_type == FULLY_READ or not thread_id):
            raise invalid_param("thread_id must be a non-empty string, and only on receipts")
        self._check_readable(requester, room_id, event_id)
        if receipt_type == FULLY_READ:
            self.account_data.set(requester.user_id, room_id, FULLY_READ, {"event_id": event_id})
            return
        position = self.store.put_receipt(
            Receipt(room_id, receipt_type, requester.user_id, thread_id or "", event_id, now_ms())
        )
        if position is None:
            return  # not newer than the receipt already there
        if receipt_type == "m.read":
            self.notifier.notify_room(room_id)
            if self._on_read_receipt is not None:
                data = {"ts": now_ms(), **({"thread_id": thread_id} if thread_id else {})}
                self._on_read_receipt(room_id, requester.user_id, event_id, data)
        else:
            self.notifier.notify_users([requester.user_id])  # private: only its owner

    def receive_remote(self, receipts: list[Receipt]) -> int:
        """Remote users' public receipts, already checked (homeserver/sync/edus.py): stored
        in one write, and the rooms where one moved woken. Never sent on: their server
        sends them to the room's other servers itself. Returns how many moved."""
        moved = self.store.put_receipts(receipts)
        for room_id in dict.fromkeys(r.room_id for r in moved):
            self.notifier.notify_room(room_id)
        return len(moved)

    def set_read_markers(
        self,
        requester,
        room_id: str,
        fully_read: str | None,
        read: str | None,
        read_private: str | None,
    ) -> None:
        """POST /read_markers: any of the three markers, each an event ID."""
        for receipt_type, event_id in (
            (FULLY_READ, fully_read),
            ("m.read", read),
            ("m.read.private", read_private),
        ):
            if event_id:
                self.send(requester, room_id, receipt_type, event_id)
