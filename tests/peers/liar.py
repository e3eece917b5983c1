"""A lying federation peer: an :class:`HonestPeer` whose routes misbehave on demand.

    liar = LiarPeer("liar.test", test_ca, host="127.11.0.1", port=443).start()
    liar.wrong_key_signature()                    # key document signed by another key
    liar.oversized_well_known(60 * 1024)          # a well-known over the 50 KiB cap
    liar.redirect_loop("/.well-known/matrix/server")
    liar.redirect("/.well-known/matrix/server", "https://127.200.0.1/x")
    liar.malformed_json("/_matrix/federation/v1/query/profile")

DNS lies (an SRV record or A record pointing at a denied address) are made with
``tests.peers.dns.DnsServer`` directly: ``dns.add_srv(name, "denied.test", port)``.
"""

from __future__ import annotations

from signedjson.key import generate_signing_key

from tests.peers.honest import HonestPeer

__all__ = ["LiarPeer"]


class LiarPeer(HonestPeer):
    def wrong_key_signature(self) -> None:
        """Serve a key document signed by a key other than the one it lists."""
        impostor = generate_signing_key(self.signing_key.version)
        self.route("GET", "/_matrix/key/v2/server", lambda req: (200, self.key_document(impostor)))

    def oversized_well_known(self, size: int, delegated: str = "liar.test:8448") -> None:
        """A valid JSON well-known delegating to ``delegated``, padded to ``size`` bytes."""
        head = '{"m.server": "%s",' % delegated
        body = (head + " " * max(0, size - len(head) - 7) + '"x": 1}').encode()
        self.route("GET", "/.well-known/matrix/server",
                   lambda req: (200, body, {"Content-Type": "application/json"}))

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.route("GET", path, lambda req: (status, b"", {"Location": location}))

    def redirect_loop(self, path: str) -> None:
        """``path`` redirects to ``path + "/a"``, which redirects back to ``path``."""
        self.redirect(path, f"{self.url}{path}/a")
        self.redirect(f"{path}/a", f"{self.url}{path}")

    def malformed_json(self, path: str, method: str = "GET") -> None:
        self.route(method, path, lambda req: (200, b'{"not": json', {"Content-Type": "application/json"}))

    def huge_json(self, path: str, size: int, method: str = "GET") -> None:
        body = b'{"pad": "' + b"x" * size + b'"}'
        self.route(method, path, lambda req: (200, body, {"Content-Type": "application/json"}))
