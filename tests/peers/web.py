"""A plain web site on loopback, for link previews: pages, images, redirects, a page that
answers only when the test lets it, and one of a gigabyte streamed lazily that notices the
reader hanging up.

It runs as greenlets in the test process (gevent's WSGI server), so the server under test,
in its own process, fetches from it over real HTTP. Every request is recorded:

    with WebSite("127.40.62.1") as site:
        site.page("/og", html)
        site.redirect("/away", "http://127.40.62.2:8080/")
        ... preview site.url("/og") ...
        assert site.count("/og") == 1
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from gevent.event import Event
from gevent.pywsgi import WSGIServer

__all__ = ["WebSite", "EndlessPage"]

CHUNK = 64 * 1024


class EndlessPage:
    """`total` bytes of HTML, made a chunk at a time as the reader takes them: a gigabyte
    costs nothing unless read. `sent` counts what went out; `hung_up` is set once the
    reader closed the connection before the end."""

    def __init__(self, total: int, head: bytes = b"<html><head><title>Endless</title></head>"):
        self.total = total
        self.head = head
        self.sent = 0
        self.hung_up = Event()
        self.finished = Event()

    def __call__(self, environ) -> tuple[str, list, Iterable[bytes]]:
        headers = [("Content-Type", "text/html"), ("Content-Length", str(self.total))]
        return "200 OK", headers, self._body()

    def _body(self) -> Iterable[bytes]:
        filler = b"<p>" + b"x" * (CHUNK - 7) + b"</p>\n"
        try:
            yield self.head
            self.sent += len(self.head)
            while self.sent < self.total:
                piece = filler[: self.total - self.sent]
                yield piece
                self.sent += len(piece)
            self.finished.set()
        finally:
            if not self.finished.is_set():
                self.hung_up.set()


class WebSite:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, ssl_context=None):
        self.host = host
        self.port = port
        self.ssl_context = ssl_context  # serves https with it when given
        self.requests: list[tuple[str, str]] = []  # (path, Host header), in arrival order
        self._handlers: dict[str, Callable] = {}
        self._changed = Event()
        self._server: WSGIServer | None = None

    # -- what it serves -----------------------------------------------------------------

    def handle(self, path: str, handler: Callable) -> None:
        """handler(environ) -> (status line, headers, body iterable)."""
        self._handlers[path] = handler

    def page(self, path: str, body: bytes, content_type: str = "text/html; charset=utf-8"):
        self.handle(path, lambda environ: ("200 OK", [("Content-Type", content_type)], [body]))

    def redirect(self, path: str, location: str, status: str = "302 Found") -> None:
        self.handle(path, lambda environ: (status, [("Location", location)], [b""]))

    def gated(self, path: str, body: bytes) -> Event:
        """A page answered only once the returned event is set."""
        gate = Event()

        def handler(environ):
            gate.wait()
            return "200 OK", [("Content-Type", "text/html")], [body]

        self.handle(path, handler)
        return gate

    # -- what it saw --------------------------------------------------------------------

    def count(self, path: str) -> int:
        return sum(1 for seen, _ in self.requests if seen == path)

    def wait_count(self, path: str, n: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while self.count(path) < n:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    # -- serving ------------------------------------------------------------------------

    def _app(self, environ, start_response):
        path = environ["PATH_INFO"]
        self.requests.append((path, environ.get("HTTP_HOST", "")))
        changed, self._changed = self._changed, Event()
        changed.set()
        handler = self._handlers.get(path)
        if handler is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not here"]
        status, headers, body = handler(environ)
        start_response(status, headers)
        return body

    def start(self) -> WebSite:
        tls = {"ssl_context": self.ssl_context} if self.ssl_context is not None else {}
        self._server = WSGIServer(
            (self.host, self.port), self._app, log=None, error_log=None, **tls
        )
        self._server.start()
        self.port = self._server.server_port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(timeout=1)
            self._server = None

    def __enter__(self) -> WebSite:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
