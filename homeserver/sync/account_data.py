"""Account data (client-server spec, "Client Config"): per-user JSON by type, global or per
room, private to its owner and delivered through /sync."""

from __future__ import annotations

from homeserver.core.errors import (
    Codes,
    MatrixError,
    forbidden,
    invalid_param,
    not_found,
)
from homeserver.core.identifiers import is_valid_room_id
from homeserver.storage.sync import SyncStore

# Types the server writes itself: clients set them through their own APIs (receipts and
# read markers, push rules), never through the account data endpoints.
SERVER_CONTROLLED_GLOBAL = frozenset({"m.push_rules"})
SERVER_CONTROLLED_ROOM = frozenset({"m.fully_read"})


class AccountDataService:
    def __init__(self, store: SyncStore, notifier):
        self.store = store
        self.notifier = notifier

    @staticmethod
    def _check(requester, user_id: str, room_id: str) -> None:
        if requester.user_id != user_id:
            raise forbidden("You can only use your own account data")
        if room_id and not is_valid_room_id(room_id):
            raise invalid_param(f"Not a valid room ID: {room_id}")

    def get(self, requester, user_id: str, room_id: str, data_type: str) -> dict:
        """`room_id` "" for global account data."""
        self._check(requester, user_id, room_id)
        content = self.store.get_account_data(user_id, room_id, data_type)
        if content is None:
            raise not_found("No account data of this type")
        return content

    def put(self, requester, user_id: str, room_id: str, data_type: str, content: dict) -> None:
        self._check(requester, user_id, room_id)
        reserved = SERVER_CONTROLLED_ROOM if room_id else SERVER_CONTROLLED_GLOBAL
        if data_type in reserved:
            raise MatrixError(
                405, Codes.BAD_JSON, f"{data_type} is set by the server, not through account data"
            )
        self.set(user_id, room_id, data_type, content)

    def set(self, user_id: str, room_id: str, data_type: str, content: dict) -> None:
        """Stores account data for the user, server-controlled types included."""
        self.store.put_account_data(user_id, room_id, data_type, content)
        self.notifier.notify_users([user_id])
