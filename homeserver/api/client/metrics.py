"""Prometheus scrape endpoint on the client listener, for allowed client addresses only."""

from __future__ import annotations

from flask import Blueprint, Response

from homeserver.api.context import client_key, runtime
from homeserver.core.errors import forbidden, unrecognized
from homeserver.metrics import CONTENT_TYPE, scrape_allowed

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics():
    rt = runtime()
    if not rt.config.metrics.enabled:
        raise unrecognized()
    if not scrape_allowed(client_key(), rt.metrics_allowed_networks):
        raise forbidden("Metrics are not served to this address")
    return Response(
        rt.metrics.render(),
        mimetype=CONTENT_TYPE.split(";")[0],
        headers={"Content-Type": CONTENT_TYPE},
    )
