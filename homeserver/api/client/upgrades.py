"""Room upgrades over the client-server API: `POST /rooms/{roomId}/upgrade`
(rooms/upgrades.py)."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import validated_json
from homeserver.http.responses import json_response

bp = Blueprint("upgrades", __name__, url_prefix="/_matrix/client/v3")

# A version and a list of user IDs: a few hundred creators at most.
MAX_UPGRADE_BYTES = 64 * 1024


class UpgradeBody(Schema):
    new_version = fields.String(required=True)
    additional_creators = fields.List(fields.String(), load_default=list)


@bp.post("/rooms/<room_id>/upgrade")
@requires_auth
def upgrade(room_id: str):
    body = validated_json(UpgradeBody(), max_bytes=MAX_UPGRADE_BYTES)
    replacement = runtime().room_upgrader.upgrade(
        current_requester(), room_id, body["new_version"], tuple(body["additional_creators"])
    )
    return json_response({"replacement_room": replacement})
