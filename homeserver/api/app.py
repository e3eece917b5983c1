"""Builds the Flask application for one or both listeners.

Production serves the client-server API on the client listener and the server-server API
on the federation listener, as two apps over one runtime. The dev server (`flask --app app
run`) and tests that build the app alone serve both from one app.
"""

from __future__ import annotations

from flask import Flask
from flask.sessions import NullSession, SessionInterface

from homeserver.api.client import (
    account_data,
    account_settings,
    accounts,
    admin,
    admin_rooms,
    admin_tokens,
    admin_users,
    appservice,
    capabilities,
    devices,
    directory,
    jump_to_date,
    key_backup,
    keys,
    media,
    metrics,
    presence,
    profile,
    push,
    pushers,
    receipts,
    relations,
    reports,
    rooms,
    search,
    sliding_sync,
    spaces,
    sync,
    threepids,
    upgrades,
    url_preview,
    user_directory,
    versions,
)
from homeserver.api.context import RUNTIME_EXTENSION
from homeserver.api.federation import directory as federation_directory
from homeserver.api.federation import e2ee as federation_e2ee
from homeserver.api.federation import events as federation_events
from homeserver.api.federation import keys as federation_keys
from homeserver.api.federation import media as federation_media
from homeserver.api.federation import membership, transactions
from homeserver.api.federation import openid as federation_openid
from homeserver.api.federation import profile as federation_profile
from homeserver.api.federation import spaces as federation_spaces
from homeserver.http.middleware import RequestContextMiddleware
from homeserver.http.responses import register_error_handlers
from homeserver.http.routing import RouteMap

CLIENT = "client"
FEDERATION = "federation"


def client_blueprints():
    return [
        versions.bp,
        accounts.bp,
        account_settings.bp,
        threepids.bp,
        accounts.v1,
        admin.bp,
        admin_tokens.bp,
        admin_users.bp,
        admin_rooms.bp,
        rooms.bp,
        jump_to_date.bp,
        relations.bp,
        search.bp,
        spaces.bp,
        upgrades.bp,
        directory.bp,
        directory.r0,
        media.bp,
        url_preview.bp,
        metrics.bp,
        sync.bp,
        sliding_sync.bp,
        account_data.bp,
        profile.bp,
        user_directory.bp,
        presence.bp,
        receipts.bp,
        reports.bp,
        capabilities.bp,
        push.bp,
        pushers.bp,
        key_backup.bp,
        devices.bp,
        keys.bp,
        appservice.bp,
    ]


def federation_blueprints():
    # The well-known and health routes are served here too: a load balancer or a peer may
    # ask either listener.
    return [
        federation_keys.bp,
        federation_profile.bp,
        federation_e2ee.bp,
        federation_directory.bp,
        transactions.bp,
        membership.bp,
        federation_events.bp,
        federation_spaces.bp,
        versions.bp,
        federation_media.bp,
        federation_openid.bp,
    ]


class _WeirFlask(Flask):
    # Fixed paths matched without leaving werkzeug's reference cycle (http/routing.py).
    url_map_class = RouteMap


class _NoSessions(SessionInterface):
    """Matrix has no cookie sessions: every request shares one null session, rather than
    Flask making one per request (and keeping it for as long as a /sync is parked)."""

    _null = NullSession()

    def open_session(self, app, request):
        return self._null

    def save_session(self, app, session, response) -> None:
        return None


def create_flask_app(runtime, listeners: tuple[str, ...] = (CLIENT, FEDERATION)) -> Flask:
    app = _WeirFlask("homeserver")
    app.session_interface = _NoSessions()
    app.extensions[RUNTIME_EXTENSION] = runtime
    # Bodies are read through http.parsing with per-route caps; this is the outer bound.
    app.config["MAX_CONTENT_LENGTH"] = None
    app.url_map.strict_slashes = False

    blueprints = []
    if CLIENT in listeners:
        blueprints += client_blueprints()
    if FEDERATION in listeners:
        blueprints += federation_blueprints()
    for bp in dict.fromkeys(blueprints):
        app.register_blueprint(bp)

    register_error_handlers(app)

    # The CORS headers and the OPTIONS preflight are the middleware's: added to every
    # response without a pass through Flask's Headers, and a preflight without a dispatch.
    app.wsgi_app = RequestContextMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, runtime.trusted_proxies
    )
    return app
