"""Deadlines on reading a request (docs/architecture.md, "A request's path").

- The request head: the whole request line and headers within
  `server.http.request_head_timeout`, not each read (`HeadTimeout`, raised by the handler's
  timer; the connection gets a 408 and is closed).
- The body: `RequestBody` stands in for pywsgi's. Past the first BODY_GRACE_SECONDS it must
  keep up BODY_FLOOR_BYTES_PER_SECOND on average, or it is cut off with 408. A body that ends
  before its Content-Length, or a malformed chunk, is a 400. Either way the refusal is a
  Matrix error the app renders, with no traceback, and the connection closes after it, since
  the rest of the stream can no longer be trusted.
"""

from __future__ import annotations

import time

import gevent
from gevent.pywsgi import Input

from homeserver.core.errors import Codes, MatrixError
from homeserver.http.disconnect import ClientDisconnected

BODY_GRACE_SECONDS = 10.0
BODY_FLOOR_BYTES_PER_SECOND = 8 * 1024

_HEAD_TIMEOUT_JSON = b'{"errcode":"M_UNKNOWN","error":"Request head not received in time"}'
HEAD_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_HEAD_TIMEOUT_JSON), _HEAD_TIMEOUT_JSON)
)


class HeadTimeout(Exception):
    """The request line and headers took longer than request_head_timeout."""


class _TooSlow(Exception):
    pass


def body_too_slow() -> MatrixError:
    return MatrixError(408, Codes.UNKNOWN, "Request body arrived too slowly")


def body_malformed() -> MatrixError:
    return MatrixError(
        400, Codes.UNKNOWN, "Request body ended before its Content-Length, or a chunk is malformed"
    )


class RequestBody(Input):
    """pywsgi's request body, read against the floor; `failed` once a read was refused."""

    __slots__ = ("_started", "_received", "failed")

    def __init__(self, body: Input):
        super().__init__(
            body.rfile, body.content_length, socket=body.socket, chunked_input=body.chunked_input
        )
        self._started: float | None = None
        self._received = 0
        self.failed = False

    def read(self, length=None):
        return self._guarded(super().read, length)

    def readline(self, size=None):
        return self._guarded(super().readline, size)

    def _discard(self):
        # After the response: a refusal here only means the connection closes.
        if self.failed:
            return
        try:
            super()._discard()
        except MatrixError:
            pass

    def _guarded(self, read, size):
        if self.failed:
            raise body_malformed()
        now = time.monotonic()
        if self._started is None:
            self._started = now
        wanted = size if size is not None and size >= 0 else self._left()
        # The latest moment by which `wanted` more bytes keep the body above the floor.
        allowed = max(BODY_GRACE_SECONDS, (self._received + wanted) / BODY_FLOOR_BYTES_PER_SECOND)
        try:
            with gevent.Timeout(max(0.001, self._started + allowed - now), _TooSlow):
                data = read(size)
        except (_TooSlow, TimeoutError):  # the floor, or the socket's idle timeout
            self.failed = True
            raise body_too_slow() from None
        except ConnectionError:
            self.failed = True
            raise ClientDisconnected() from None
        except (OSError, ValueError):  # pywsgi: early end of file, a malformed chunk
            self.failed = True
            raise body_malformed() from None
        self._received += len(data)
        return data

    def _left(self) -> int:
        if self.chunked_input or self.content_length is None:
            return 64 * 1024
        return max(0, self.content_length - self.position)
