"""Membership asked for by other servers: make_join/send_join, make_leave/send_leave,
make_knock/send_knock and invites of our users. The work is `rooms/federation_membership.py`'s."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.context import client_key, runtime
from homeserver.api.federation_auth import (
    current_origin,
    requires_server_auth,
)
from homeserver.core.errors import limit_exceeded, missing_param
from homeserver.federation.errors import KeyResolutionRefused
from homeserver.http.parsing import json_object
from homeserver.http.responses import json_response
from homeserver.rooms.events import MAX_PDU_BYTES

bp = Blueprint("federation_membership", __name__)

# One event, with room for its JSON framing; an invite also carries stripped state.
_EVENT_BODY_BYTES = 2 * MAX_PDU_BYTES
_INVITE_BODY_BYTES = 8 * MAX_PDU_BYTES
_V1 = "/_matrix/federation/v1"
_V2 = "/_matrix/federation/v2"


def _refused_keys(e: KeyResolutionRefused):
    return limit_exceeded(e.retry_after_ms, f"Cannot fetch the keys of {e.destination} now")


@bp.get(f"{_V1}/make_join/<room_id>/<user_id>")
@requires_server_auth
def make_join(room_id: str, user_id: str):
    # The spec's default when `ver` is absent: room version 1 only.
    versions = request.args.getlist("ver") or ["1"]
    return json_response(
        runtime().federation_membership.make_membership(
            current_origin(), room_id, user_id, "join", versions
        )
    )


@bp.get(f"{_V1}/make_leave/<room_id>/<user_id>")
@requires_server_auth
def make_leave(room_id: str, user_id: str):
    return json_response(
        runtime().federation_membership.make_membership(current_origin(), room_id, user_id, "leave")
    )


@bp.get(f"{_V1}/make_knock/<room_id>/<user_id>")
@requires_server_auth
def make_knock(room_id: str, user_id: str):
    versions = request.args.getlist("ver")
    if not versions:
        raise missing_param("Missing parameter: ver")
    return json_response(
        runtime().federation_membership.make_membership(
            current_origin(), room_id, user_id, "knock", versions
        )
    )


def _send(room_id: str, event_id: str, membership: str):
    pdu = json_object(_EVENT_BODY_BYTES)
    try:
        answer = runtime().federation_membership.send_membership(
            current_origin(), room_id, event_id, pdu, membership, client_key()
        )
    except KeyResolutionRefused as e:
        raise _refused_keys(e) from None
    return json_response(answer)


@bp.put(f"{_V2}/send_join/<room_id>/<event_id>")
@requires_server_auth(max_body_bytes=_EVENT_BODY_BYTES)
def send_join(room_id: str, event_id: str):
    return _send(room_id, event_id, "join")


@bp.put(f"{_V2}/send_leave/<room_id>/<event_id>")
@requires_server_auth(max_body_bytes=_EVENT_BODY_BYTES)
def send_leave(room_id: str, event_id: str):
    return _send(room_id, event_id, "leave")


@bp.put(f"{_V1}/send_knock/<room_id>/<event_id>")
@requires_server_auth(max_body_bytes=_EVENT_BODY_BYTES)
def send_knock(room_id: str, event_id: str):
    return _send(room_id, event_id, "knock")


@bp.put(f"{_V2}/invite/<room_id>/<event_id>")
@requires_server_auth(max_body_bytes=_INVITE_BODY_BYTES)
def invite(room_id: str, event_id: str):
    body = json_object(_INVITE_BODY_BYTES)
    try:
        answer = runtime().federation_membership.receive_invite(
            current_origin(), room_id, event_id, body, client_key()
        )
    except KeyResolutionRefused as e:
        raise _refused_keys(e) from None
    return json_response(answer)
