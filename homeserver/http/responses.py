"""Matrix JSON responses and error rendering for every listener."""

from __future__ import annotations

import logging

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from homeserver.core.errors import Codes, MatrixError
from homeserver.core.json_text import EncodedJson, encode, utf8

log = logging.getLogger(__name__)

# CORS headers the client-server spec asks every response to carry.
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "X-Requested-With, Content-Type, Authorization",
}
# As WSGI headers: added to every response as it starts (http/middleware.py).
CORS_HEADER_LIST = list(CORS_HEADERS.items())

_WERKZEUG_ERRCODES = {
    404: (Codes.UNRECOGNIZED, "Unrecognized request"),
    405: (Codes.UNRECOGNIZED, "Unrecognized request: method not allowed"),
    413: (Codes.TOO_LARGE, "Request body too large"),
}


def json_response(
    body: dict | list | EncodedJson, status: int = 200, headers: dict | None = None
) -> Response:
    text = body.text if isinstance(body, EncodedJson) else encode(body)
    return Response(utf8(text), status=status, headers=headers, mimetype="application/json")


def error_response(error: MatrixError) -> Response:
    return json_response(error.to_json(), error.status, error.headers)


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(MatrixError)
    def matrix_error(error: MatrixError):
        return error_response(error)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException):
        errcode, message = _WERKZEUG_ERRCODES.get(error.code or 500, (Codes.UNKNOWN, error.name))
        return error_response(MatrixError(error.code or 500, errcode, message))

    @app.errorhandler(Exception)
    def unexpected(error: Exception):
        # The traceback goes to the log, never to the client.
        log.exception("unhandled error")
        return error_response(MatrixError(500, Codes.UNKNOWN, "Internal server error"))
