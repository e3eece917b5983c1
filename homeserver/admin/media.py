"""Media for server admins: quarantine (a file, a room's or a user's), after which a file
answers 404 to everyone (media/service.py, `original`), ours or another server's; and the
lists of a user's uploads and of the media a room's events use."""

from __future__ import annotations

import json

from homeserver.accounts.service import AccountService
from homeserver.core.clock import now_ms
from homeserver.core.errors import invalid_param, not_found
from homeserver.core.identifiers import is_valid_server_name, is_valid_user_id, server_of
from homeserver.core.requester import Requester
from homeserver.media.files import is_valid_media_id
from homeserver.rooms.service import RoomService
from homeserver.storage.admin import MEDIA_ORDERINGS, AdminMediaStore

MAX_PAGE = 1000
EVENTS_PER_READ = 500


def _mxc_parts(uri: object) -> tuple[str, str] | None:
    if not isinstance(uri, str) or not uri.startswith("mxc://"):
        return None
    origin, _, media_id = uri[len("mxc://") :].partition("/")
    if is_valid_server_name(origin) and is_valid_media_id(media_id):
        return origin, media_id
    return None


def _content_uris(content: dict) -> list[str]:
    """The mxc:// URIs an event's content points at: its file (or a room's avatar) and the
    file's thumbnail."""
    info = content.get("info")
    thumbnail = info.get("thumbnail_url") if isinstance(info, dict) else None
    found = [content.get("url"), thumbnail]
    return [u for u in found if isinstance(u, str) and _mxc_parts(u) is not None]


class AdminMedia:
    def __init__(self, store: AdminMediaStore, rooms: RoomService, accounts: AccountService):
        self.store = store
        self.rooms = rooms
        self.accounts = accounts
        self.server_name = store.server_name

    def _local_user(self, user_id: str) -> None:
        if not is_valid_user_id(user_id) or server_of(user_id) != self.server_name:
            raise invalid_param("Only local users' media can be listed")
        if not self.accounts.user_exists(user_id):
            raise not_found("User not found")

    def quarantine(self, admin: Requester, origin: str, media_id: str) -> None:
        if not is_valid_server_name(origin) or not is_valid_media_id(media_id):
            raise invalid_param("Not a valid server name and media ID")
        self.store.quarantine([(origin, media_id)], admin.user_id, now_ms())

    def unquarantine(self, origin: str, media_id: str) -> None:
        self.store.unquarantine(origin, media_id)

    def room_media(self, room_id: str) -> dict:
        """Every mxc:// URI the room's events use, ours and other servers'."""
        if not self.rooms.room_exists(room_id):
            raise not_found("Room not found")
        local: dict[str, None] = {}
        remote: dict[str, None] = {}
        after = 0
        while True:
            page = self.store.room_event_pdus(room_id, after, EVENTS_PER_READ)
            for _, text in page:
                content = json.loads(text).get("content")
                for uri in _content_uris(content if isinstance(content, dict) else {}):
                    origin = uri[len("mxc://") :].partition("/")[0]
                    (local if origin == self.server_name else remote)[uri] = None
            if len(page) < EVENTS_PER_READ:
                return {"local": list(local), "remote": list(remote)}
            after = page[-1][0]

    def quarantine_room_media(self, admin: Requester, room_id: str) -> int:
        found = self.room_media(room_id)
        files = [_mxc_parts(u) for u in found["local"] + found["remote"]]
        return self.store.quarantine([f for f in files if f], admin.user_id, now_ms())

    def quarantine_user_media(self, admin: Requester, user_id: str) -> int:
        self._local_user(user_id)
        files = [(self.server_name, m) for m in self.store.user_media_ids(user_id)]
        return self.store.quarantine(files, admin.user_id, now_ms())

    def user_media(
        self, user_id: str, offset: int, limit: int, order_by: str, backwards: bool
    ) -> dict:
        self._local_user(user_id)
        if offset < 0 or not 0 < limit <= MAX_PAGE:
            raise invalid_param(f"from must be 0 or more, limit 1 to {MAX_PAGE}")
        if order_by not in MEDIA_ORDERINGS:
            raise invalid_param(f"order_by must be one of {', '.join(sorted(MEDIA_ORDERINGS))}")
        rows, total = self.store.user_media(user_id, offset, limit, order_by, backwards)
        media = [
            {
                "media_id": media_id,
                "media_type": content_type,
                "media_length": length,
                "upload_name": upload_name,
                "created_ts": created_ts,
                "last_access_ts": None,  # not tracked
                "quarantined_by": quarantined_by,
                "safe_from_quarantine": False,
            }
            for media_id, content_type, length, upload_name, created_ts, quarantined_by in rows
        ]
        page: dict = {"media": media, "total": total}
        if offset + len(rows) < total:
            page["next_token"] = offset + len(rows)
        return page
