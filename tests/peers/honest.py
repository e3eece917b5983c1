"""An honest federation peer over TLS, run as greenlets in the test process.

It has its own ed25519 signing key and serves ``/_matrix/key/v2/server`` with it. It records
every request it sees (method, raw target, Host header, the SNI the client sent, headers,
body), counts hits per path, can answer slowly (``latency``), and takes route hooks so tests
and later issues add endpoints (public rooms, directory queries, multipart media). It can also
sign requests as its own server name, to act as a "fake origin" calling us.

    peer = HonestPeer("peer.test", test_ca, host="127.10.0.1", port=8448).start()
    peer.route("GET", "/_matrix/federation/v1/publicRooms",
               lambda req: (200, {"chunk": []}))
    header = peer.sign_request("weir.test", "GET", "/_matrix/federation/v1/query/profile?...")
    assert peer.hits("/_matrix/key/v2/server") == 1
    assert peer.requests[-1].sni == "peer.test"

A handler gets a :class:`SeenRequest` and returns ``(status, body)`` or
``(status, body, headers)``; a dict or list body is sent as JSON, bytes as they are (with a
Content-Length), and any other iterable of bytes chunked.
"""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import gevent
from gevent.event import Event
from gevent.pool import Pool
from gevent.pywsgi import WSGIHandler, WSGIServer
from signedjson.key import encode_verify_key_base64, generate_signing_key, get_verify_key
from signedjson.sign import sign_json

from homeserver.federation.signing import sign_request

__all__ = ["HonestPeer", "SeenRequest"]


@dataclass
class SeenRequest:
    method: str
    path: str            # PATH_INFO (decoded)
    target: str          # the raw request target, as sent
    query: str
    host: str | None     # the Host header
    sni: str | None      # the TLS server name the client sent (None: no SNI)
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    client: tuple = ()   # (address, port) the request came from

    def json(self):
        return json.loads(self.body) if self.body else None


Handler = Callable[[SeenRequest], tuple]


class _RecordingHandler(WSGIHandler):
    def get_environ(self):
        env = super().get_environ()
        env["peer.target"] = self.path
        env["peer.sni"] = self.server.peer._sni.get(self.socket)
        return env


class HonestPeer:
    def __init__(self, server_name: str, ca, host: str = "127.0.0.1", port: int = 8448, *,
                 cert_names: tuple[str, ...] | None = None, latency: float = 0.0,
                 key_version: str = "a_peer"):
        self.server_name = server_name
        self.ca = ca
        self.host = host
        self.port = port
        # Names the certificate is valid for: by default the server name's host and our IP.
        self.cert_names = cert_names or (server_name.rsplit(":", 1)[0].strip("[]"), host)
        self.latency = latency
        self.signing_key = generate_signing_key(key_version)
        self.key_valid_for_ms = 24 * 3600 * 1000
        self.old_verify_keys: dict = {}
        self.requests: list[SeenRequest] = []
        self._routes: dict[tuple[str, str], Handler] = {}
        self._prefix_routes: list[tuple[str, str, Handler]] = []
        self._sni: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._changed = Event()
        self._server: WSGIServer | None = None
        self.route("GET", "/_matrix/key/v2/server", lambda req: (200, self.key_document()))

    # -- identity --------------------------------------------------------------------------

    @property
    def key_id(self) -> str:
        return f"ed25519:{self.signing_key.version}"

    @property
    def verify_key_base64(self) -> str:
        return encode_verify_key_base64(get_verify_key(self.signing_key))

    def key_document(self, signing_key=None) -> dict:
        """Our self-signed key document (signed by ``signing_key`` if given: a liar's trick)."""
        doc = {
            "server_name": self.server_name,
            "verify_keys": {self.key_id: {"key": self.verify_key_base64}},
            "old_verify_keys": self.old_verify_keys,
            "valid_until_ts": int(time.time() * 1000) + self.key_valid_for_ms,
        }
        return sign_json(doc, self.server_name, signing_key or self.signing_key)

    def sign_request(self, destination: str, method: str, uri: str, content=None) -> str:
        """An ``Authorization: X-Matrix ...`` value for a request from us to ``destination``."""
        return sign_request(self.signing_key, self.server_name, destination, method, uri, content)

    # -- routes ----------------------------------------------------------------------------

    def route(self, method: str, path: str, handler: Handler, prefix: bool = False) -> None:
        if prefix:
            self._prefix_routes.insert(0, (method.upper(), path, handler))
        else:
            self._routes[(method.upper(), path)] = handler

    def serve_well_known(self, delegated: str, headers: dict | None = None) -> None:
        """Answer ``/.well-known/matrix/server`` with ``{"m.server": delegated}``."""
        self.route("GET", "/.well-known/matrix/server",
                   lambda req: (200, {"m.server": delegated}, headers or {}))

    # -- observations ----------------------------------------------------------------------

    def hits(self, path: str | None = None) -> int:
        return sum(1 for r in self.requests if path is None or r.path == path)

    def wait_hits(self, path: str | None, n: int, timeout: float = 10) -> bool:
        end = time.monotonic() + timeout
        while self.hits(path) < n:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def start(self) -> HonestPeer:
        ctx = self.ca.server_context(*self.cert_names)
        ctx.sni_callback = self._record_sni
        self._server = WSGIServer((self.host, self.port), self._app, spawn=Pool(1000),
                                  log=None, error_log=None, handler_class=_RecordingHandler,
                                  ssl_context=ctx)
        self._server.peer = self
        self._server.start()
        self.port = self._server.address[1]
        return self

    def stop(self) -> None:
        """Closes the listener and every connection at once (clients keep idle keep-alive
        connections open; waiting for them would only slow tests down)."""
        if self._server is not None:
            self._server.stop(timeout=0)
            self._server = None

    def __enter__(self) -> HonestPeer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _record_sni(self, ssl_socket, server_name, context) -> None:
        self._sni[ssl_socket] = server_name

    # -- serving ---------------------------------------------------------------------------

    def _app(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        seen = SeenRequest(
            method=environ["REQUEST_METHOD"], path=environ.get("PATH_INFO", ""),
            target=environ["peer.target"], query=environ.get("QUERY_STRING", ""),
            host=environ.get("HTTP_HOST"), sni=environ.get("peer.sni"),
            headers={k[5:].replace("_", "-").title(): v for k, v in environ.items()
                     if k.startswith("HTTP_")},
            body=body,
            client=(environ.get("REMOTE_ADDR"), int(environ.get("REMOTE_PORT") or 0)))
        self.requests.append(seen)
        changed, self._changed = self._changed, Event()
        changed.set()
        if self.latency:
            gevent.sleep(self.latency)
        handler = self._routes.get((seen.method, seen.path))
        if handler is None:
            handler = next((h for m, p, h in self._prefix_routes
                            if m == seen.method and seen.path.startswith(p)), None)
        if handler is None:
            result = (404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"})
        else:
            result = handler(seen)
        status, payload = result[0], result[1]
        headers = dict(result[2]) if len(result) > 2 else {}
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload).encode()
            headers.setdefault("Content-Type", "application/json")
        start_response(f"{status} X", list(headers.items()))
        # bytes go out with a Content-Length; an iterable of bytes goes out chunked.
        return [payload] if isinstance(payload, bytes) else payload
