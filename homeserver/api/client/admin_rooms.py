"""Synapse's admin API for rooms and media, as synadm calls it (admin/rooms.py,
admin/media.py)."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.admin.rooms import Deletion
from homeserver.api.auth import current_requester, requires_admin
from homeserver.api.client.admin_users import query_int
from homeserver.api.context import runtime
from homeserver.core.errors import invalid_param
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response

bp = Blueprint("admin_rooms", __name__, url_prefix="/_synapse/admin")


@bp.get("/v1/rooms")
@requires_admin
def list_rooms():
    direction = request.args.get("dir", "f")
    if direction not in ("f", "b"):
        raise invalid_param("dir must be f or b")
    page = runtime().admin_rooms.list(
        query_int("from", 0),
        query_int("limit", 100),
        request.args.get("order_by", "name"),
        direction == "b",
        request.args.get("search_term"),
    )
    return json_response(page)


@bp.get("/v1/rooms/<room_id>")
@requires_admin
def room_details(room_id: str):
    return json_response(runtime().admin_rooms.details(room_id))


@bp.get("/v1/rooms/<room_id>/members")
@requires_admin
def room_members(room_id: str):
    return json_response(runtime().admin_rooms.members(room_id))


@bp.get("/v1/rooms/<room_id>/state")
@requires_admin
def room_state(room_id: str):
    return json_response(runtime().admin_rooms.state(room_id))


@bp.delete("/v2/rooms/<room_id>")
@requires_admin
def delete_room(room_id: str):
    body = json_object(allow_empty=True)
    block, purge = body.get("block", False), body.get("purge", True)
    if not isinstance(block, bool) or not isinstance(purge, bool):
        raise invalid_param("block and purge must be booleans")
    texts = {k: body.get(k) for k in ("new_room_user_id", "room_name", "message")}
    if any(v is not None and not isinstance(v, str) for v in texts.values()):
        raise invalid_param("new_room_user_id, room_name and message must be strings")
    how = Deletion(block=block, purge=purge, **texts)
    delete_id = runtime().admin_rooms.delete(current_requester(), room_id, how)
    return json_response({"delete_id": delete_id})


@bp.get("/v2/rooms/delete_status/<delete_id>")
@requires_admin
def delete_status(delete_id: str):
    return json_response(runtime().admin_rooms.delete_status(delete_id))


@bp.get("/v2/rooms/<room_id>/delete_status")
@requires_admin
def room_delete_statuses(room_id: str):
    return json_response(runtime().admin_rooms.delete_statuses(room_id))


@bp.post("/v1/media/quarantine/<server_name>/<media_id>")
@requires_admin
def quarantine_media(server_name: str, media_id: str):
    runtime().admin_media.quarantine(current_requester(), server_name, media_id)
    return json_response({})


@bp.post("/v1/media/unquarantine/<server_name>/<media_id>")
@requires_admin
def unquarantine_media(server_name: str, media_id: str):
    runtime().admin_media.unquarantine(server_name, media_id)
    return json_response({})


@bp.get("/v1/room/<room_id>/media")
@requires_admin
def room_media(room_id: str):
    return json_response(runtime().admin_media.room_media(room_id))


@bp.post("/v1/room/<room_id>/media/quarantine")
@requires_admin
def quarantine_room_media(room_id: str):
    count = runtime().admin_media.quarantine_room_media(current_requester(), room_id)
    return json_response({"num_quarantined": count})


@bp.post("/v1/user/<user_id>/media/quarantine")
@requires_admin
def quarantine_user_media(user_id: str):
    count = runtime().admin_media.quarantine_user_media(current_requester(), user_id)
    return json_response({"num_quarantined": count})


@bp.get("/v1/users/<user_id>/media")
@requires_admin
def user_media(user_id: str):
    direction = request.args.get("dir", "f")
    if direction not in ("f", "b"):
        raise invalid_param("dir must be f or b")
    page = runtime().admin_media.user_media(
        user_id,
        query_int("from", 0),
        query_int("limit", 100),
        request.args.get("order_by", "created_ts"),
        direction == "b",
    )
    return json_response(page)
