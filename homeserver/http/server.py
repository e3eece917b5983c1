"""The gevent servers: the client and federation listeners, their pools and the handler.

pywsgi serves each connection in one greenlet for its whole keep-alive life, so a pool
counts connections, not requests. The handler adds what pywsgi lacks: TCP_NODELAY (without
it every keep-alive response waits ~44 ms for a delayed ACK), an idle timeout on keep-alive
connections, a bounded TLS handshake, and a shutdown that lets a load balancer take the
server out before its listeners close.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time

import gevent
from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer

from .app import CLIENT, FEDERATION, create_flask_app
from .handoff import HANDED_OFF

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0

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

    def read_requestline(self):
        # Between requests the connection is idle: a shutdown may close it at once.
        idle = self.server.idle_greenlets
        current = gevent.getcurrent()
        idle.add(current)
        try:
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
                name.lower() == "connection" for name, _ in headers):
            headers = [*headers, ("Connection", "close")]
        return super().start_response(status, headers, exc_info)

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

    def __init__(self, listener, application, *, pool: Pool, keepalive_timeout: float,
                 **ssl_args):
        if ssl_args:
            # The handshake runs in the handler, under the idle timeout, not in the accept loop.
            ssl_args["do_handshake_on_connect"] = False
        super().__init__(listener, application, spawn=pool, log=None, **ssl_args)
        self.keepalive_timeout = keepalive_timeout
        self.idle_greenlets: set = set()
        self.draining = False  # stopping: /health is 503, responses close their connection
        self.closing = False  # stopped accepting: idle connections are closed


class HomeserverServer:
    """The listeners of one process, started and stopped together: both, or only the client
    one (main, when worker shards serve federation), or only the federation one (a shard,
    on the listening socket main bound and handed down as `federation_listener`)."""

    def __init__(self, runtime, federation_listener=None,
                 listeners: tuple[str, ...] = (CLIENT, FEDERATION)):
        self.runtime = runtime
        config = runtime.config
        http = config.server.http
        fed = config.federation
        self.servers = []

        if CLIENT in listeners:
            self.client_app = create_flask_app(runtime, (CLIENT,))
            self.client_server = WeirWSGIServer(
                (http.bind_address, http.port), self.client_app, pool=runtime.main_pool,
                keepalive_timeout=http.keepalive_timeout)
            self.servers.append(self.client_server)

        if FEDERATION in listeners:
            self.federation_pool = Pool(http.main_pool_size)
            runtime.metrics.track_pool("federation", self.federation_pool, http.main_pool_size)
            ssl_args = {}
            if fed.tls_certificate:
                ssl_args = {"certfile": fed.tls_certificate, "keyfile": fed.tls_private_key}
            self.federation_app = create_flask_app(runtime, (FEDERATION,))
            self.federation_server = WeirWSGIServer(
                federation_listener or (fed.bind_address, fed.port), self.federation_app,
                pool=self.federation_pool, keepalive_timeout=http.keepalive_timeout, **ssl_args)
            self.servers.append(self.federation_server)

    @property
    def client_url(self) -> str:
        host, port = self.client_server.address[:2]
        return f"http://{host}:{port}"

    @property
    def federation_url(self) -> str:
        host, port = self.federation_server.address[:2]
        scheme = "https" if self.federation_server.ssl_enabled else "http"
        return f"{scheme}://{host}:{port}"

    def start(self) -> None:
        """Starts every listener, or none: raises RuntimeError naming the address that
        cannot be bound (in use, not ours), after stopping any already started."""
        for i, server in enumerate(self.servers):
            try:
                server.start()
            except OSError as e:
                for started in self.servers[:i]:
                    started.stop(timeout=0)
                host, port = server.address[:2]
                raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror}") from None

    def stop(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """Drains, stops accepting, lets in-flight requests finish within `grace`, then kills
        the rest.

        Draining comes first: for `server.http.shutdown_drain_delay` seconds every request is
        still served, but /health answers 503 and every response closes its connection, so
        that a load balancer checking /health marks the server down and stops sending to it.
        Only then do the listeners and idle connections close. Closing them while the
        balancer still sends would lose requests: a connection waiting in the accept queue is
        reset when its listener closes, and an idle keep-alive connection that we close may
        cross a request the balancer has just sent on it.
        """
        for server in self.servers:
            server.draining = True
        drain = self.runtime.config.server.http.shutdown_drain_delay
        if drain > 0:
            log.info("shutdown: /health answers 503; listeners close in %.1fs", drain)
            gevent.sleep(drain)  # the balancer's time to see it, as configured
        deadline = time.monotonic() + grace
        handoff = self.runtime.media_handoff  # None in a shard, which serves no media
        if handoff is not None:
            handoff.stop()  # a remote media request handed off from now on answers 503
        for server in self.servers:
            server.closing = True
            server.close()  # stop accepting; the listening socket is closed
            for greenlet in list(server.idle_greenlets):
                greenlet.kill(block=False)
        # Waiting syncs answer now (empty) rather than hold the shutdown to their timeout.
        self.runtime.notifier.close()
        # Connections handed off to the media pool are in none of the servers' pools.
        pools = [s.pool for s in self.servers] + ([handoff.away] if handoff is not None else [])
        for pool in pools:
            pool.join(timeout=max(0.0, deadline - time.monotonic()))
        for pool in pools:
            if len(pool):
                log.warning("shutdown: %d requests still running after %.0fs; stopping them",
                            len(pool), grace)
                pool.kill(timeout=1)
