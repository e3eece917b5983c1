"""Events of our rooms read by other servers: /event, /state, /state_ids, /event_auth,
/backfill and /get_missing_events. Who may read what is `rooms/federation_reads.py`'s."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.client.jump_to_date import timestamp_params
from homeserver.api.context import runtime
from homeserver.api.federation_auth import current_origin, requires_server_auth
from homeserver.core.clock import now_ms
from homeserver.core.errors import bad_json, missing_param
from homeserver.http.parsing import json_object, query_int
from homeserver.http.responses import json_response
from homeserver.rooms.federation_reads import MAX_BACKFILL, MAX_MISSING_EVENTS

bp = Blueprint("federation_events", __name__)

_V1 = "/_matrix/federation/v1"
# A get_missing_events body is two short lists of event IDs.
_MISSING_EVENTS_BODY_BYTES = 64 * 1024


def _event_id_param() -> str:
    event_id = request.args.get("event_id")
    if not event_id:
        raise missing_param("Missing parameter: event_id")
    return event_id


@bp.get(f"{_V1}/event/<event_id>")
@requires_server_auth
def get_event(event_id: str):
    rt = runtime()
    pdu = rt.federation_reads.event(current_origin(), event_id)
    return json_response({"origin": rt.server_name, "origin_server_ts": now_ms(), "pdus": [pdu]})


@bp.get(f"{_V1}/state/<room_id>")
@requires_server_auth
def get_state(room_id: str):
    reads = runtime().federation_reads
    return json_response(reads.state(current_origin(), room_id, _event_id_param(), False))


@bp.get(f"{_V1}/state_ids/<room_id>")
@requires_server_auth
def get_state_ids(room_id: str):
    reads = runtime().federation_reads
    return json_response(reads.state(current_origin(), room_id, _event_id_param(), True))


@bp.get(f"{_V1}/event_auth/<room_id>/<event_id>")
@requires_server_auth
def get_event_auth(room_id: str, event_id: str):
    return json_response(runtime().federation_reads.event_auth(current_origin(), room_id, event_id))


@bp.get(f"{_V1}/backfill/<room_id>")
@requires_server_auth
def backfill(room_id: str):
    from_ids = request.args.getlist("v")
    if not from_ids:
        raise missing_param("Missing parameter: v")
    limit = query_int("limit", minimum=0, maximum=MAX_BACKFILL)
    if limit is None:
        raise missing_param("Missing parameter: limit")
    return json_response(
        runtime().federation_reads.backfill(current_origin(), room_id, from_ids, limit)
    )


@bp.get(f"{_V1}/timestamp_to_event/<room_id>")
@requires_server_auth
def timestamp_to_event(room_id: str):
    ts, forward = timestamp_params()
    return json_response(
        runtime().federation_reads.timestamp_to_event(current_origin(), room_id, ts, forward)
    )


def _event_ids(body: dict, name: str) -> list[str]:
    value = body.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_json(f"{name} must be a list of event IDs")
    return value


def _int_field(body: dict, name: str, default: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_json(f"{name} must be an integer")
    return value


@bp.post(f"{_V1}/get_missing_events/<room_id>")
@requires_server_auth(max_body_bytes=_MISSING_EVENTS_BODY_BYTES)
def get_missing_events(room_id: str):
    body = json_object(_MISSING_EVENTS_BODY_BYTES)
    earliest = _event_ids(body, "earliest_events")
    latest = _event_ids(body, "latest_events")
    limit = min(_int_field(body, "limit", 10), MAX_MISSING_EVENTS)
    min_depth = _int_field(body, "min_depth", 0)
    answer = runtime().federation_reads.missing_events(
        current_origin(), room_id, earliest, latest, limit, min_depth
    )
    return json_response(answer)
