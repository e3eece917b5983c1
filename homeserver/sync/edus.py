"""Typing notifications and read receipts of other servers' users: the m.typing and m.receipt
EDUs of a /send transaction, which homeserver/rooms/transactions.py hands to main's
:class:`InboundEdus` after the transaction's PDUs.

Server-server spec, "Typing Notifications" and "Receipts": a server should check that the
user is in the room and belongs to the sending server. Each item (a typing change, one
user's receipt in one room) is checked on its own and dropped alone when it fails; the
transaction is answered 200 all the same, since EDUs get no answer:
- well formed: IDs by their grammar, booleans and numbers where the spec has them;
- the user's server is the transaction's origin (the one X-Matrix authenticated);
- the user is joined to the room in our current state (so an unknown room drops it too);
- the room's server ACL allows the origin (rooms/server_acl.py);
- a receipt is a public ``m.read`` (``m.read.private`` never crosses servers) for an event of
  the room we hold: receipts are ordered by the event's place in our stream, so one for an
  event we do not have yet is dropped, and the user's next receipt puts it right.

Bounds: a transaction carries at most 100 EDUs (the blueprint refuses more), and
``MAX_ITEMS_PER_TRANSACTION`` rooms and receipts are looked at in all, the rest dropped, so a
transaction costs a known number of reads and one write. A receipt names at most
``MAX_RECEIPT_EVENT_IDS`` events. Remote typing lasts ``REMOTE_TYPING_TIMEOUT_MS`` and a room
shows at most ``MAX_REMOTE_TYPING_PER_ROOM`` remote typers (homeserver/sync/typing.py).
Applied items wake the room's syncs through the typing and receipt services.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from homeserver.core.clock import now_ms
from homeserver.core.identifiers import is_valid_room_id, is_valid_user_id, server_of
from homeserver.storage.sync import Receipt
from homeserver.sync.receipts import ReceiptService
from homeserver.sync.typing import TypingNotifications

log = logging.getLogger(__name__)

# Rooms and receipts looked at per transaction; well above what one server's users read in
# the time between two of its transactions.
MAX_ITEMS_PER_TRANSACTION = 1000
# The spec's event_ids are "the extremity event IDs the user has read up to": one in practice.
MAX_RECEIPT_EVENT_IDS = 10
MAX_ID_BYTES = 255
# Past this a timestamp is not one (JSON's safe integers).
MAX_TS = 2**53 - 1

# outcome(edu_type, "accepted" | "dropped"): counted per item.
Outcome = Callable[[str, str], None]


def _is_event_id(value) -> bool:
    return isinstance(value, str) and value.startswith("$") and len(value.encode()) <= MAX_ID_BYTES


class _Transaction:
    """One transaction's EDUs: what they may still cost, the joined members read so far (one
    read per room), and what was dropped, for one log line."""

    def __init__(
        self,
        origin: str,
        joined_users: Callable[[str], Iterable[str]],
        acl_allows: Callable[[str, str], bool],
    ):
        self.origin = origin
        self._joined_users = joined_users
        self._acl_allows = acl_allows
        self._joined: dict[str, frozenset[str]] = {}
        self.left = MAX_ITEMS_PER_TRANSACTION
        self.dropped: dict[str, int] = {}

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def refusal(self, room_id, user_id) -> str | None:
        """Why `user_id` may not speak in `room_id` through this origin, or None."""
        if not (isinstance(room_id, str) and is_valid_room_id(room_id)):
            return "malformed room ID"
        if not (isinstance(user_id, str) and is_valid_user_id(user_id)):
            return "malformed user ID"
        if server_of(user_id) != self.origin:
            return "user of another server"
        members = self._joined.get(room_id)
        if members is None:
            allowed = self._acl_allows(room_id, self.origin)
            members = frozenset(self._joined_users(room_id)) if allowed else frozenset()
            self._joined[room_id] = members
            if not allowed:
                return "server denied by the room's ACL"
        return None if user_id in members else "user not joined"


class InboundEdus:
    def __init__(
        self,
        joined_users: Callable[[str], Iterable[str]],
        typing: TypingNotifications,
        receipts: ReceiptService,
        acl_allows: Callable[[str, str], bool],
        outcome: Outcome | None = None,
    ):
        """`joined_users(room_id)`: the room's joined members in our current state;
        `acl_allows(room_id, server)`: its server ACL."""
        self._joined_users = joined_users
        self._acl_allows = acl_allows
        self.typing = typing
        self.receipts = receipts
        self._outcome = outcome or (lambda edu_type, outcome: None)

    def receive(self, origin: str, edus: list[dict]) -> None:
        """Applies what passes of a transaction's m.typing and m.receipt EDUs."""
        txn = _Transaction(origin, self._joined_users, self._acl_allows)
        receipts: list[Receipt] = []
        for edu in edus:
            content = edu.get("content")
            if edu.get("edu_type") == "m.typing":
                self._typing(txn, content)
            elif edu.get("edu_type") != "m.receipt":
                continue  # end-to-end encryption's: homeserver/e2ee/inbound_edus.py
            elif isinstance(content, dict):
                receipts += self._receipts(txn, content)
            else:
                self._dropped(txn, "m.receipt", "malformed content")
        if receipts:
            self.receipts.receive_remote(receipts)
            for _ in receipts:
                self._outcome("m.receipt", "accepted")
        if txn.dropped:
            log.info("EDU items from %s dropped: %s", origin, txn.dropped)

    def _dropped(self, txn: _Transaction, edu_type: str, reason: str) -> None:
        txn.drop(reason)
        self._outcome(edu_type, "dropped")

    def _typing(self, txn: _Transaction, content) -> None:
        if not txn.take():
            return self._dropped(txn, "m.typing", "over the transaction's bound")
        if not isinstance(content, dict) or not isinstance(content.get("typing"), bool):
            return self._dropped(txn, "m.typing", "malformed content")
        reason = txn.refusal(content.get("room_id"), content.get("user_id"))
        if reason is not None:
            return self._dropped(txn, "m.typing", reason)
        room_id, user_id = str(content["room_id"]), str(content["user_id"])
        if not self.typing.set_remote_typing(room_id, user_id, content["typing"]):
            return self._dropped(txn, "m.typing", "room's typing list full")
        self._outcome("m.typing", "accepted")

    def _receipts(self, txn: _Transaction, content: dict) -> list[Receipt]:
        """`{room_id: {receipt_type: {user_id: {"event_ids": [...], "data": {...}}}}}`."""
        found: list[Receipt] = []
        for room_id, by_type in content.items():
            if not txn.take():
                self._dropped(txn, "m.receipt", "over the transaction's bound")
                break
            if not isinstance(by_type, dict):
                self._dropped(txn, "m.receipt", "malformed content")
                continue
            for receipt_type, by_user in by_type.items():
                if receipt_type != "m.read" or not isinstance(by_user, dict):
                    # Private receipts never cross servers; other types mean nothing to us.
                    self._dropped(txn, "m.receipt", "not a public m.read receipt")
                    continue
                found += self._room_receipts(txn, room_id, by_user)
        return found

    def _room_receipts(self, txn: _Transaction, room_id: str, by_user: dict) -> list[Receipt]:
        found: list[Receipt] = []
        for user_id, receipt in by_user.items():
            if not txn.take():
                self._dropped(txn, "m.receipt", "over the transaction's bound")
                break
            reason = txn.refusal(room_id, user_id)
            parsed = _parse_receipt(room_id, user_id, receipt) if reason is None else reason
            if isinstance(parsed, str):
                self._dropped(txn, "m.receipt", parsed)
            else:
                found += parsed
        return found


def _parse_receipt(room_id: str, user_id: str, receipt) -> list[Receipt] | str:
    """One user's receipt: a Receipt per event it names, or why it is dropped."""
    if not isinstance(receipt, dict):
        return "malformed receipt"
    event_ids, data = receipt.get("event_ids"), receipt.get("data", {})
    if not (
        isinstance(event_ids, list)
        and 0 < len(event_ids) <= MAX_RECEIPT_EVENT_IDS
        and all(_is_event_id(e) for e in event_ids)
        and isinstance(data, dict)
    ):
        return "malformed receipt"
    # As Synapse does, a thread_id that is not a string counts as none; a string must be
    # one we can store.
    thread_id = data.get("thread_id")
    thread_id = thread_id if isinstance(thread_id, str) else ""
    if len(thread_id.encode()) > MAX_ID_BYTES:
        return "malformed thread ID"
    ts = data.get("ts")
    if not (isinstance(ts, int) and not isinstance(ts, bool) and 0 <= ts <= MAX_TS):
        ts = now_ms()
    return [Receipt(room_id, "m.read", user_id, thread_id, e, ts) for e in event_ids]
