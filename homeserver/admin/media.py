"""Media for server admins: quarantine, after which the file answers 404 to everyone
(media/service.py, `original`), ours or another server's."""

from __future__ import annotations

from homeserver.core.clock import now_ms
from homeserver.core.errors import invalid_param
from homeserver.core.identifiers import is_valid_server_name
from homeserver.core.requester import Requester
from homeserver.media.files import is_valid_media_id
from homeserver.storage.admin import AdminStore


class AdminMedia:
    def __init__(self, store: AdminStore):
        self.store = store

    def quarantine(self, admin: Requester, origin: str, media_id: str) -> None:
        if not is_valid_server_name(origin) or not is_valid_media_id(media_id):
            raise invalid_param("Not a valid server name and media ID")
        self.store.quarantine(origin, media_id, admin.user_id, now_ms())
