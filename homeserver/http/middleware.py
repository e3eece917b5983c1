"""WSGI middleware run on every request: request id, client key, access log."""

from __future__ import annotations

import logging
import secrets
import time
from urllib.parse import unquote_plus

from budget import client_key
from homeserver.logs import current_request_id

access_log = logging.getLogger("weir.access")

_SECRET_PARAMS = frozenset({"access_token"})


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
        environ["weir.request_id"] = secrets.token_hex(6)
        # Every line logged while serving this request carries its id (homeserver/logs.py).
        current_request_id.set(environ["weir.request_id"])
        environ["weir.client_key"] = client_key(
            environ.get("REMOTE_ADDR", ""),
            environ.get("HTTP_X_FORWARDED_FOR"),
            self.trusted_proxies,
        )
        status_holder = []

        def recording_start_response(status, headers, exc_info=None):
            status_holder.append(status.split(" ", 1)[0])
            return start_response(status, headers, exc_info)

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
    # A federation request names the server it was verified to come from.
    origin = environ.get("weir.origin")
    access_log.info(
        "%s %s %s %.1fms %s%s",
        environ.get("REQUEST_METHOD"),
        redacted_path(environ),
        status,
        (time.monotonic() - started) * 1000,
        environ["weir.client_key"],
        f" origin={origin}" if origin else "",
        extra={"request_id": environ["weir.request_id"]},
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
