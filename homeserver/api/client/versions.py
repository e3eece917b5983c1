"""Discovery endpoints a client or load balancer calls before anything else."""

from __future__ import annotations

from flask import Blueprint, request

from homeserver.api.context import runtime
from homeserver.http.responses import JsonResponse, json_response

bp = Blueprint("versions", __name__)

# Every version of the client-server spec, as Synapse lists them: clients pick features by
# the versions listed (matrix-js-sdk uses the stable /threads only with v1.4).
SUPPORTED_VERSIONS = [
    "r0.0.1",
    "r0.1.0",
    "r0.2.0",
    "r0.3.0",
    "r0.4.0",
    "r0.5.0",
    "r0.6.0",
    "r0.6.1",
    *(f"v1.{minor}" for minor in range(1, 17)),
]
# Clients ask this before anything else, and often; its answer never changes, so it is
# encoded once.
# Simplified sliding sync (MSC4186) on its unstable path: api/client/sliding_sync.py.
UNSTABLE_FEATURES = {"org.matrix.simplified_msc3575": True}
_VERSIONS_BODY = json_response(
    {"versions": SUPPORTED_VERSIONS, "unstable_features": UNSTABLE_FEATURES}
).data


@bp.get("/_matrix/client/versions")
def versions():
    return JsonResponse(_VERSIONS_BODY)


@bp.get("/.well-known/matrix/client")
def well_known_client():
    return json_response({"m.homeserver": {"base_url": runtime().config.public_baseurl}})


@bp.get("/.well-known/matrix/server")
def well_known_server():
    return json_response({"m.server": runtime().federation_address})


@bp.get("/health")
def health():
    # Served only once the runtime is built and migrations are applied: this app does not
    # exist before then.
    if request.environ.get("weir.draining"):
        # Shutting down (http/server.py): a load balancer stops sending here before the
        # listeners close.
        return json_response({"status": "stopping"}, 503)
    return json_response({"status": "ok"})
