"""Our room directory and aliases, for other servers (X-Matrix authenticated).

Only our own rooms and aliases: we never look anything up on another server's behalf.
"""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.client.directory import PublicRoomsBody, room_filter_of
from homeserver.api.context import runtime
from homeserver.api.federation_auth import requires_server_auth
from homeserver.core.errors import missing_param, not_found
from homeserver.directory.service import RoomFilter
from homeserver.http.parsing import query_bool, query_int, validated_json
from homeserver.http.responses import json_response

bp = Blueprint("federation_directory", __name__, url_prefix="/_matrix/federation/v1")


@bp.get("/publicRooms")
@requires_server_auth
def public_rooms_get():
    return json_response(
        runtime().directory.public_rooms(
            query_int("limit", None, minimum=0),
            request.args.get("since"),
            RoomFilter(),
            query_bool("include_all_networks", False),
            request.args.get("third_party_instance_id"),
        )
    )


@bp.post("/publicRooms")
@requires_server_auth
def public_rooms_post():
    body = validated_json(PublicRoomsBody())
    return json_response(
        runtime().directory.public_rooms(
            body.get("limit"),
            body.get("since"),
            room_filter_of(body),
            body["include_all_networks"],
            body.get("third_party_instance_id"),
        )
    )


@bp.get("/query/directory")
@requires_server_auth
def query_directory():
    alias = request.args.get("room_alias")
    if not alias:
        raise missing_param("Missing parameter: room_alias")
    directory = runtime().directory
    if not directory.is_local_alias(alias):
        raise not_found("Room alias is not on this server")
    room_id, servers = directory.resolve_local_alias(alias)
    return json_response({"room_id": room_id, "servers": servers})
