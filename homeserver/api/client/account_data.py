"""Account data, global and per room (client-server spec, "Client Config"), and room tags
(spec: "Room Tagging"), kept as the room's m.tag account data."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("account_data", __name__, url_prefix="/_matrix/client/v3")

# Account data is small client configuration; this bounds what one type may hold.
MAX_ACCOUNT_DATA_BYTES = 64 * 1024


@bp.get("/user/<user_id>/account_data/<data_type>")
@requires_auth
def get_global(user_id: str, data_type: str):
    return json_response(runtime().account_data.get(current_requester(), user_id, "", data_type))


@bp.put("/user/<user_id>/account_data/<data_type>")
@requires_auth
def put_global(user_id: str, data_type: str):
    content = json_object(max_bytes=MAX_ACCOUNT_DATA_BYTES, allow_empty=False)
    runtime().account_data.put(current_requester(), user_id, "", data_type, content)
    return json_response({})


@bp.get("/user/<user_id>/rooms/<room_id>/account_data/<data_type>")
@requires_auth
def get_room(user_id: str, room_id: str, data_type: str):
    return json_response(
        runtime().account_data.get(current_requester(), user_id, room_id, data_type)
    )


@bp.put("/user/<user_id>/rooms/<room_id>/account_data/<data_type>")
@requires_auth
def put_room(user_id: str, room_id: str, data_type: str):
    content = json_object(max_bytes=MAX_ACCOUNT_DATA_BYTES, allow_empty=False)
    runtime().account_data.put(current_requester(), user_id, room_id, data_type, content)
    return json_response({})


# A tag's content is {"order": number} and perhaps a few more keys; nothing needs more.
MAX_TAG_BODY_BYTES = 4 * 1024


@bp.get("/user/<user_id>/rooms/<room_id>/tags")
@requires_auth
def get_tags(user_id: str, room_id: str):
    return json_response(runtime().account_data.tags(current_requester(), user_id, room_id))


@bp.put("/user/<user_id>/rooms/<room_id>/tags/<path:tag>")
@requires_auth
def put_tag(user_id: str, room_id: str, tag: str):
    content = json_object(max_bytes=MAX_TAG_BODY_BYTES, allow_empty=True)
    runtime().account_data.put_tag(current_requester(), user_id, room_id, tag, content)
    return json_response({})


@bp.delete("/user/<user_id>/rooms/<room_id>/tags/<path:tag>")
@requires_auth
def delete_tag(user_id: str, room_id: str, tag: str):
    runtime().account_data.delete_tag(current_requester(), user_id, room_id, tag)
    return json_response({})
