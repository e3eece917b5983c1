"""A push gateway on loopback (push gateway spec, `POST /_matrix/push/v1/notify`) that
records what it received, over real HTTP from the server under test in its own process.

    with PushGateway("127.40.70.1") as gateway:
        ... set a pusher with data.url = gateway.url ...
        notify = gateway.wait_for(lambda n: n["event_id"] == event_id)
        assert gateway.connections == 1

What it answers is set by `mode`: `ok` ({"rejected": []}), `failing` (503),
`rejecting` ({"rejected": [every pushkey it was sent]}), `holding` (waits for `release()`,
then 503). `notifications` holds the bodies it answered 200 to, in order; `arrived` every
body that reached it, whatever it answered.
"""

from __future__ import annotations

import json
import time

from gevent.event import Event
from gevent.pywsgi import WSGIServer

__all__ = ["PushGateway"]

NOTIFY = "/_matrix/push/v1/notify"


class _CountingServer(WSGIServer):
    def __init__(self, *args, on_connection, **kw):
        super().__init__(*args, **kw)
        self._on_connection = on_connection

    def handle(self, sock, address):
        self._on_connection()
        return super().handle(sock, address)


class PushGateway:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self.mode = "ok"
        self.connections = 0
        self.arrived: list[dict] = []  # every notification that reached it
        self.notifications: list[dict] = []  # those it answered 200 to
        self._release = Event()
        self._changed = Event()
        self._server: _CountingServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{NOTIFY}"

    def release(self) -> None:
        """Ends `holding`: what it holds is answered 503."""
        self._release.set()

    # -- what it saw --------------------------------------------------------------------

    def wait_until(self, predicate, timeout: float = 20) -> bool:
        end = time.monotonic() + timeout
        while not predicate():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    def wait_for(self, match, timeout: float = 20) -> dict:
        """The first notification answered 200 that `match`es, waiting for it."""
        found: list[dict] = []

        def seen() -> bool:
            found[:] = [n for n in self.notifications if match(n)]
            return bool(found)

        assert self.wait_until(seen, timeout), f"no such notification: {self.notifications}"
        return found[0]

    def count(self, event_id: str) -> int:
        return sum(1 for n in self.notifications if n.get("event_id") == event_id)

    # -- serving ------------------------------------------------------------------------

    def _changed_now(self) -> None:
        changed, self._changed = self._changed, Event()
        changed.set()

    def _connected(self) -> None:
        self.connections += 1
        self._changed_now()

    def _app(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = json.loads(environ["wsgi.input"].read(length) or b"{}")
        notification = body.get("notification", {})
        self.arrived.append(notification)
        self._changed_now()
        if environ["PATH_INFO"] != NOTIFY or environ["REQUEST_METHOD"] != "POST":
            start_response("404 Not Found", [("Content-Type", "application/json")])
            return [b'{"errcode":"M_UNRECOGNIZED"}']
        mode = self.mode  # as it was on arrival: a held notify is never answered 200
        if mode == "holding":
            self._release.wait()
        if mode in ("failing", "holding"):
            start_response("503 Service Unavailable", [("Content-Type", "application/json")])
            return [b"{}"]
        rejected = []
        if mode == "rejecting":
            rejected = [d["pushkey"] for d in notification.get("devices", [])]
        self.notifications.append(notification)
        self._changed_now()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"rejected": rejected}).encode()]

    def start(self) -> PushGateway:
        self._server = _CountingServer(
            (self.host, self.port),
            self._app,
            log=None,
            error_log=None,
            on_connection=self._connected,
        )
        self._server.start()
        self.port = self._server.server_port
        return self

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.stop(timeout=1)
            self._server = None

    def __enter__(self) -> PushGateway:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
