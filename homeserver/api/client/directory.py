"""Room aliases, directory visibility and the public room list (client-server API)."""

from __future__ import annotations

from flask import Blueprint, request
from marshmallow import EXCLUDE, Schema, fields, validate

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.directory.service import VISIBILITIES, RoomFilter
from homeserver.http.parsing import json_object, query_bool, query_int, validated_json
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response

bp = Blueprint("directory", __name__, url_prefix="/_matrix/client/v3")
# The aliases list under r0 too, as Synapse serves it: synadm still asks there.
r0 = Blueprint("directory_r0", __name__, url_prefix="/_matrix/client/r0")


class AliasBody(Schema):
    room_id = fields.String(required=True)


class VisibilityBody(Schema):
    visibility = fields.String(load_default="public", validate=validate.OneOf(VISIBILITIES))


class PublicRoomsFilter(Schema):
    class Meta:
        unknown = EXCLUDE  # nested: validate()'s EXCLUDE covers the top level only

    generic_search_term = fields.String()
    room_types = fields.List(fields.String(allow_none=True))


class PublicRoomsBody(Schema):
    limit = fields.Integer(validate=validate.Range(min=0))
    since = fields.String()
    filter = fields.Nested(PublicRoomsFilter, load_default=dict)
    include_all_networks = fields.Boolean(load_default=False)
    third_party_instance_id = fields.String()


@bp.get("/directory/room/<path:room_alias>")
def get_alias(room_alias: str):
    # No auth: the spec lets anyone resolve an alias (another server's under the budget).
    rt, caller = runtime(), outbound_caller()
    room_id, servers = rt.appservices.or_asked(
        "rooms", room_alias, lambda: rt.directory.resolve_alias(room_alias, caller)
    )
    return json_response({"room_id": room_id, "servers": servers})


@bp.put("/directory/room/<path:room_alias>")
@requires_auth
def put_alias(room_alias: str):
    body = validated_json(AliasBody())
    rt = runtime()
    rt.appservices.check_alias(current_requester(), room_alias)
    rt.directory.create_alias(current_requester(), room_alias, body["room_id"])
    return json_response({})


@bp.delete("/directory/room/<path:room_alias>")
@requires_auth
def delete_alias(room_alias: str):
    runtime().directory.delete_alias(current_requester(), room_alias)
    return json_response({})


@bp.get("/rooms/<room_id>/aliases")
@r0.get("/rooms/<room_id>/aliases")
@requires_auth
def room_aliases(room_id: str):
    return json_response(
        {"aliases": runtime().directory.room_aliases(current_requester(), room_id)}
    )


@bp.get("/directory/list/room/<room_id>")
def get_visibility(room_id: str):
    return json_response({"visibility": runtime().directory.visibility(room_id)})


@bp.put("/directory/list/room/<room_id>")
@requires_auth
def put_visibility(room_id: str):
    body = validate_body(VisibilityBody(), json_object(allow_empty=True))
    runtime().directory.set_visibility(current_requester(), room_id, body["visibility"])
    return json_response({})


@bp.get("/publicRooms")
def public_rooms_get():
    # No auth: anyone may list rooms, ours or (under the budget) another server's.
    result = runtime().directory.list_public_rooms(
        request.args.get("server"),
        query_int("limit", None, minimum=0),
        request.args.get("since"),
        RoomFilter(),
        query_bool("include_all_networks", False),
        request.args.get("third_party_instance_id"),
        outbound_caller(),
    )
    return json_response(result)


def room_filter_of(body: dict) -> RoomFilter:
    """The RoomFilter of a validated PublicRoomsBody (shared with the federation API)."""
    search = body["filter"].get("generic_search_term")
    room_types = body["filter"].get("room_types")
    return RoomFilter(
        search.strip() if search else None, tuple(room_types) if room_types is not None else None
    )


@bp.post("/publicRooms")
@requires_auth
def public_rooms_post():
    body = validated_json(PublicRoomsBody())
    result = runtime().directory.list_public_rooms(
        request.args.get("server"),
        body.get("limit"),
        body.get("since"),
        room_filter_of(body),
        body["include_all_networks"],
        body.get("third_party_instance_id"),
        outbound_caller(),
    )
    return json_response(result)
