"""Account data (client-server spec, "Client Config"): per-user JSON by type, global or per
room, private to its owner and delivered through /sync."""

from __future__ import annotations

from homeserver.core.concurrency import KeyedLocks
from homeserver.core.errors import (
    Codes,
    MatrixError,
    forbidden,
    invalid_param,
    not_found,
)
from homeserver.core.identifiers import is_valid_room_id
from homeserver.storage.sync import TAG_TYPE, SyncStore

# Types the server writes itself: clients set them through their own APIs (receipts and
# read markers, push rules), never through the account data endpoints.
SERVER_CONTROLLED_GLOBAL = frozenset({"m.push_rules"})
# Not m.tag, the room's tags: clients set them a tag at a time through /tags (client-server
# spec, "Room Tagging"), but may write them whole, as Synapse lets them.
SERVER_CONTROLLED_ROOM = frozenset({"m.fully_read"})

# The spec's limit on a tag's name (its UTF-8 bytes), as Synapse applies it.
MAX_TAG_BYTES = 255


class AccountDataService:
    def __init__(self, store: SyncStore, notifier):
        self.store = store
        self.notifier = notifier
        self._tag_locks = KeyedLocks()

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

    # --- room tags: the room's m.tag account data, a tag at a time ------------------------

    def tags(self, requester, user_id: str, room_id: str) -> dict:
        """{"tags": {tag: {"order"?: number}}}, empty when the room has none."""
        self._check(requester, user_id, room_id)
        content = self.store.get_account_data(user_id, room_id, TAG_TYPE) or {}
        tags = content.get("tags")
        return {"tags": tags if isinstance(tags, dict) else {}}

    def put_tag(self, requester, user_id: str, room_id: str, tag: str, content: dict) -> None:
        """Only in a room the user has a membership in (403 otherwise, as Synapse answers):
        tags of random rooms would be data kept for nothing."""
        self._check(requester, user_id, room_id)
        if len(tag.encode("utf-8")) > MAX_TAG_BYTES:
            raise invalid_param(f"A tag is at most {MAX_TAG_BYTES} bytes")
        order = content.get("order")
        if "order" in content and (isinstance(order, bool) or not isinstance(order, (int, float))):
            raise MatrixError(400, Codes.BAD_JSON, "order must be a number")
        if self.store.membership_of(user_id, room_id) is None:
            raise forbidden(f"{user_id} has no membership in {room_id}")
        self._set_tag(user_id, room_id, tag, content)

    def delete_tag(self, requester, user_id: str, room_id: str, tag: str) -> None:
        """Removing a tag the room does not have is no error (and no change)."""
        self._check(requester, user_id, room_id)
        self._set_tag(user_id, room_id, tag, None)

    def _set_tag(self, user_id: str, room_id: str, tag: str, content: dict | None) -> None:
        # The client API runs in one process: this lock is what keeps two tags set at once
        # on PostgreSQL from each writing m.tag without the other (storage/sync.py).
        with self._tag_locks.hold(user_id):
            changed = self.store.update_room_tag(user_id, room_id, tag, content)
        if changed:
            self.notifier.notify_users([user_id])
