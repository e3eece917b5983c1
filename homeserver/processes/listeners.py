"""The listeners of one process: the client and federation WSGI servers over one runtime,
started together and stopped together with a bounded drain."""

from __future__ import annotations

import logging
import time

import gevent

from homeserver.api.app import CLIENT, FEDERATION, create_flask_app
from homeserver.http.places import WorkPool
from homeserver.http.server import WeirWSGIServer

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 10.0


class HomeserverServer:
    """The listeners of one process, started and stopped together: both, or only the client
    one (main, when worker shards serve federation), or only the federation one (a shard,
    on the listening socket main bound and handed down as `federation_listener`)."""

    def __init__(
        self, runtime, federation_listener=None, listeners: tuple[str, ...] = (CLIENT, FEDERATION)
    ):
        self.runtime = runtime
        config = runtime.config
        http = config.server.http
        fed = config.federation
        self.servers = []

        if CLIENT in listeners:
            self.client_app = create_flask_app(runtime, (CLIENT,))
            self.client_server = WeirWSGIServer(
                (http.bind_address, http.port),
                self.client_app,
                pool=runtime.main_pool,
                keepalive_timeout=http.keepalive_timeout,
                max_connections=http.max_connections,
                request_head_timeout=http.request_head_timeout,
            )
            self._track(runtime.metrics, "client", self.client_server, "main")
            self.servers.append(self.client_server)

        if FEDERATION in listeners:
            self.federation_pool = WorkPool(http.main_pool_size)
            runtime.metrics.track_pool("federation", self.federation_pool, http.main_pool_size)
            ssl_args = {}
            if fed.tls_certificate:
                ssl_args = {"certfile": fed.tls_certificate, "keyfile": fed.tls_private_key}
            self.federation_app = create_flask_app(runtime, (FEDERATION,))
            self.federation_server = WeirWSGIServer(
                federation_listener or (fed.bind_address, fed.port),
                self.federation_app,
                pool=self.federation_pool,
                keepalive_timeout=http.keepalive_timeout,
                max_connections=http.max_connections,
                request_head_timeout=http.request_head_timeout,
                **ssl_args,
            )
            self._track(runtime.metrics, "federation", self.federation_server, "federation")
            self.servers.append(self.federation_server)

    @staticmethod
    def _track(metrics, listener: str, server: WeirWSGIServer, pool: str) -> None:
        size = server.connections.size or 0
        metrics.track_pool(f"{listener}_connections", server.connections, size)
        metrics.track_counter(
            f"weir_{listener}_idle_connections_closed",
            "Idle keep-alive connections closed to make room at max_connections",
            lambda: server.idle_closed,
        )
        metrics.track_pool_waits(pool, server.places)

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
        # Every connection, handed off or parked, is in its server's waiting stage.
        pools = [s.pool for s in self.servers]
        for pool in pools:
            pool.join(timeout=max(0.0, deadline - time.monotonic()))
        for pool in pools:
            if len(pool):
                log.warning(
                    "shutdown: %d requests still running after %.0fs; stopping them",
                    len(pool),
                    grace,
                )
                pool.kill(timeout=1)
