"""Application services over the client-server API: `/appservice/{appserviceId}/ping`
(appservice/service.py) and the third-party lookups.

Third-party lookups are not passed through to appservices: no protocol is listed, a named
protocol is unknown (404) and a reverse lookup finds nothing, the spec's shapes for a server
whose appservices offer no protocol.
"""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields

from homeserver.api.auth import current_requester, requires_auth
from homeserver.api.context import runtime
from homeserver.core.errors import not_found
from homeserver.http.parsing import validated_json
from homeserver.http.responses import json_response

bp = Blueprint("appservice", __name__, url_prefix="/_matrix/client")


class PingBody(Schema):
    transaction_id = fields.String()


@bp.post("/v1/appservice/<appservice_id>/ping")
@requires_auth
def ping(appservice_id: str):
    body = validated_json(PingBody())
    duration_ms = runtime().appservices.ping(
        current_requester(), appservice_id, body.get("transaction_id")
    )
    return json_response({"duration_ms": duration_ms})


@bp.get("/v3/thirdparty/protocols")
@requires_auth
def protocols():
    return json_response({})


@bp.get("/v3/thirdparty/protocol/<protocol>")
@bp.get("/v3/thirdparty/location/<protocol>")
@bp.get("/v3/thirdparty/user/<protocol>")
@requires_auth
def by_protocol(protocol: str):
    raise not_found(f"No application service offers the protocol {protocol[:100]!r}")


@bp.get("/v3/thirdparty/location")
@bp.get("/v3/thirdparty/user")
@requires_auth
def reverse_lookup():
    return json_response([])
