"""WSGI middleware run on every request: request id, client key, CORS, the OPTIONS
preflight. (The access log's line is the server's, once the response is sent:
http/access_log.py.)

It runs on every request, so it is kept lean (python -m loadtests.request_path_bench): the
CORS headers are added to the header list once, as the response starts, rather than through
Flask's Headers; and a preflight is answered here, without Flask's dispatch.
"""

from __future__ import annotations

import itertools
import os

from budget import client_key
from homeserver.http.responses import CORS_HEADER_LIST
from homeserver.logs import current_request_id

# A request id need only be unique in the logs, not secret: a counter from a random start
# (12 hex digits, as before). One os.urandom call per request showed in a wake storm.
_request_ids = itertools.count(int.from_bytes(os.urandom(6), "big"))
_ID_BITS = (1 << 48) - 1
# What Flask's empty 204 carried, so that a preflight answers as before.
_PREFLIGHT_HEADERS = [("Content-Type", "text/html; charset=utf-8")]


class RequestContextMiddleware:
    def __init__(self, app, trusted_proxies):
        self.app = app
        self.trusted_proxies = trusted_proxies

    def __call__(self, environ, start_response):
        request_id = environ["weir.request_id"] = f"{next(_request_ids) & _ID_BITS:012x}"
        # Every line logged while serving this request carries its id (homeserver/logs.py).
        current_request_id.set(request_id)
        environ["weir.client_key"] = client_key(
            environ.get("REMOTE_ADDR", ""),
            environ.get("HTTP_X_FORWARDED_FOR"),
            self.trusted_proxies,
        )

        if environ["REQUEST_METHOD"] == "OPTIONS":
            # CORS preflight: answered for any path, before routing, as the spec recommends.
            start_response("204 NO CONTENT", [*_PREFLIGHT_HEADERS, *CORS_HEADER_LIST])
            return []

        def cors_start_response(status, headers, exc_info=None):
            # No route sets these itself: appended, not merged.
            return start_response(status, headers + CORS_HEADER_LIST, exc_info)

        return self.app(environ, cors_start_response)
