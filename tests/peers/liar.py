"""A lying federation peer: an :class:`HonestPeer` whose routes misbehave on demand.

    liar = LiarPeer("liar.test", test_ca, host="127.11.0.1", port=443).start()
    liar.wrong_key_signature()                    # key document signed by another key
    liar.oversized_well_known(60 * 1024)          # a well-known over the 50 KiB cap
    liar.redirect_loop("/.well-known/matrix/server")
    liar.redirect("/.well-known/matrix/server", "https://127.200.0.1/x")
    liar.malformed_json("/_matrix/federation/v1/query/profile")
    liar.media_location("abc", "https://127.200.0.1/x")   # a Location part to follow
    liar.malformed_media("abc", "truncated")              # see MALFORMED_MEDIA
    liar.oversized_media("abc", 2 * 1024 * 1024)          # streamed, no Content-Length

DNS lies (an SRV record or A record pointing at a denied address) are made with
``tests.peers.dns.DnsServer`` directly: ``dns.add_srv(name, "denied.test", port)``.
"""

from __future__ import annotations

import gevent
from signedjson.key import generate_signing_key

from tests.peers.honest import FEDERATION_MEDIA_DOWNLOAD, HonestPeer, multipart_media

__all__ = ["LiarPeer", "MALFORMED_MEDIA"]

_BODY, _TYPE = multipart_media({"Content-Type": "text/plain"}, b"hello", boundary="B")
# Federation media responses that are not what the spec says, by name.
MALFORMED_MEDIA = {
    # The closing boundary never comes: the file may be cut short.
    "truncated": (_BODY[: -len(b"\r\n--B--\r\n")], _TYPE),
    "not multipart": (b"hello", "application/octet-stream"),
    "no boundary": (_BODY, "multipart/mixed"),
    "wrong boundary": (_BODY, "multipart/mixed; boundary=C"),
    "json part missing": (b"\r\n--B\r\nContent-Type: text/plain\r\n\r\nhello\r\n--B--\r\n", _TYPE),
    "three parts": (
        _BODY[: -len(b"--\r\n")] + b"\r\nContent-Type: text/plain\r\n\r\nmore\r\n--B--\r\n",
        _TYPE,
    ),
    "json not an object": (_BODY.replace(b"{}", b"[1]"), _TYPE),
    # Deeper than the JSON parser goes (it raises RecursionError, not ValueError).
    "json nested too deep": (_BODY.replace(b"{}", b"[" * 5000 + b"]" * 5000), _TYPE),
}


class LiarPeer(HonestPeer):
    def wrong_key_signature(self) -> None:
        """Serve a key document signed by a key other than the one it lists."""
        impostor = generate_signing_key(self.signing_key.version)
        self.route("GET", "/_matrix/key/v2/server", lambda req: (200, self.key_document(impostor)))

    def oversized_well_known(self, size: int, delegated: str = "liar.test:8448") -> None:
        """A valid JSON well-known delegating to ``delegated``, padded to ``size`` bytes."""
        head = '{"m.server": "%s",' % delegated
        body = (head + " " * max(0, size - len(head) - 7) + '"x": 1}').encode()
        self.route(
            "GET",
            "/.well-known/matrix/server",
            lambda req: (200, body, {"Content-Type": "application/json"}),
        )

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.route("GET", path, lambda req: (status, b"", {"Location": location}))

    def redirect_loop(self, path: str) -> None:
        """``path`` redirects to ``path + "/a"``, which redirects back to ``path``."""
        self.redirect(path, f"{self.url}{path}/a")
        self.redirect(f"{path}/a", f"{self.url}{path}")

    def malformed_json(self, path: str, method: str = "GET") -> None:
        self.route(
            method, path, lambda req: (200, b'{"not": json', {"Content-Type": "application/json"})
        )

    def huge_json(self, path: str, size: int, method: str = "GET") -> None:
        body = b'{"pad": "' + b"x" * size + b'"}'
        self.route(method, path, lambda req: (200, body, {"Content-Type": "application/json"}))

    # -- media ------------------------------------------------------------------------------

    def media_location(self, media_id: str, url: str) -> None:
        """The file part of ``media_id`` is a Location pointing at ``url``."""
        body, content_type = multipart_media({"Location": url})
        self.route(
            "GET",
            FEDERATION_MEDIA_DOWNLOAD + media_id,
            lambda req: (200, body, {"Content-Type": content_type}),
        )

    def malformed_media(self, media_id: str, kind: str) -> None:
        body, content_type = MALFORMED_MEDIA[kind]
        self.route(
            "GET",
            FEDERATION_MEDIA_DOWNLOAD + media_id,
            lambda req: (200, body, {"Content-Type": content_type}),
        )

    def oversized_media(self, media_id: str, size: int, declared: bool = False) -> None:
        """A file of ``size`` bytes, streamed in chunks (``declared``: with a Content-Length
        saying so up front). ``media_bytes_sent`` counts what actually went out."""
        head, content_type = multipart_media(
            {"Content-Type": "application/octet-stream"}, boundary="B"
        )
        head, tail = head[: -len(b"\r\n--B--\r\n")], b"\r\n--B--\r\n"
        self.media_bytes_sent = 0

        def body():
            yield head
            left = size
            while left > 0:
                n = min(64 * 1024, left)
                left -= n
                self.media_bytes_sent += n
                yield b"x" * n
                gevent.sleep(0)  # let the reader keep up, as a real network would
            yield tail

        def handler(req):
            headers = {"Content-Type": content_type}
            if declared:
                headers["Content-Length"] = str(len(head) + size + len(tail))
            return 200, body(), headers

        self.route("GET", FEDERATION_MEDIA_DOWNLOAD + media_id, handler)
