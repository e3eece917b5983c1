"""What a request handler can know about the request beyond Flask's own: the runtime, the
client key and the request id, all set once per request by `RequestContextMiddleware`."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from flask import current_app, request

from homeserver.federation.admission import Caller
from homeserver.http.disconnect import stop_on_client_disconnect

if TYPE_CHECKING:
    from homeserver.runtime import HomeserverRuntime

RUNTIME_EXTENSION = "weir.runtime"


def runtime() -> "HomeserverRuntime":
    return current_app.extensions[RUNTIME_EXTENSION]


def client_key() -> str:
    """The rate-limit and budget key of the caller (docs/architecture.md, "Budgets")."""
    return request.environ["weir.client_key"]


def request_id() -> str:
    return request.environ["weir.request_id"]


def outbound_caller() -> Caller:
    """The caller of a client-triggered outbound call: its admission key and connection."""
    environ = request.environ
    return Caller(client_key(), environ, functools.partial(stop_on_client_disconnect, environ))
