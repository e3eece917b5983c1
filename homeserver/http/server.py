"""The gevent server and its connection handler.

pywsgi serves each connection in one greenlet for its whole keep-alive life. That greenlet
lives in the server's waiting stage (`connections`, a pool of `max_connections`), and takes a
place in the work pool (`places`, http/places.py) only to run the application: an idle
connection, one reading a request head and a parked /sync hold no work place. The handler
adds what pywsgi lacks: TCP_NODELAY (without it every keep-alive response waits ~44 ms for a
delayed ACK), an idle timeout on keep-alive connections, a bounded TLS handshake, deadlines on
reading a request (http/reading.py), and a shutdown that lets a load balancer take the server
out before its listeners close.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from typing import Any

import gevent
from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer, format_date_time

from homeserver.http.access_log import log_request
from homeserver.http.handoff import HANDED_OFF
from homeserver.http.heads import read_head
from homeserver.http.later import end_unreturned
from homeserver.http.places import PLACES, WorkPlaces, WorkPool
from homeserver.http.reading import HEAD_TIMEOUT_RESPONSE, HeadTimeout, RequestBody
from homeserver.http.routing import routed_path

# pywsgi reads the rest of every request body after the response, to keep the connection in
# step. An unread rest up to DRAIN_MAX_BYTES (past the largest JSON body a route takes, 10 MiB
# for federation) is read, so an honest sender that sent a little too much keeps its
# connection. A larger or chunked rest closes the connection, and is read only LINGER_BYTES
# further: enough that a client which already sent it gets the response rather than a reset.
DRAIN_MAX_BYTES = 16 * 1024 * 1024
LINGER_BYTES = 1024 * 1024
LINGER_SECONDS = 2.0
# The read buffer every connection keeps for its whole life, idle and parked ones included
# (pywsgi's default is 8 KiB). A request head of a few hundred bytes to a few KiB takes one
# to a few reads at this size; a body larger than it is read straight past it.
READ_BUFFER_BYTES = 1024
# A response body up to this size goes out in the same send as the response head.
ONE_SEND_BODY_BYTES = 16 * 1024


class WeirHandler(WSGIHandler):
    """One client connection."""

    # pywsgi's (untyped) request body, None before a request is read; a _LingeringDiscard
    # once the connection is closing.
    wsgi_input: Any
    provided_date: Any  # pywsgi's: the app's own Date header, if it gave one
    # pywsgi's, of the request in hand; None between requests (_forget_request).
    environ: Any
    headers: Any
    response_headers: Any
    result: Any
    application: Any
    status: Any  # pywsgi's: the status line's bytes, or the text of a failed send
    code: Any  # pywsgi's: the status code, negated once a send failed
    # Set once the first request is read: every later one is a keep-alive request.
    _kept_alive = False
    # Runs from the first byte of a request head to its end (request_head_timeout).
    _head_timer: gevent.Timeout | None = None
    # Set while a request's response is made: its access log line is due.
    _responding = False
    # What ended a request before it had a status (a hang-up, a shutdown), for its log line.
    _ended_by: str | None = None

    def __init__(self, sock, address, server):
        super().__init__(sock, address, server, rfile=sock.makefile("rb", READ_BUFFER_BYTES))

    def handle(self):
        sock = self.socket
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Bounds every read of a request and the idle wait between keep-alive requests:
            # a silent client cannot hold a connection for longer.
            if isinstance(sock, ssl.SSLSocket):
                sock.settimeout(self.server.request_head_timeout)  # a handshake is a head
                sock.do_handshake()
            sock.settimeout(self.server.keepalive_timeout)
        except (OSError, ValueError):
            self._close_quietly()
            return
        super().handle()

    def _close_quietly(self):
        try:
            self.socket.close()
        except OSError:
            pass

    def _handle_client_error(self, ex):
        # http.client's "got more than 100 headers" is an HTTPException, not the ValueError
        # pywsgi takes for bad input: without this, each such request prints a traceback.
        if isinstance(ex, HeadTimeout):
            return ("408", HEAD_TIMEOUT_RESPONSE)
        if isinstance(ex, http.client.HTTPException):
            ex = ValueError(str(ex))
        return super()._handle_client_error(ex)

    def read_requestline(self):
        if self._kept_alive:
            # pywsgi reads a keep-alive request that has already arrived without going
            # through the hub, so a busy connection would be served run after run while
            # every other one waits. One turn of the hub first: each ready connection is
            # served once before any is served twice (docs/operations.md).
            gevent.sleep(0)
        else:
            self._kept_alive = True
        if self.server.closing:
            return ""
        # Idle until the first byte of the next request (or the keep-alive timeout): only
        # now may a shutdown, or a new connection at max_connections, close it. A request
        # already in the read buffer is never dropped: peek returns it without a switch.
        idle = self.server.idle_greenlets
        current = gevent.getcurrent()
        idle[current] = None  # last in order: the idle longest come first
        try:
            if not self.rfile.peek(1):
                return ""
        finally:
            idle.pop(current, None)
        self._head_timer = gevent.Timeout.start_new(self.server.request_head_timeout, HeadTimeout)
        try:
            return super().read_requestline()
        except HeadTimeout:
            self._send_head_timeout()
            return ""

    def MessageClass(self, fp, *args):
        # The header lines, without the email parser when they are plain (http/heads.py).
        return read_head(fp)

    def read_request(self, raw_requestline):
        try:
            return super().read_request(raw_requestline)
        finally:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.close()
            self._head_timer = None

    def _send_head_timeout(self) -> None:
        self._stop_head_timer()
        with gevent.Timeout(1.0, False):
            try:
                self.socket.sendall(HEAD_TIMEOUT_RESPONSE)
            except OSError:
                pass

    def get_environ(self):
        environ = super().get_environ()
        # Read against the floor; a short or malformed body is a 400, not a 500.
        self.wsgi_input = environ["wsgi.input"] = RequestBody(self.wsgi_input)
        # A parked /sync gives its work place back while it waits (http/places.py).
        environ[PLACES] = self.server.places
        # Handlers that wait on a remote peer watch this socket for the client hanging up.
        environ["weir.socket"] = self.socket
        # The request target as sent (PATH_INFO is decoded): federation signatures
        # cover it byte for byte.
        environ["weir.raw_uri"] = self.path
        # An escaped `/` (a room version 3 event ID's) must not split a route's segment.
        environ["PATH_INFO"] = routed_path(self.path.split("?", 1)[0])
        # Shutting down: /health answers 503 (HomeserverServer.stop).
        environ["weir.draining"] = self.server.draining
        return environ

    def start_response(self, status, headers, exc_info=None):
        # Shutting down, a response says that its connection ends with it: a proxy then
        # never sends another request on a connection that we are about to close.
        if (self.server.draining or _unread_rest_is_unbounded(self.wsgi_input)) and not any(
            name.lower() == "connection" for name, _ in headers
        ):
            headers = [*headers, ("Connection", "close")]
        return super().start_response(status, headers, exc_info)

    def finalize_headers(self):
        if self.provided_date is None:
            self.response_headers.append((b"Date", _http_date()))
            self.provided_date = True
        super().finalize_headers()

    def _write_with_headers(self, data):
        # pywsgi sends the head and the body apart: two syscalls, and two packets with
        # TCP_NODELAY, for every small answer. One send when the body is small.
        self.headers_sent = True
        self.finalize_headers()
        head = bytearray(b"HTTP/1.1 ")
        head += self.status
        head += b"\r\n"
        for header, value in self.response_headers:
            head += header
            head += b": "
            head += value
            head += b"\r\n"
        head += b"\r\n"
        if self.response_use_chunked or len(data) > ONE_SEND_BODY_BYTES:
            self._sendall(head)
            self._write(data)
        else:
            head += data
            self._sendall(head)

    def _sendall(self, data):
        # gevent's sendall asks the kernel for the send buffer's size (a getsockopt) before
        # every write, one syscall per response; one send usually takes all of it.
        if not data:
            return
        try:
            sent = self.socket.send(data)
            if sent < len(data):
                self.socket.sendall(memoryview(data)[sent:])
        except OSError as ex:
            # As pywsgi records a failed send: the log line shows the code negated.
            self.status = f"socket error: {ex}"
            if self.code > 0:
                self.code = -self.code
            raise
        self.response_length += len(data)

    def log_request(self):
        # pywsgi calls this once each response is done (or failed); its own line is replaced
        # by the access log's (http/access_log.py). A malformed head, refused by pywsgi
        # before there is a request, has no line, as it never reached the application.
        if not self._responding:
            return
        self._responding = False
        # (A failed send leaves the code negated.)
        status = str(abs(self.code)) if self.status else self._ended_by or "-"
        self._ended_by = None
        log_request(self.environ, status, self.time_finish - self.time_start)

    def handle_error(self, t, v, tb):
        if issubclass(t, gevent.GreenletExit):
            # The client hung up mid-request (ClientDisconnected) or we are shutting down:
            # there is nobody to send a 500 to, and nothing went wrong on our side. The
            # access log names what ended the request.
            self.close_connection = True
            self._ended_by = t.__name__
            return
        super().handle_error(t, v, tb)

    def handle_one_request(self):
        try:
            result = super().handle_one_request()
        except BaseException:
            self._come_back_from_handoff(keep_alive=False)
            raise
        finally:
            self._stop_head_timer()  # a head refused before read_request (414, empty)
        if result is True and (self.server.closing or _failed(self.wsgi_input)):
            result = None  # finish the response in hand, then close instead of keeping alive
        if not self._come_back_from_handoff(keep_alive=result is True):
            return None
        if result is True:
            self._forget_request()
        return result

    def _forget_request(self) -> None:
        """Between keep-alive requests: the connection keeps nothing of its last request
        (pywsgi would keep its environ, head, body reader and response head until the next
        one). Most connections are idle most of the time, and each of them would hold all
        of that for the collector to walk."""
        self.environ = self.headers = self.wsgi_input = None
        self.response_headers = self.result = self.application = None

    def handle_one_response(self):
        # A work place only to run the application; given back once the response is written.
        places = self.server.places
        self._responding = True
        if not places.take():
            self.application = _busy
        try:
            super().handle_one_response()
        finally:
            places.give_back()

    def _come_back_from_handoff(self, keep_alive: bool) -> bool:
        """After a response: a request that was handed off to the media pool frees its slot
        and rejoins the main pool, or its connection is closed (http/handoff.py)."""
        environ = getattr(self, "environ", None)
        handed_off = environ.pop(HANDED_OFF, None) if environ else None
        if handed_off is None:
            return True
        return handed_off.come_back(keep_alive)

    def run_application(self):
        try:
            super().run_application()
        finally:
            end_unreturned(self.environ)
            if self.close_connection and self.wsgi_input is not None:
                self.wsgi_input = _LingeringDiscard(self.wsgi_input)


def _failed(body) -> bool:
    return bool(getattr(body, "failed", False))


_BUSY_JSON = b'{"errcode":"M_UNKNOWN","error":"The server is busy; try again shortly"}'


def _busy(environ, start_response):
    """The answer when no work place came in time (http/places.py)."""
    start_response(
        "503 Service Unavailable",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(_BUSY_JSON))),
            ("Retry-After", "1"),
            ("Connection", "close"),
        ],
    )
    return [_BUSY_JSON]


def _unread_rest_is_unbounded(body) -> bool:
    """Whether what the app left unread of the request body is too much to drain: over
    DRAIN_MAX_BYTES, or chunked and not yet at its last chunk (its size is unknown); or the
    body failed (http/reading.py) and the stream can no longer be trusted."""
    if body is None:
        return False
    if _failed(body):
        return True
    if body.chunked_input:
        return body.chunk_length != 0
    return (body.content_length or 0) - body.position > DRAIN_MAX_BYTES


class _LingeringDiscard:
    """Stands in for the request body once the connection is closing: pywsgi's discard of
    the unread rest stops after LINGER_BYTES or LINGER_SECONDS."""

    def __init__(self, body):
        self._body = body

    def _discard(self):
        if _failed(self._body):
            return
        left = LINGER_BYTES
        with gevent.Timeout(LINGER_SECONDS, False):
            while left > 0:
                data = self._body.read(min(16384, left))
                if not data:
                    return
                left -= len(data)


class WeirWSGIServer(WSGIServer):
    """`pool` is the work pool; connections wait in `connections`, of `max_connections`.

    At `max_connections`, the connection idle longest (a keep-alive waiting for its next
    request, or one that never sent its first) is closed to make room, as nginx does: the
    accept loop would otherwise pause until one closed by itself, and a new client, a load
    balancer's /health check included, would wait unanswered for up to the keep-alive
    timeout. A request in progress and a parked /sync are never idle, so never closed. With
    no idle connection at all the loop pauses, and resumes as soon as one ends."""

    handler_class = WeirHandler

    def __init__(
        self,
        listener,
        application,
        *,
        pool: WorkPool,
        keepalive_timeout: float,
        max_connections: int = 10_000,
        request_head_timeout: float = 10.0,
        **ssl_args,
    ):
        if ssl_args:
            # The handshake runs in the handler, under the head timeout, not in the accept loop.
            ssl_args["do_handshake_on_connect"] = False
        self.connections = Pool(max_connections)
        super().__init__(listener, application, spawn=self.connections, log=None, **ssl_args)
        self.full = self._full_unless_room_is_made  # gevent set it to the pool's own full
        self.idle_closed = 0  # idle connections closed to make room
        self.places = WorkPlaces(pool)
        self.keepalive_timeout = keepalive_timeout
        self.request_head_timeout = request_head_timeout
        # Greenlets of idle connections, in the order they became idle (a dict keeps it).
        self.idle_greenlets: dict[gevent.Greenlet, None] = {}
        self.draining = False  # stopping: /health is 503, responses close their connection
        self.closing = False  # stopped accepting: idle connections are closed

    def _full_unless_room_is_made(self) -> bool:
        """Asked by the accept loop before each accept. Full, the connection idle longest is
        told to close; the loop pauses until a place is free (gevent resumes it then), which
        is as soon as that connection's greenlet has ended."""
        if not self.connections.full():
            return False
        if self.closing or not self.idle_greenlets:
            return True
        oldest = next(iter(self.idle_greenlets))
        del self.idle_greenlets[oldest]  # told once; it leaves the pool when it ends
        oldest.kill(block=False)
        self.idle_closed += 1
        return True


_date: list = [0, b""]  # (second, its Date header value)


def _http_date() -> bytes:
    """The Date header, formatted once a second rather than for every response."""
    now = int(time.time())
    if now != _date[0]:
        _date[:] = [now, format_date_time(now)]
    return _date[1]
