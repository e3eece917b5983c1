"""WSGI middleware run on every request: request id, client key, CORS, the OPTIONS
preflight, access log.

It runs on every request, so it is kept lean (python -m loadtests.request_path_bench): the
CORS headers are added to the header list once, as the response starts, rather than through
Flask's Headers; a preflight is answered here, without Flask's dispatch; and the access
log's line is neither built nor waited for when its logger is off, and written without a
LogRecord when it is on (homeserver/logs.py, ACCESS_LOG).
"""

from __future__ import annotations

import itertools
import os
import time
from urllib.parse import unquote_plus

from budget import client_key
from homeserver.http.responses import CORS_HEADER_LIST
from homeserver.logs import ACCESS_LOG, current_request_id

_SECRET_PARAMS = frozenset({"access_token"})
# A request id need only be unique in the logs, not secret: a counter from a random start
# (12 hex digits, as before). One os.urandom call per request showed in a wake storm.
_request_ids = itertools.count(int.from_bytes(os.urandom(6), "big"))
_ID_BITS = (1 << 48) - 1
# What Flask's empty 204 carried, so that a preflight answers as before.
_PREFLIGHT_HEADERS = [("Content-Type", "text/html; charset=utf-8")]


def redacted_path(environ: dict) -> str:
    """The path and query, the token's value redacted however its key is spelt: the query
    is parsed as Werkzeug parses it (`access%5Ftoken` is `access_token` to the app).
    Control characters are escaped by the log formatter (homeserver/logs.py)."""
    path = environ.get("PATH_INFO", "")
    query = environ.get("QUERY_STRING", "")
    if query:
        path += "?" + "&".join(_redacted_pair(pair) for pair in query.split("&"))
    return path


def _redacted_pair(pair: str) -> str:
    key, sep, _ = pair.partition("=")
    if unquote_plus(key, errors="replace").strip().lower() in _SECRET_PARAMS:
        return f"{key}{sep}<redacted>"
    return pair


class RequestContextMiddleware:
    def __init__(self, app, trusted_proxies):
        self.app = app
        self.trusted_proxies = trusted_proxies

    def __call__(self, environ, start_response):
        started = time.monotonic()
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
            log_request(environ, "204", started)
            return []

        if not ACCESS_LOG.enabled():

            def cors_start_response(status, headers, exc_info=None):
                return start_response(status, headers + CORS_HEADER_LIST, exc_info)

            return self.app(environ, cors_start_response)

        status_holder = []

        def recording_start_response(status, headers, exc_info=None):
            status_holder.append(status.split(" ", 1)[0])
            # No route sets these itself: appended, not merged.
            return start_response(status, headers + CORS_HEADER_LIST, exc_info)

        try:
            body = self.app(environ, recording_start_response)
        except BaseException as e:
            # Only BaseExceptions get here (Flask renders every Exception): a client that hung
            # up mid-request, or a shutdown. Log the request all the same.
            log_request(environ, type(e).__name__, started)
            raise
        return _LoggedBody(body, environ, status_holder, started)


def log_request(environ: dict, status: str, started: float) -> None:
    """The access log line, written once the response is done; the request ends here."""
    if ACCESS_LOG.enabled():
        # A federation request names the server it was verified to come from.
        origin = environ.get("weir.origin")
        ACCESS_LOG.write(
            f"{environ.get('REQUEST_METHOD')} {redacted_path(environ)} {status} "
            f"{(time.monotonic() - started) * 1000:.1f}ms {environ['weir.client_key']}"
            f"{f' origin={origin}' if origin else ''}",
            environ["weir.request_id"],
        )
    current_request_id.set(None)


class _LoggedBody:
    """Logs the request once its body has been sent, so the duration includes streaming."""

    def __init__(self, body, environ, status_holder, started):
        self._body = body
        self._environ = environ
        self._status = status_holder
        self._started = started

    def __iter__(self):
        return iter(self._body)

    def close(self):
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            log_request(self._environ, self._status[0] if self._status else "-", self._started)
