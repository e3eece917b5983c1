"""Pushers (client-server spec, "Push Notifications: Pushers"): `GET /pushers` and
`POST /pushers/set`; the rules are sync/pushers.py's, the delivery sync/push_sender.py's."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import validated_json
from homeserver.http.responses import json_response

bp = Blueprint("pushers", __name__, url_prefix="/_matrix/client/v3")

MAX_PUSHER_BYTES = 64 * 1024


class _PusherBody(Schema):
    pushkey = fields.String(required=True)
    app_id = fields.String(required=True)
    kind = fields.String(required=True, allow_none=True)
    # Required unless kind is null (sync/pushers.py): a deletion may send them as null.
    app_display_name = fields.String(allow_none=True)
    device_display_name = fields.String(allow_none=True)
    profile_tag = fields.String(allow_none=True)
    lang = fields.String(allow_none=True)
    data = fields.Dict(allow_none=True)
    append = fields.Boolean(load_default=False)


@bp.get("/pushers")
@requires_auth
def pushers():
    return json_response({"pushers": runtime().pushers.list(current_requester().user_id)})


@bp.post("/pushers/set")
@requires_auth
def set_pusher():
    body = validated_json(_PusherBody(), MAX_PUSHER_BYTES)
    runtime().pushers.set(current_requester().user_id, body)
    return json_response({})
