"""Fake origin servers: server names that sign requests and PDUs, and a key server for many
of them at once.

A :class:`FakeOrigin` is a server name with its own ed25519 key. It signs X-Matrix requests
and builds signed PDUs (room version 10 or 11) as that server. Its keys are served by an
:class:`OriginKeyServer` (a real TLS peer answering ``/_matrix/key/v2/server`` for every
origin it hosts, by Host header), or by nobody: an origin whose name resolves to a
:class:`~tests.peers.tarpit.Tarpit` has keys that never arrive.

Names carry an explicit port (``o7.origins.test:8448``), so discovery is one DNS A lookup
in the test DNS server and no well-known request (spec: "explicit port").

    keys = OriginKeyServer("origins.test", test_ca, dns, host="127.60.0.1").start()
    origin = keys.add_origin("o1")
    pdu = origin.pdu(ROOM_V10, room_id, "@alice:" + origin.name, "m.room.message",
                     {"body": "hi"}, prev_events=[...], auth_events=[...])
    r = send_transaction(weir.federation_url, origin, "weir.test", "txn1", [pdu], test_ca)
    assert keys.fetches(origin.name) == 1
"""

from __future__ import annotations

import copy
import json
import time
from urllib.parse import quote

import requests
from gevent.event import Event
from signedjson.key import encode_verify_key_base64, generate_signing_key, get_verify_key
from signedjson.sign import sign_json

from homeserver.federation.signing import sign_request
from homeserver.rooms.events import add_hashes_and_signatures, event_id_for
from homeserver.rooms.versions import ROOM_V10, RoomVersion
from tests.peers.honest import HonestPeer

__all__ = ["FakeOrigin", "OriginKeyServer", "federation_request", "send_transaction"]

KEYS_PATH = "/_matrix/key/v2/server"


class FakeOrigin:
    def __init__(self, name: str, key_version: str = "o1"):
        self.name = name
        self.signing_key = generate_signing_key(key_version)

    @property
    def key_id(self) -> str:
        return f"ed25519:{self.signing_key.version}"

    def key_document(self) -> dict:
        doc = {
            "server_name": self.name,
            "verify_keys": {
                self.key_id: {"key": encode_verify_key_base64(get_verify_key(self.signing_key))}
            },
            "old_verify_keys": {},
            "valid_until_ts": int(time.time() * 1000) + 24 * 3600 * 1000,
        }
        return sign_json(doc, self.name, self.signing_key)

    def sign_request(self, destination: str, method: str, uri: str, content=None) -> str:
        return sign_request(self.signing_key, self.name, destination, method, uri, content)

    def user(self, localpart: str) -> str:
        return f"@{localpart}:{self.name}"

    def pdu(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: dict,
        *,
        prev_events: list[str],
        auth_events: list[str],
        depth: int = 100,
        state_key: str | None = None,
        version: RoomVersion = ROOM_V10,
        origin_server_ts: int | None = None,
        extra: dict | None = None,
    ) -> tuple[str, dict]:
        """``(event_id, pdu)``: an event of ours, hashed and signed. ``extra``: more top-level
        keys (a redaction's ``redacts`` before room version 11)."""
        pdu = {
            "room_id": room_id,
            "sender": sender,
            "type": event_type,
            "content": copy.deepcopy(content),
            "prev_events": list(prev_events),
            "auth_events": list(auth_events),
            "depth": depth,
            "origin_server_ts": origin_server_ts or int(time.time() * 1000),
        }
        if state_key is not None:
            pdu["state_key"] = state_key
        pdu.update(extra or {})
        add_hashes_and_signatures(version, pdu, self.name, self.signing_key)
        return event_id_for(version, pdu), pdu


class OriginKeyServer(HonestPeer):
    """One TLS listener serving the key documents of many origins under one DNS domain."""

    def __init__(self, domain: str, ca, dns, host: str, port: int = 0, extra_names=(), **kw):
        names = (f"*.{domain}", host, *extra_names)  # extra_names: origins outside the domain
        super().__init__(f"keys.{domain}", ca, host=host, port=port, cert_names=names, **kw)
        self.domain = domain
        self.dns = dns
        self.origins: dict[str, FakeOrigin] = {}
        self.gate = Event()  # key requests wait until it is set: hold() and release()
        self.gate.set()
        self.route("GET", KEYS_PATH, self._key_document)

    def hold(self) -> None:
        """Key requests from now on wait (a slow key server) until :meth:`release`."""
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def add_origin(self, label: str) -> FakeOrigin:
        """A new origin ``label.domain:port`` whose keys this server serves."""
        hostname = f"{label}.{self.domain}"
        self.dns.add_a(hostname, self.host)
        origin = FakeOrigin(f"{hostname}:{self.port}")
        self.origins[origin.name] = origin
        return origin

    def fetches(self, name: str | None = None) -> int:
        return sum(
            1 for r in self.requests if r.path == KEYS_PATH and (name is None or r.host == name)
        )

    def _key_document(self, req):
        self.gate.wait()
        origin = self.origins.get(req.host)
        if origin is None:
            return 404, {"errcode": "M_NOT_FOUND", "error": f"no server {req.host}"}
        return 200, origin.key_document()


def transaction_body(origin: FakeOrigin, pdus: list[dict], edus: list | None = None) -> dict:
    body = {"origin": origin.name, "origin_server_ts": int(time.time() * 1000), "pdus": pdus}
    if edus is not None:
        body["edus"] = edus
    return body


def send_transaction(
    federation_url: str,
    origin: FakeOrigin,
    destination: str,
    txn_id: str,
    pdus: list[dict],
    ca,
    *,
    edus: list | None = None,
    body: dict | None = None,
    timeout: float = 60,
) -> requests.Response:
    """PUT /send/{txn_id} as ``origin``, signed, on a new connection."""
    uri = f"/_matrix/federation/v1/send/{quote(txn_id, safe='')}"
    content = body if body is not None else transaction_body(origin, pdus, edus)
    headers = {
        "Authorization": origin.sign_request(destination, "PUT", uri, content),
        "Content-Type": "application/json",
    }
    return requests.put(
        federation_url + uri,
        data=json.dumps(content),
        headers=headers,
        verify=getattr(ca, "ca_path", ca),
        timeout=timeout,
    )


def federation_request(
    federation_url: str,
    origin: FakeOrigin,
    destination: str,
    method: str,
    uri: str,
    ca,
    body: dict | None = None,
    timeout: float = 60,
) -> requests.Response:
    """Any federation request as ``origin``, signed; ``uri`` is the path with its query,
    exactly as signed and sent."""
    headers = {"Authorization": origin.sign_request(destination, method, uri, body)}
    if body is not None:
        headers["Content-Type"] = "application/json"
    return requests.request(
        method,
        federation_url + uri,
        data=json.dumps(body) if body is not None else None,
        headers=headers,
        verify=getattr(ca, "ca_path", ca),
        timeout=timeout,
    )
