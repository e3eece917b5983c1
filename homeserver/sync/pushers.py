"""Users' pushers (client-server spec, "Push Notifications": `GET /pushers`,
`POST /pushers/set`): the rules a pusher must meet, its storage (storage/pushers.py), and
the push sender told of each change (push_sender.py).

Only `http` pushers are served: `email` needs a mail server this server does not have, so
it is refused as an invalid parameter, as is any other kind."""

from __future__ import annotations

from urllib.parse import urlsplit

from homeserver.core.clock import now_ms
from homeserver.core.errors import invalid_param, missing_param
from homeserver.storage.pushers import Pusher, PusherStore
from homeserver.sync.push_gateway import NOTIFY_PATH
from homeserver.sync.push_sender import PushSender

MAX_APP_ID = 64  # characters, as the spec says
MAX_PUSHKEY_BYTES = 512
# Fields a pusher must have unless it is being deleted.
REQUIRED = ("app_display_name", "device_display_name", "lang", "data")


class PusherService:
    def __init__(self, store: PusherStore, sender: PushSender):
        self.store = store
        self.sender = sender

    def list(self, user_id: str) -> list[dict]:
        return [_client_view(p) for p in self.store.pushers_of(user_id)]

    def set(self, user_id: str, body: dict) -> None:
        """Adds, updates or (kind null) deletes the user's pusher of `app_id` and
        `pushkey`. `body` was checked for types by the API's schema."""
        app_id, pushkey = body["app_id"], body["pushkey"]
        if len(app_id) > MAX_APP_ID:
            raise invalid_param(f"app_id is longer than {MAX_APP_ID} characters")
        if len(pushkey.encode()) > MAX_PUSHKEY_BYTES:
            raise invalid_param(f"pushkey is longer than {MAX_PUSHKEY_BYTES} bytes")
        kind = body["kind"]
        if kind is None:
            key = (user_id, app_id, pushkey)
            if self.store.delete(key):
                self.sender.pushers_removed([key])
            return
        missing = [f for f in REQUIRED if body.get(f) is None]
        if missing:
            raise missing_param(f"Missing parameters: {', '.join(missing)}")
        if kind == "email":
            raise invalid_param("email pushers are not supported: this server sends no email")
        if kind != "http":
            raise invalid_param(f"Unknown pusher kind: {kind[:50]}")
        _check_url(body["data"].get("url"))
        pusher = Pusher(
            user_id,
            app_id,
            pushkey,
            kind,
            body["app_display_name"],
            body["device_display_name"],
            body.get("profile_tag"),
            body["lang"],
            body["data"],
            pushkey_ts=now_ms(),
        )
        stored, removed = self.store.set_pusher(pusher, append=body.get("append", False))
        self.sender.pusher_set(stored, removed)

    def remove_all(self, user_id: str) -> None:
        """A deactivated user's pushers go: no notification follows a deactivation."""
        self.sender.pushers_removed(self.store.delete_user(user_id))


def _check_url(url) -> None:
    """An http(s) URL whose path is the notify endpoint (as Synapse checks)."""
    if url is None:
        raise missing_param("data must contain a url for an http pusher")
    if not isinstance(url, str):
        raise invalid_param("data.url must be a string")
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        valid = False
    if not valid:
        raise invalid_param("data.url must be an http(s) URL")
    if parts.path != NOTIFY_PATH:
        raise invalid_param(f"data.url must have a path of {NOTIFY_PATH}")


def _client_view(pusher: Pusher) -> dict:
    view = {
        "pushkey": pusher.pushkey,
        "kind": pusher.kind,
        "app_id": pusher.app_id,
        "app_display_name": pusher.app_display_name,
        "device_display_name": pusher.device_display_name,
        "lang": pusher.lang,
        "data": pusher.data,
    }
    if pusher.profile_tag is not None:
        view["profile_tag"] = pusher.profile_tag
    return view
