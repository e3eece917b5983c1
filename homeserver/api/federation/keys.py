"""This server's identity on the federation listener: its key document and version."""

from __future__ import annotations

from flask import Blueprint

from ... import __version__
from ...federation.signing_key import own_key_document
from ...http.context import runtime
from ...http.responses import json_response

bp = Blueprint("federation_identity", __name__)


@bp.get("/_matrix/key/v2/server")
@bp.get("/_matrix/key/v2/server/<key_id>")  # deprecated form; the key id is ignored per spec
def server_keys(key_id: str | None = None):
    rt = runtime()
    return json_response(own_key_document(rt.server_name, rt.signing_key))


@bp.get("/_matrix/federation/v1/version")
def version():
    return json_response({"server": {"name": "Weir", "version": __version__}})
