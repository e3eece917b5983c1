"""Application services over the client-server API: `/appservice/{appserviceId}/ping`
(appservice/service.py) and the third-party lookups.

Third-party lookups go to the appservices whose registration lists the protocol
(`protocols`), each asked within the query deadline (appservice/service.py); a protocol none
offers is 404.
"""

from __future__ import annotations

from flask import Blueprint, request
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
    return json_response(runtime().appservices.protocols())


@bp.get("/v3/thirdparty/protocol/<protocol>")
@requires_auth
def protocol(protocol: str):
    found = runtime().appservices.protocols(only=protocol)
    if protocol not in found:
        raise not_found(f"No application service offers the protocol {protocol[:100]!r}")
    return json_response(found[protocol])


@bp.get("/v3/thirdparty/location/<protocol>")
@bp.get("/v3/thirdparty/user/<protocol>")
@requires_auth
def by_protocol(protocol: str):
    rt = runtime()
    if not rt.appservices.offers(protocol):
        raise not_found(f"No application service offers the protocol {protocol[:100]!r}")
    kind = request.path.split("/")[-2]  # location or user
    return json_response(rt.appservices.lookup(kind, protocol, _forwarded()))


@bp.get("/v3/thirdparty/location")
@bp.get("/v3/thirdparty/user")
@requires_auth
def reverse_lookup():
    kind = request.path.rsplit("/", 1)[-1]
    return json_response(runtime().appservices.lookup(kind, None, _forwarded()))


def _forwarded() -> dict[str, str]:
    """The lookup's fields, passed on as they came; our token stays here."""
    return {k: v for k, v in request.args.items() if k not in ("access_token", "user_id")}
