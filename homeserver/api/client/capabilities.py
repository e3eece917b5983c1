"""Capabilities: what clients read right after their first sync."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import requires_auth
from homeserver.http.responses import json_response
from homeserver.rooms.versions import DEFAULT_ROOM_VERSION, KNOWN_ROOM_VERSIONS

bp = Blueprint("capabilities", __name__, url_prefix="/_matrix/client/v3")


@bp.get("/capabilities")
@requires_auth
def capabilities():
    return json_response(
        {
            "capabilities": {
                "m.room_versions": {
                    "default": DEFAULT_ROOM_VERSION.identifier,
                    "available": {
                        v: "stable" if version.stable else "unstable"
                        for v, version in KNOWN_ROOM_VERSIONS.items()
                    },
                },
                # No third-party identifiers (api/client/threepids.py) or login tokens.
                "m.change_password": {"enabled": True},
                "m.3pid_changes": {"enabled": False},
                "m.get_login_token": {"enabled": False},
                "m.profile_fields": {"enabled": True},
                "m.set_displayname": {"enabled": True},
                "m.set_avatar_url": {"enabled": True},
            }
        }
    )
