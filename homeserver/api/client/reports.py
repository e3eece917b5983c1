"""Reporting content to the server's admins (client-server spec, "Reporting content"): an
event, a room, a user (rooms/reports.py keeps them)."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.http.parsing import validated_json
from homeserver.http.responses import json_response

bp = Blueprint("reports", __name__, url_prefix="/_matrix/client/v3")

# A reason is at most 1000 characters (rooms/reports.py); this bounds what is read for it.
MAX_REPORT_BYTES = 16 * 1024


class EventReportBody(Schema):
    reason = fields.String(load_default=None)
    score = fields.Integer(load_default=None, strict=True)


class ReportBody(Schema):
    reason = fields.String(required=True)


@bp.post("/rooms/<room_id>/report/<event_id>")
@requires_auth
def report_event(room_id: str, event_id: str):
    body = validated_json(EventReportBody(), max_bytes=MAX_REPORT_BYTES, allow_empty=True)
    runtime().reports.report_event(
        current_requester(), room_id, event_id, body["reason"], body["score"]
    )
    return json_response({})


@bp.post("/rooms/<room_id>/report")
@requires_auth
def report_room(room_id: str):
    body = validated_json(ReportBody(), max_bytes=MAX_REPORT_BYTES)
    runtime().reports.report_room(current_requester(), room_id, body["reason"])
    return json_response({})


@bp.post("/users/<user_id>/report")
@requires_auth
def report_user(user_id: str):
    body = validated_json(ReportBody(), max_bytes=MAX_REPORT_BYTES)
    runtime().reports.report_user(current_requester(), user_id, body["reason"])
    return json_response({})
