"""This server's identity on the federation listener (its key document and version), and the
notary endpoints that serve other servers' keys, signed by us (spec: "Querying Keys Through
Another Server"). All unauthenticated, per spec."""

from __future__ import annotations

import time

from flask import Blueprint
from marshmallow import EXCLUDE, Schema, fields

from homeserver import __version__
from homeserver.api.context import client_key, runtime
from homeserver.core.errors import limit_exceeded
from homeserver.federation.errors import KeyResolutionRefused
from homeserver.federation.signing_key import own_key_document
from homeserver.http.parsing import query_int, validated_json
from homeserver.http.responses import json_response

bp = Blueprint("federation_identity", __name__)


@bp.get("/_matrix/key/v2/server")
@bp.get("/_matrix/key/v2/server/<key_id>")  # deprecated form; the key id is ignored per spec
def server_keys(key_id: str | None = None):
    rt = runtime()
    return json_response(own_key_document(rt.server_name, rt.signing_key))


@bp.get("/_matrix/federation/v1/version")
def version():
    return json_response({"server": {"name": "Weir", "version": __version__}})


class _KeyCriteria(Schema):
    class Meta:
        unknown = EXCLUDE  # nested: validate()'s EXCLUDE covers the top level only

    minimum_valid_until_ts = fields.Integer(strict=True, load_default=None)


class _KeyQuery(Schema):
    # May name no server: the spec's answer to that is an empty server_keys.
    server_keys = fields.Dict(
        keys=fields.String(),
        required=True,
        values=fields.Dict(keys=fields.String(), values=fields.Nested(_KeyCriteria)),
    )


def _notarised(queries: dict[str, tuple[list[str], int]]):
    try:
        documents = runtime().keyring.key_documents(queries, client_key())
    except KeyResolutionRefused as e:
        raise limit_exceeded(e.retry_after_ms) from None
    return json_response({"server_keys": documents})


def _now_ms() -> int:
    return int(time.time() * 1000)


@bp.get("/_matrix/key/v2/query/<server_name>")
def query_server_keys(server_name: str):
    minimum = query_int("minimum_valid_until_ts", default=_now_ms(), minimum=0)
    return _notarised({server_name: ([], minimum)})


@bp.post("/_matrix/key/v2/query")
def query_keys():
    body = validated_json(_KeyQuery())
    now = _now_ms()
    queries = {}
    for server, wanted in body["server_keys"].items():
        minimums = [
            (criteria or {}).get("minimum_valid_until_ts") or now for criteria in wanted.values()
        ]
        queries[server] = (list(wanted), max([now, *minimums]))
    return _notarised(queries)
