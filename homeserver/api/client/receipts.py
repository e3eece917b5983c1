"""Receipts, read markers and typing notifications (client-server spec, "Receipts",
"Read and unread markers", "Typing Notifications")."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields, validate

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import json_object, validated_json
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response

bp = Blueprint("receipts", __name__, url_prefix="/_matrix/client/v3")


class ReceiptBody(Schema):
    thread_id = fields.String()


class ReadMarkersBody(Schema):
    fully_read = fields.String(data_key="m.fully_read")
    read = fields.String(data_key="m.read")
    read_private = fields.String(data_key="m.read.private")


class TypingBody(Schema):
    typing = fields.Boolean(required=True)
    timeout = fields.Integer(validate=validate.Range(min=0))


@bp.post("/rooms/<room_id>/receipt/<receipt_type>/<event_id>")
@requires_auth
def receipt(room_id: str, receipt_type: str, event_id: str):
    body = validate_body(ReceiptBody(), json_object(allow_empty=True))
    runtime().receipts.send(
        current_requester(), room_id, receipt_type, event_id, body.get("thread_id")
    )
    return json_response({})


@bp.post("/rooms/<room_id>/read_markers")
@requires_auth
def read_markers(room_id: str):
    body = validate_body(ReadMarkersBody(), json_object(allow_empty=True))
    runtime().receipts.set_read_markers(
        current_requester(),
        room_id,
        body.get("fully_read"),
        body.get("read"),
        body.get("read_private"),
    )
    return json_response({})


@bp.put("/rooms/<room_id>/typing/<user_id>")
@requires_auth
def typing(room_id: str, user_id: str):
    body = validated_json(TypingBody())
    runtime().typing.set_typing(
        current_requester(), room_id, user_id, body["typing"], body.get("timeout")
    )
    return json_response({})
