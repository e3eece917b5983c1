"""The content repository (client-server API): the authenticated /_matrix/client/v1/media
endpoints, and the legacy /_matrix/media/v3 ones (upload and create still live there)."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.auth import current_requester, enforce_rate_limit, requires_auth
from homeserver.api.context import outbound_caller, runtime
from homeserver.api.media_query import thumbnail_query, timeout_ms
from homeserver.api.media_responses import file_response
from homeserver.core.errors import not_found
from homeserver.http.parsing import body_chunks, query_bool
from homeserver.http.responses import json_response
from homeserver.media.remote import MediaRequest

bp = Blueprint("media", __name__)

CLIENT_MEDIA = "/_matrix/client/v1/media"
LEGACY_MEDIA = "/_matrix/media/v3"


def _mxc_parts(location: str, with_filename: bool) -> tuple[str, str, str | None]:
    """`server/media_id[/file name]` from the path. The path arrives decoded (`%2F` is a slash
    here), so it is split at its first two slashes only; the media id is then held to the
    spec's grammar by the service, and anything else in it is 404."""
    parts = location.split("/", 2)
    if len(parts) < 2 or (len(parts) == 3 and not with_filename):
        raise not_found("Media not found")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _media_request(legacy: bool) -> MediaRequest:
    # allow_remote is the legacy API's; /client/v1 has no such parameter.
    return MediaRequest(
        legacy=legacy,
        timeout_ms=timeout_ms(),
        allow_remote=query_bool("allow_remote", True) if legacy else True,
        caller=outbound_caller(),
    )


@bp.get(f"{CLIENT_MEDIA}/config")
@bp.get(f"{LEGACY_MEDIA}/config")
@requires_auth
def config():
    return json_response(runtime().media.upload_config())


@bp.post(f"{LEGACY_MEDIA}/upload")
@requires_auth
def upload():
    content_uri = runtime().media.upload(
        current_requester().user_id,
        body_chunks(),
        request.content_length,
        request.headers.get("Content-Type"),
        request.args.get("filename"),
    )
    return json_response({"content_uri": content_uri})


@bp.post("/_matrix/media/v1/create")
@requires_auth
def create():
    rt = runtime()
    enforce_rate_limit(rt.media_create_rate_limiter)
    return json_response(rt.media.create(current_requester().user_id))


@bp.put(f"{LEGACY_MEDIA}/upload/<path:location>")
@requires_auth
def upload_to(location: str):
    server_name, media_id, _ = _mxc_parts(location, with_filename=False)
    runtime().media.upload_to(
        current_requester().user_id,
        server_name,
        media_id,
        body_chunks(),
        request.content_length,
        request.headers.get("Content-Type"),
        request.args.get("filename"),
    )
    return json_response({})


def _download(location: str, legacy: bool):
    server_name, media_id, filename = _mxc_parts(location, with_filename=True)
    media_file = runtime().media.download(server_name, media_id, filename, _media_request(legacy))
    return file_response(media_file, request.environ)


@bp.get(f"{CLIENT_MEDIA}/download/<path:location>")
@requires_auth
def download(location: str):
    return _download(location, legacy=False)


@bp.get(f"{LEGACY_MEDIA}/download/<path:location>")
def legacy_download(location: str):
    return _download(location, legacy=True)


def _thumbnail(location: str, legacy: bool):
    server_name, media_id, _ = _mxc_parts(location, with_filename=False)
    query = thumbnail_query()
    media_file = runtime().media.thumbnail(
        server_name,
        media_id,
        query.width,
        query.height,
        query.method,
        query.animated,
        _media_request(legacy),
    )
    return file_response(media_file, request.environ)


@bp.get(f"{CLIENT_MEDIA}/thumbnail/<path:location>")
@requires_auth
def thumbnail(location: str):
    return _thumbnail(location, legacy=False)


@bp.get(f"{LEGACY_MEDIA}/thumbnail/<path:location>")
def legacy_thumbnail(location: str):
    return _thumbnail(location, legacy=True)
