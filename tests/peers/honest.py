"""An honest federation peer over TLS, run as greenlets in the test process.

It has its own ed25519 signing key and serves ``/_matrix/key/v2/server`` with it. It records
every request it sees (method, raw target, Host header, the SNI the client sent, headers,
body), counts hits per path and requests in flight, can answer slowly (``latency``, added to
every request), and takes route hooks so tests and later issues add endpoints (public rooms,
directory queries). It serves media over federation in Synapse's multipart shape
(``serve_media``). It can also sign requests as its own server name, to act as a "fake
origin" calling us.

    peer = HonestPeer("peer.test", test_ca, host="127.10.0.1", port=8448).start()
    peer.route("GET", "/_matrix/federation/v1/publicRooms",
               lambda req: (200, {"chunk": []}))
    peer.serve_media("abc", b"...", "image/png", "cat.png")
    header = peer.sign_request("weir.test", "GET", "/_matrix/federation/v1/query/profile?...")
    assert peer.hits("/_matrix/key/v2/server") == 1
    assert peer.media_fetches() == 1
    assert peer.requests[-1].sni == "peer.test"

A handler gets a :class:`SeenRequest` and returns ``(status, body)`` or
``(status, body, headers)``; a dict or list body is sent as JSON, bytes as they are (with a
Content-Length), and any other iterable of bytes chunked.
"""

from __future__ import annotations

import json
import time
import uuid
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

__all__ = [
    "FEDERATION_MEDIA_DOWNLOAD",
    "LEGACY_MEDIA_DOWNLOAD",
    "HonestPeer",
    "SeenRequest",
    "multipart_media",
]

FEDERATION_MEDIA_DOWNLOAD = "/_matrix/federation/v1/media/download/"
LEGACY_MEDIA_DOWNLOAD = "/_matrix/media/v3/download/"
_UNRECOGNIZED = (404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"})


def multipart_media(
    file_headers: dict, data: bytes = b"", boundary: str | None = None
) -> tuple[bytes, str]:
    """(body, Content-Type) of a federation media response in the shape Synapse sends: a JSON
    part ``{}``, then a part with ``file_headers`` (Content-Type and Content-Disposition, or a
    Location) and ``data``."""
    boundary = boundary or uuid.uuid4().hex
    head = "".join(f"{name}: {value}\r\n" for name, value in file_headers.items())
    body = (
        (
            f"\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n{{}}"
            f"\r\n--{boundary}\r\n{head}\r\n"
        ).encode("latin-1")
        + data
        + f"\r\n--{boundary}--\r\n".encode("ascii")
    )
    return body, f"multipart/mixed; boundary={boundary}"


@dataclass
class SeenRequest:
    method: str
    path: str  # PATH_INFO (decoded)
    target: str  # the raw request target, as sent
    query: str
    host: str | None  # the Host header
    sni: str | None  # the TLS server name the client sent (None: no SNI)
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    client: tuple = ()  # (address, port) the request came from

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
    def __init__(
        self,
        server_name: str,
        ca,
        host: str = "127.0.0.1",
        port: int = 8448,
        *,
        cert_names: tuple[str, ...] | None = None,
        latency: float = 0.0,
        key_version: str = "a_peer",
    ):
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
        self.in_flight = 0  # requests being answered now (latency included)
        self.max_in_flight = 0
        self.media: dict[str, tuple[bytes, str, str | None]] = {}
        # False: an older server, whose media is only at the client API's legacy download.
        self.federation_media = True
        self.media_gate: Event | None = None  # set: media requests wait for it to be set
        self._routes: dict[tuple[str, str], Handler] = {}
        self._prefix_routes: list[tuple[str, str, Handler]] = []
        self._sni: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._changed = Event()
        self._server: WSGIServer | None = None
        self.route("GET", "/_matrix/key/v2/server", lambda req: (200, self.key_document()))
        self.route("GET", FEDERATION_MEDIA_DOWNLOAD, self._media_download, prefix=True)
        self.route("GET", LEGACY_MEDIA_DOWNLOAD, self._legacy_media_download, prefix=True)

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

    def serve_media(
        self,
        media_id: str,
        data: bytes,
        content_type: str = "application/octet-stream",
        filename: str | None = None,
    ) -> None:
        """Serve ``data`` at ``/_matrix/federation/v1/media/download/<media_id>``."""
        self.media[media_id] = (data, content_type, filename)

    def _media_download(self, req: SeenRequest) -> tuple:
        if not self.federation_media:
            return _UNRECOGNIZED
        if self.media_gate is not None:
            self.media_gate.wait()
        entry = self.media.get(req.path[len(FEDERATION_MEDIA_DOWNLOAD) :])
        if entry is None:
            return 404, {"errcode": "M_NOT_FOUND", "error": "Not found"}
        body, multipart_type = multipart_media(self._media_headers(entry), entry[0])
        return 200, body, {"Content-Type": multipart_type}

    def _legacy_media_download(self, req: SeenRequest) -> tuple:
        server_name, _, media_id = req.path[len(LEGACY_MEDIA_DOWNLOAD) :].partition("/")
        entry = self.media.get(media_id) if server_name == self.server_name else None
        if entry is None:
            return 404, {"errcode": "M_NOT_FOUND", "error": "Not found"}
        return 200, entry[0], self._media_headers(entry)

    @staticmethod
    def _media_headers(entry) -> dict:
        _, content_type, filename = entry
        headers = {"Content-Type": content_type}
        if filename:
            headers["Content-Disposition"] = f"inline; filename={filename}"
        return headers

    def serve_well_known(self, delegated: str, headers: dict | None = None) -> None:
        """Answer ``/.well-known/matrix/server`` with ``{"m.server": delegated}``."""
        self.route(
            "GET",
            "/.well-known/matrix/server",
            lambda req: (200, {"m.server": delegated}, headers or {}),
        )

    # -- observations ----------------------------------------------------------------------

    def hits(self, path: str | None = None) -> int:
        return sum(1 for r in self.requests if path is None or r.path == path)

    def media_fetches(self, media_id: str | None = None) -> int:
        """Requests for media over federation (one file's, or all of them)."""
        if media_id is not None:
            return self.hits(FEDERATION_MEDIA_DOWNLOAD + media_id)
        return sum(1 for r in self.requests if r.path.startswith(FEDERATION_MEDIA_DOWNLOAD))

    def wait_hits(self, path: str | None, n: int, timeout: float = 10) -> bool:
        return self.wait_until(lambda: self.hits(path) >= n, timeout)

    def wait_until(self, predicate, timeout: float = 10) -> bool:
        """Whether `predicate()` held within `timeout`, looked at after each request seen."""
        end = time.monotonic() + timeout
        while not predicate():
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
        self._server = WSGIServer(
            (self.host, self.port),
            self._app,
            spawn=Pool(1000),
            log=None,
            error_log=None,
            handler_class=_RecordingHandler,
            ssl_context=ctx,
        )
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
            method=environ["REQUEST_METHOD"],
            path=environ.get("PATH_INFO", ""),
            target=environ["peer.target"],
            query=environ.get("QUERY_STRING", ""),
            host=environ.get("HTTP_HOST"),
            sni=environ.get("peer.sni"),
            headers={
                k[5:].replace("_", "-").title(): v
                for k, v in environ.items()
                if k.startswith("HTTP_")
            },
            body=body,
            client=(environ.get("REMOTE_ADDR"), int(environ.get("REMOTE_PORT") or 0)),
        )
        self.requests.append(seen)
        changed, self._changed = self._changed, Event()
        changed.set()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency:
                gevent.sleep(self.latency)
            handler = self._routes.get((seen.method, seen.path))
            if handler is None:
                handler = next(
                    (
                        h
                        for m, p, h in self._prefix_routes
                        if m == seen.method and seen.path.startswith(p)
                    ),
                    None,
                )
            if handler is None:
                result = _UNRECOGNIZED
            else:
                result = handler(seen)
        finally:
            self.in_flight -= 1
        status, payload = result[0], result[1]
        headers = dict(result[2]) if len(result) > 2 else {}
        if isinstance(payload, (dict, list)):
            payload = json.dumps(payload).encode()
            headers.setdefault("Content-Type", "application/json")
        start_response(f"{status} X", list(headers.items()))
        # bytes go out with a Content-Length; an iterable of bytes goes out chunked.
        return [payload] if isinstance(payload, bytes) else payload
