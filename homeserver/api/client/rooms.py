"""Rooms over the client-server API: createRoom, state, send, membership and history."""

from __future__ import annotations

from flask import Blueprint, request
from marshmallow import Schema, fields, validate

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.core.errors import Codes, MatrixError, invalid_param
from homeserver.core.identifiers import is_valid_user_id, server_of
from homeserver.http.parsing import json_object, query_int, validated_json
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response
from homeserver.rooms.creation import PRESETS, CreateRoomRequest
from homeserver.rooms.events import MAX_PDU_BYTES
from homeserver.rooms.pagination import EventFilter
from homeserver.rooms.service import MEMBERSHIPS
from homeserver.storage.rooms import TxnKey
from homeserver.sync.filters import decode_filter_json, parse_room_event_filter

bp = Blueprint("rooms", __name__, url_prefix="/_matrix/client/v3")


class StateEventBody(Schema):
    type = fields.String(required=True)
    state_key = fields.String(load_default="")
    content = fields.Dict(required=True)


class CreateRoomBody(Schema):
    visibility = fields.String(
        load_default="private", validate=validate.OneOf(["public", "private"])
    )
    preset = fields.String(load_default=None, validate=validate.OneOf(list(PRESETS)))
    room_alias_name = fields.String(load_default=None)
    name = fields.String(load_default=None)
    topic = fields.String(load_default=None)
    invite = fields.List(fields.String(), load_default=list)
    invite_3pid = fields.List(fields.Dict(), load_default=list)
    is_direct = fields.Boolean(load_default=False)
    room_version = fields.String(load_default=None)
    creation_content = fields.Dict(load_default=dict)
    initial_state = fields.List(fields.Nested(StateEventBody), load_default=list)
    power_level_content_override = fields.Dict(load_default=None)


class ReasonBody(Schema):
    reason = fields.String()


class TargetBody(Schema):
    user_id = fields.String(required=True)
    reason = fields.String()


def _content_body() -> dict:
    # An event is at most 64 KiB, so its content can be no larger.
    return json_object(max_bytes=MAX_PDU_BYTES, allow_empty=False)


@bp.post("/createRoom")
@requires_auth
def create_room():
    body = validated_json(CreateRoomBody())
    if body.pop("invite_3pid"):
        raise MatrixError(
            400, Codes.UNRECOGNIZED, "Third-party invites need an identity server; not supported"
        )
    body["invite"] = tuple(body["invite"])
    body["initial_state"] = tuple(body["initial_state"])
    rt = runtime()
    if body["room_alias_name"] is not None:  # an appservice's exclusive alias is its own
        alias = f"#{body['room_alias_name']}:{rt.server_name}"
        rt.appservices.check_alias(current_requester(), alias)
    room_id = rt.room_creator.create(
        current_requester().user_id, CreateRoomRequest(**body), outbound_caller()
    )
    return json_response({"room_id": room_id})


@bp.get("/rooms/<room_id>/state")
@requires_auth
def get_state(room_id: str):
    return json_response(runtime().room_history.state(current_requester(), room_id))


@bp.get("/rooms/<room_id>/state/<event_type>")
@bp.get("/rooms/<room_id>/state/<event_type>/<path:state_key>")
@requires_auth
def get_state_event(room_id: str, event_type: str, state_key: str = ""):
    event = runtime().room_history.state_event(current_requester(), room_id, event_type, state_key)
    fmt = request.args.get("format", "content")
    if fmt not in ("content", "event"):
        raise invalid_param("format must be content or event")
    return json_response(event if fmt == "event" else event["content"])


@bp.put("/rooms/<room_id>/state/<event_type>")
@bp.put("/rooms/<room_id>/state/<event_type>/<path:state_key>")
@requires_auth
def put_state_event(room_id: str, event_type: str, state_key: str = ""):
    content = _content_body()
    event_id = runtime().rooms.set_state(
        current_requester(), room_id, event_type, state_key, content
    )
    return json_response({"event_id": event_id})


@bp.put("/rooms/<room_id>/send/<event_type>/<txn_id>")
@requires_auth
def send_event(room_id: str, event_type: str, txn_id: str):
    content = _content_body()
    event_id = runtime().rooms.send_message(
        current_requester(), room_id, event_type, content, txn_id
    )
    return json_response({"event_id": event_id})


@bp.put("/rooms/<room_id>/redact/<event_id>/<txn_id>")
@requires_auth
def redact_event(room_id: str, event_id: str, txn_id: str):
    requester = current_requester()
    # Scoped by the request path, as transaction IDs are: /redact of another event, or a
    # /send of the same ID, is another transaction.
    txn = TxnKey(requester.user_id, requester.device_id, room_id, f"/redact/{event_id}", txn_id)
    content = json_object(max_bytes=MAX_PDU_BYTES, allow_empty=True)
    event_id = runtime().rooms.redact(requester, room_id, event_id, content, txn)
    return json_response({"event_id": event_id})


@bp.get("/rooms/<room_id>/event/<event_id>")
@requires_auth
def get_event(room_id: str, event_id: str):
    return json_response(runtime().room_history.event(current_requester(), room_id, event_id))


def _reason(schema=ReasonBody) -> dict:
    return validate_body(schema(), json_object(allow_empty=True))


def _membership_content(body: dict) -> dict:
    return {"reason": body["reason"]} if "reason" in body else {}


def _via() -> list[str]:
    # `server_name` is the older spelling of `via`; clients send either.
    return request.args.getlist("via") + request.args.getlist("server_name")


def _room_id_or_alias(value: str) -> tuple[str | None, str | None]:
    if value.startswith("#"):
        return None, value
    if value.startswith("!"):
        return value, None
    raise invalid_param("Expected a room ID (!...) or a room alias (#...)")


@bp.post("/join/<path:room_id_or_alias>")
@requires_auth
def join_room_or_alias(room_id_or_alias: str):
    room_id, alias = _room_id_or_alias(room_id_or_alias)
    content = _membership_content(_reason())
    joined = runtime().remote_membership.join(
        current_requester().user_id, room_id, _via(), outbound_caller(), content, alias=alias
    )
    return json_response({"room_id": joined})


@bp.post("/rooms/<room_id>/join")
@requires_auth
def join_room(room_id: str):
    content = _membership_content(_reason())
    joined = runtime().remote_membership.join(
        current_requester().user_id, room_id, [], outbound_caller(), content
    )
    return json_response({"room_id": joined})


@bp.post("/rooms/<room_id>/leave")
@requires_auth
def leave_room(room_id: str):
    content = _membership_content(_reason())
    runtime().remote_membership.leave(
        current_requester().user_id, room_id, outbound_caller(), content
    )
    return json_response({})


@bp.post("/knock/<path:room_id_or_alias>")
@requires_auth
def knock(room_id_or_alias: str):
    room_id, alias = _room_id_or_alias(room_id_or_alias)
    content = _membership_content(_reason())
    knocked = runtime().remote_membership.knock(
        current_requester().user_id, room_id, _via(), outbound_caller(), content, alias=alias
    )
    return json_response({"room_id": knocked})


@bp.post("/rooms/<room_id>/invite")
@requires_auth
def invite(room_id: str):
    raw = json_object()
    if "user_id" not in raw and {"medium", "address"} & set(raw):
        raise MatrixError(
            400, Codes.UNRECOGNIZED, "Third-party invites need an identity server; not supported"
        )
    body = validate_body(TargetBody(), raw)
    user_id, content = current_requester().user_id, _membership_content(body)
    target = body["user_id"]
    if is_valid_user_id(target) and server_of(target) != runtime().server_name:
        runtime().remote_membership.invite(user_id, room_id, target, outbound_caller(), content)
    else:
        runtime().rooms.update_membership(user_id, room_id, target, "invite", content)
    return json_response({})


@bp.post("/rooms/<room_id>/kick")
@requires_auth
def kick(room_id: str):
    body = validated_json(TargetBody())
    runtime().moderation.kick(current_requester(), room_id, body["user_id"], body.get("reason"))
    return json_response({})


@bp.post("/rooms/<room_id>/ban")
@requires_auth
def ban(room_id: str):
    body = validated_json(TargetBody())
    runtime().moderation.ban(current_requester(), room_id, body["user_id"], body.get("reason"))
    return json_response({})


@bp.post("/rooms/<room_id>/unban")
@requires_auth
def unban(room_id: str):
    body = validated_json(TargetBody())
    runtime().moderation.unban(current_requester(), room_id, body["user_id"], body.get("reason"))
    return json_response({})


@bp.post("/rooms/<room_id>/forget")
@requires_auth
def forget(room_id: str):
    json_object(allow_empty=True)  # the spec's body is empty; any JSON object is let be
    runtime().moderation.forget(current_requester(), room_id)
    return json_response({})


@bp.get("/rooms/<room_id>/joined_members")
@requires_auth
def joined_members(room_id: str):
    joined = runtime().moderation.joined_members(current_requester(), room_id)
    return json_response({"joined": joined})


@bp.get("/joined_rooms")
@requires_auth
def joined_rooms():
    return json_response(
        {"joined_rooms": runtime().rooms.joined_rooms(current_requester().user_id)}
    )


def _membership_arg(name: str) -> str | None:
    value = request.args.get(name)
    if value is not None and value not in MEMBERSHIPS:
        raise invalid_param(f"{name} must be one of " + ", ".join(MEMBERSHIPS))
    return value


@bp.get("/rooms/<room_id>/members")
@requires_auth
def members(room_id: str):
    chunk = runtime().room_history.members(
        current_requester(),
        room_id,
        request.args.get("at"),
        _membership_arg("membership"),
        _membership_arg("not_membership"),
    )
    return json_response({"chunk": chunk})


def _event_filter() -> EventFilter:
    raw = request.args.get("filter")
    return parse_room_event_filter(decode_filter_json(raw)) if raw else EventFilter()


@bp.get("/rooms/<room_id>/context/<event_id>")
@requires_auth
def context(room_id: str, event_id: str):
    raw = request.args.get("filter")
    event_filter = parse_room_event_filter(decode_filter_json(raw)) if raw else None
    body = runtime().room_history.context(
        current_requester(),
        room_id,
        event_id,
        query_int("limit", 10, minimum=0),
        event_filter or EventFilter(),
        event_filter is not None and event_filter.lazy_load_members,
    )
    return json_response(body)


@bp.get("/rooms/<room_id>/messages")
@requires_auth
def messages(room_id: str):
    direction = request.args.get("dir", "f")
    if direction not in ("b", "f"):
        raise invalid_param("dir must be b or f")
    page = runtime().room_history.messages(
        current_requester(),
        room_id,
        request.args.get("from"),
        request.args.get("to"),
        direction == "b",
        query_int("limit", 10, minimum=0),
        _event_filter(),
        outbound_caller(),  # going back past our oldest event may backfill (ADR-0079)
    )
    body = {"chunk": page.chunk, "start": page.start}
    if page.end is not None:
        body["end"] = page.end
    return json_response(body)
