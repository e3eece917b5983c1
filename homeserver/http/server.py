"""The gevent server and its connection handler.

pywsgi serves each connection in one greenlet for its whole keep-alive life, so a pool
counts connections, not requests. The handler adds what pywsgi lacks: TCP_NODELAY (without
it every keep-alive response waits ~44 ms for a delayed ACK), an idle timeout on keep-alive
connections, a bounded TLS handshake, and a shutdown that lets a load balancer take the
server out before its listeners close.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from typing import Any

import gevent
from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer

from homeserver.http.handoff import HANDED_OFF

# pywsgi reads the rest of every request body after the response, to keep the connection in
# step. An unread rest up to DRAIN_MAX_BYTES (past the largest JSON body a route takes, 10 MiB
# for federation) is read, so an honest sender that sent a little too much keeps its
# connection. A larger or chunked rest closes the connection, and is read only LINGER_BYTES
# further: enough that a client which already sent it gets the response rather than a reset.
DRAIN_MAX_BYTES = 16 * 1024 * 1024
LINGER_BYTES = 1024 * 1024
LINGER_SECONDS = 2.0


class WeirHandler(WSGIHandler):
    """One client connection."""

    # pywsgi's (untyped) request body, None before a request is read; a _LingeringDiscard
    # once the connection is closing.
    wsgi_input: Any
    # Set once the first request is read: every later one is a keep-alive request.
    _kept_alive = False

    def handle(self):
        sock = self.socket
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Bounds the TLS handshake, every read of a request, and the idle wait between
            # keep-alive requests: a silent client cannot hold a pool greenlet for longer.
            sock.settimeout(self.server.keepalive_timeout)
            if isinstance(sock, ssl.SSLSocket):
                sock.do_handshake()
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
        if isinstance(ex, http.client.HTTPException):
            ex = ValueError(str(ex))
        return super()._handle_client_error(ex)

    def read_requestline(self):
        # Between requests the connection is idle: a shutdown may close it at once.
        idle = self.server.idle_greenlets
        current = gevent.getcurrent()
        idle.add(current)
        try:
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
            return super().read_requestline()
        finally:
            idle.discard(current)

    def get_environ(self):
        environ = super().get_environ()
        # Handlers that wait on a remote peer watch this socket for the client hanging up.
        environ["weir.socket"] = self.socket
        # The request target as sent (PATH_INFO is percent-decoded): federation signatures
        # cover it byte for byte.
        environ["weir.raw_uri"] = self.path
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

    def log_request(self):
        # pywsgi formats a line per request for its own log, which Weir turns off (log=None);
        # the access log is http/middleware.py's.
        pass

    def handle_error(self, t, v, tb):
        if issubclass(t, gevent.GreenletExit):
            # The client hung up mid-request (ClientDisconnected) or we are shutting down:
            # there is nobody to send a 500 to, and nothing went wrong on our side.
            self.close_connection = True
            return
        super().handle_error(t, v, tb)

    def handle_one_request(self):
        try:
            result = super().handle_one_request()
        except BaseException:
            self._come_back_from_handoff(keep_alive=False)
            raise
        if result is True and self.server.closing:
            result = None  # finish the response in hand, then close instead of keeping alive
        if not self._come_back_from_handoff(keep_alive=result is True):
            return None
        return result

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
            if self.close_connection and self.wsgi_input is not None:
                self.wsgi_input = _LingeringDiscard(self.wsgi_input)


def _unread_rest_is_unbounded(body) -> bool:
    """Whether what the app left unread of the request body is too much to drain: over
    DRAIN_MAX_BYTES, or chunked and not yet at its last chunk (its size is unknown)."""
    if body is None:
        return False
    if body.chunked_input:
        return body.chunk_length != 0
    return (body.content_length or 0) - body.position > DRAIN_MAX_BYTES


class _LingeringDiscard:
    """Stands in for the request body once the connection is closing: pywsgi's discard of
    the unread rest stops after LINGER_BYTES or LINGER_SECONDS."""

    def __init__(self, body):
        self._body = body

    def _discard(self):
        left = LINGER_BYTES
        with gevent.Timeout(LINGER_SECONDS, False):
            while left > 0:
                data = self._body.read(min(16384, left))
                if not data:
                    return
                left -= len(data)


class WeirWSGIServer(WSGIServer):
    handler_class = WeirHandler

    def __init__(self, listener, application, *, pool: Pool, keepalive_timeout: float, **ssl_args):
        if ssl_args:
            # The handshake runs in the handler, under the idle timeout, not in the accept loop.
            ssl_args["do_handshake_on_connect"] = False
        super().__init__(listener, application, spawn=pool, log=None, **ssl_args)
        self.keepalive_timeout = keepalive_timeout
        self.idle_greenlets: set = set()
        self.draining = False  # stopping: /health is 503, responses close their connection
        self.closing = False  # stopped accepting: idle connections are closed
