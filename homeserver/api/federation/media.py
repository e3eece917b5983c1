"""Our media, served to other servers (`/_matrix/federation/v1/media/download|thumbnail`).

Both answer `multipart/mixed` (media/responses.py builds it, in Synapse's exact shape). Only
the path's media id is looked up, always as ours: another server's media is never fetched on
behalf of a server that asks us for it. Media we do not have is 404 M_NOT_FOUND.
"""

from __future__ import annotations

from flask import Blueprint

from homeserver.api.context import runtime
from homeserver.api.federation_auth import requires_server_auth
from homeserver.api.media_query import thumbnail_query, timeout_ms
from homeserver.api.media_responses import multipart_response
from homeserver.media.remote import MediaRequest

bp = Blueprint("federation_media", __name__)

FEDERATION_MEDIA = "/_matrix/federation/v1/media"


def _as_ours() -> MediaRequest:
    # The requesting server authenticated with X-Matrix: media frozen to the authenticated
    # API is served to it, as to a client of /client/v1.
    return MediaRequest(legacy=False, timeout_ms=timeout_ms())


@bp.get(f"{FEDERATION_MEDIA}/download/<media_id>")
@requires_server_auth
def download(media_id: str):
    rt = runtime()
    media_file = rt.media.download(rt.server_name, media_id, None, _as_ours())
    return multipart_response(media_file)


@bp.get(f"{FEDERATION_MEDIA}/thumbnail/<media_id>")
@requires_server_auth
def thumbnail(media_id: str):
    rt = runtime()
    query = thumbnail_query()
    media_file = rt.media.thumbnail(
        rt.server_name,
        media_id,
        query.width,
        query.height,
        query.method,
        query.animated,
        _as_ours(),
    )
    return multipart_response(media_file)
