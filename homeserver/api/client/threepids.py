"""Third-party identifiers (client-server spec, "Adding Account Administrative Contact
Information"): this server sends no email or SMS and keeps no identifiers, so it lists none,
never hands out a validation session, and so can add or bind none. `m.3pid_changes` is
false in /capabilities to match."""

from __future__ import annotations

from flask import Blueprint
from marshmallow import Schema, fields, validate

from homeserver.api.auth import requires_auth
from homeserver.core.errors import Codes, MatrixError
from homeserver.http.parsing import json_object
from homeserver.http.parsing import validate as validate_body
from homeserver.http.responses import json_response

bp = Blueprint("threepids", __name__, url_prefix="/_matrix/client/v3")

# The spec's 403 for "the homeserver does not allow the third-party identifier": without a
# way to send a token, it allows none.
_REQUEST_TOKEN_ROUTES = (
    "/register/email/requestToken",
    "/register/msisdn/requestToken",
    "/account/password/email/requestToken",
    "/account/password/msisdn/requestToken",
    "/account/3pid/email/requestToken",
    "/account/3pid/msisdn/requestToken",
)


class ThreepidBody(Schema):
    medium = fields.String(required=True, validate=validate.OneOf(["email", "msisdn"]))
    address = fields.String(required=True)
    id_server = fields.String()


def _no_token_sent():
    json_object(allow_empty=True)
    raise MatrixError(
        403, Codes.THREEPID_DENIED, "This server sends no email or SMS: third-party IDs are off"
    )


for _path in _REQUEST_TOKEN_ROUTES:
    _name = _path.strip("/").replace("/", "_")
    bp.add_url_rule(_path, _name, _no_token_sent, methods=["POST"])


@bp.get("/account/3pid")
@requires_auth
def list_threepids():
    return json_response({"threepids": []})


@bp.post("/account/3pid")
@bp.post("/account/3pid/add")
@bp.post("/account/3pid/bind")
@requires_auth
def add_threepid():
    # No session can have been validated: requestToken never made one.
    json_object(allow_empty=True)
    raise MatrixError(400, Codes.THREEPID_AUTH_FAILED, "No validated third-party ID session")


@bp.post("/account/3pid/delete")
@bp.post("/account/3pid/unbind")
@requires_auth
def remove_threepid():
    # As for any identifier the account does not have: nothing to remove, no server told.
    validate_body(ThreepidBody(), json_object())
    return json_response({"id_server_unbind_result": "no-support"})
