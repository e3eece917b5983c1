"""The access log's line for each request: written by the server's handler once the response
is done (http/server.py, `WeirHandler.log_request`), for every response it sends, a preflight
or a refusal included.

The request only leaves its fields behind (`AccessLine`); the line is made when the log
handler writes its buffer, once per turn of the hub (homeserver/logs.py, ACCESS_LOG), so a
request costs an append, not the line's formatting (python -m loadtests.request_path_bench).
"""

from __future__ import annotations

from urllib.parse import unquote_plus

from homeserver.logs import ACCESS_LOG, current_request_id

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


class AccessLine:
    """`METHOD /path?query STATUS 1.2ms CLIENT [origin=SERVER]`, made when it is written.

    The client is the request's client key (a trusted proxy's X-Forwarded-For, IPv6 by
    /64); a federation request names the server it was verified to come from."""

    __slots__ = ("environ", "status", "seconds")

    def __init__(self, environ: dict, status: str, seconds: float):
        self.environ = environ
        self.status = status
        self.seconds = seconds

    def __str__(self) -> str:
        environ = self.environ
        # A request refused before the app ran (no work place) has no client key yet.
        client = environ.get("weir.client_key") or environ.get("REMOTE_ADDR", "-")
        origin = environ.get("weir.origin")
        return (
            f"{environ.get('REQUEST_METHOD')} {redacted_path(environ)} {self.status} "
            f"{self.seconds * 1000:.1f}ms {client}{f' origin={origin}' if origin else ''}"
        )


def log_request(environ: dict, status: str, seconds: float) -> None:
    """The request's line; the request ends here, and so does its id in later log lines."""
    if ACCESS_LOG.enabled():
        ACCESS_LOG.write(AccessLine(environ, status, seconds), environ.get("weir.request_id"))
    current_request_id.set(None)
