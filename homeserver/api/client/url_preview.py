"""Link previews over the client-server API (media/preview.py): the authenticated
`/_matrix/client/v1/media/preview_url` and the legacy media paths, which need a token too."""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.auth import current_requester
from homeserver.api.context import outbound_caller, runtime
from homeserver.core.errors import missing_param, unrecognized
from homeserver.http.parsing import query_int, query_str
from homeserver.http.responses import json_response

bp = Blueprint("url_preview", __name__)


@bp.get("/_matrix/client/v1/media/preview_url")
@bp.get("/_matrix/media/v3/preview_url")
@bp.get("/_matrix/media/r0/preview_url")
def preview_url():
    previewer = runtime().url_previewer
    if not previewer.config.enabled:
        # Before authentication: Synapse has no such route then, so every request is 404.
        raise unrecognized()
    user_id = current_requester().user_id
    url = query_str("url")
    if not url:
        raise missing_param("Missing url parameter")
    ts = query_int("ts", minimum=0)
    return json_response(previewer.preview(user_id, url, ts, outbound_caller()))
