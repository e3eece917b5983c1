"""IPC between main and the federation worker shards: length-prefixed frames over a Unix
socket in ``data_dir``.

A frame is a 13-byte header, then a body::

    length (4 bytes) | type (1 byte) | request id (8 bytes) | body (length bytes)

big-endian; the body is a JSON object in UTF-8, at most ``MAX_FRAME_BYTES``. A request has
one of the ``FrameType`` values; its reply has the same request id and the type with the
``REPLY`` bit set, or is an ``ERROR`` frame (``{"error": ...}``) when the request could not
be handled at all. Either end may send requests.

Bad frames (too large, a body that is not a JSON object, an unknown type, a reply nobody
waits for) are logged and dropped, and a bad request is answered with ``ERROR`` so its
sender does not wait in vain; the connection carries on. Only the end of the stream ends it.
"""

from __future__ import annotations

import enum
import itertools
import json
import logging
import os
import socket
import struct
from typing import Callable

import gevent
from gevent.event import AsyncResult
from gevent.lock import Semaphore

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IBQ")
# The largest body: a relayed transaction is at most 50 PDUs of 64 KiB, with room to spare.
MAX_FRAME_BYTES = 16 * 1024 * 1024
REPLY = 0x80
ERROR = 0xFF
_READ_CHUNK = 1024 * 1024


class FrameType(enum.IntEnum):
    HELLO = 1  # shard -> main, once connected and serving: {"shard", "pid"}
    HEALTH = 2  # main -> shard: liveness; the reply carries the shard's figures
    RELAY = 3  # shard -> main: a transaction's checked PDUs; the reply is the answer
    MEMBERSHIP = 4  # shard -> main: a send_join/leave/knock or invite; the reply is the answer


class IpcError(Exception):
    """A request got no usable answer: the connection is gone, the wait timed out, or the
    other end answered ERROR."""


# handler(connection, body) -> reply body
Handler = Callable[["FrameConnection", dict], dict]


def encode_frame(frame_type: int, request_id: int, body: dict) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise IpcError(f"frame body of {len(data)} bytes is over {MAX_FRAME_BYTES}")
    return HEADER.pack(len(data), frame_type, request_id) + data


class FrameConnection:
    """One end of a connection: sends requests and waits for their replies, and answers the
    other end's requests with ``handlers`` (one greenlet per request)."""

    def __init__(
        self,
        sock: socket.socket,
        handlers: dict[int, Handler],
        name: str,
        on_close: Callable[["FrameConnection"], None] | None = None,
    ):
        self.sock = sock
        self.handlers = handlers
        self.name = name
        self.on_close = on_close
        self.closed = False
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, AsyncResult]] = {}
        self._write_lock = Semaphore()
        self._reader: gevent.Greenlet | None = None

    def start(self) -> FrameConnection:
        self._reader = gevent.spawn(self._read_loop)
        return self

    # -- requests --------------------------------------------------------------------------

    def request(self, frame_type: int, body: dict, timeout: float) -> dict:
        """Sends a request and returns the reply's body. Raises ``IpcError``."""
        if self.closed:
            raise IpcError(f"connection to {self.name} is closed")
        request_id = next(self._ids)
        result = AsyncResult()
        self._pending[request_id] = (frame_type, result)
        try:
            self._send(encode_frame(frame_type, request_id, body))
            result.wait(timeout)
            if not result.ready():
                raise IpcError(f"no answer from {self.name} within {timeout:.0f}s")
            return result.get()
        finally:
            self._pending.pop(request_id, None)

    def send_raw(self, data: bytes) -> None:
        """Writes bytes as they are (tests use it to send bad frames)."""
        self._send(data)

    def _send(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                self.close()
                raise IpcError(f"connection to {self.name} lost: {e}") from None
            except BaseException:
                # Stopped midway (GreenletExit on shutdown, a Timeout): part of a frame may be
                # out, and the next frame would be read as the rest of it. The stream is out of
                # step for good, so end it; the other end's waiting requests fail at once.
                self.close()
                raise

    # -- reading ---------------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            while True:
                header = self._read_exactly(HEADER.size)
                if header is None:
                    return
                length, frame_type, request_id = HEADER.unpack(header)
                if length > MAX_FRAME_BYTES:
                    log.warning(
                        "ipc %s: dropping a frame of %d bytes (over %d)",
                        self.name,
                        length,
                        MAX_FRAME_BYTES,
                    )
                    if not self._skip(length):
                        return
                    self._refuse(frame_type, request_id, "frame too large")
                    continue
                data = self._read_exactly(length)
                if data is None:
                    return
                try:
                    body = json.loads(data)
                    if not isinstance(body, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    log.warning(
                        "ipc %s: dropping a frame whose body is not a JSON object (%s)",
                        self.name,
                        e,
                    )
                    self._refuse(frame_type, request_id, "body is not a JSON object")
                    continue
                self._dispatch(frame_type, request_id, body)
        except OSError as e:
            log.info("ipc %s: connection lost: %s", self.name, e)
        finally:
            self.close()

    def _read_exactly(self, n: int) -> bytes | None:
        """``n`` bytes, or None at the end of the stream."""
        chunks: list[bytes] = []
        left = n
        while left:
            chunk = self.sock.recv(min(left, _READ_CHUNK))
            if not chunk:
                if chunks:
                    log.warning("ipc %s: stream ended inside a frame", self.name)
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _skip(self, n: int) -> bool:
        while n:
            chunk = self.sock.recv(min(n, _READ_CHUNK))
            if not chunk:
                return False
            n -= len(chunk)
        return True

    def _dispatch(self, frame_type: int, request_id: int, body: dict) -> None:
        if frame_type & REPLY:
            waiting = self._pending.get(request_id)
            if waiting is None:
                log.warning("ipc %s: dropping a reply to unknown request %d", self.name, request_id)
                return
            sent_type, result = waiting
            if frame_type == ERROR:
                result.set_exception(IpcError(f"{self.name}: {body.get('error')}"))
            elif frame_type != sent_type | REPLY:
                result.set_exception(IpcError(f"{self.name}: reply of type {frame_type}"))
            else:
                result.set(body)
            return
        handler = self.handlers.get(frame_type)
        if handler is None:
            log.warning("ipc %s: dropping a request of unknown type %d", self.name, frame_type)
            self._reply(ERROR, request_id, {"error": f"unknown frame type {frame_type}"})
            return
        gevent.spawn(self._answer, handler, frame_type, request_id, body)

    def _answer(self, handler: Handler, frame_type: int, request_id: int, body: dict) -> None:
        try:
            reply = handler(self, body)
        except Exception as e:
            log.exception("ipc %s: handling a request of type %d failed", self.name, frame_type)
            self._reply(ERROR, request_id, {"error": f"{type(e).__name__}: {e}"})
            return
        self._reply(frame_type | REPLY, request_id, reply)

    def _refuse(self, frame_type: int, request_id: int, error: str) -> None:
        if frame_type & REPLY:
            waiting = self._pending.get(request_id)
            if waiting is not None:
                waiting[1].set_exception(IpcError(f"{self.name}: bad reply: {error}"))
        else:
            self._reply(ERROR, request_id, {"error": error})

    def _reply(self, frame_type: int, request_id: int, body: dict) -> None:
        try:
            self._send(encode_frame(frame_type, request_id, body))
        except IpcError as e:
            log.info("ipc %s: reply not sent: %s", self.name, e)

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the socket; every request still waiting fails. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._reader is not None and self._reader is not gevent.getcurrent():
            self._reader.kill(block=False)
        try:
            self.sock.close()
        except OSError:
            pass
        for _, result in list(self._pending.values()):
            result.set_exception(IpcError(f"connection to {self.name} lost"))
        if self.on_close is not None:
            self.on_close(self)


class IpcServer:
    """Main's end: a Unix socket in a directory only our user may enter."""

    def __init__(
        self,
        path: str,
        handlers: dict[int, Handler],
        on_close: Callable[[FrameConnection], None] | None = None,
    ):
        self.path = path
        self.handlers = handlers
        self.on_close = on_close
        self.connections: set[FrameConnection] = set()
        self._sock: socket.socket | None = None
        self._acceptor: gevent.Greenlet | None = None

    def start(self) -> IpcServer:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        if os.path.exists(self.path):
            if _answers(self.path):
                raise RuntimeError(
                    f"another server is serving {self.path}: one data_dir, one server"
                )
            os.unlink(self.path)  # left by a main that did not stop cleanly
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen(64)
        self._sock = sock
        self._acceptor = gevent.spawn(self._accept_loop, sock)
        return self

    def _accept_loop(self, sock: socket.socket) -> None:
        n = 0
        while True:
            conn, _ = sock.accept()
            n += 1
            connection = FrameConnection(conn, self.handlers, f"shard connection {n}", self._closed)
            self.connections.add(connection)
            connection.start()

    def _closed(self, connection: FrameConnection) -> None:
        self.connections.discard(connection)
        if self.on_close is not None:
            self.on_close(connection)

    def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.kill()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for connection in list(self.connections):
            connection.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def connect(
    path: str,
    handlers: dict[int, Handler],
    name: str = "main",
    on_close: Callable[[FrameConnection], None] | None = None,
) -> FrameConnection:
    """A shard's end: connects to main's socket. Raises OSError."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return FrameConnection(sock, handlers, name, on_close).start()
