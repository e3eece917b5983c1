"""A receiving end for the federation sender: ``PUT /_matrix/federation/v1/send/{txnId}`` on
a TLS peer, recorded per destination (the Host header: one peer serves many origins).

Every transaction's X-Matrix signature is checked with the sender's key, fetched from its
``/_matrix/key/v2/server``; a transaction that fails the check is answered 401 and recorded
as such. A destination can be made to fail (any status) or to hold transactions until
released, and the receiver counts transactions in flight per destination.

    sink = TransactionSink(keys)                  # keys: an OriginKeyServer (or HonestPeer)
    sink.trust("weir.test", weir.federation_url, test_ca)
    sink.wait_pdus(origin.name, 3)
    assert [p["content"]["body"] for p in sink.pdus(origin.name)] == ["a", "b", "c"]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import requests
from gevent.event import Event

from homeserver.federation.signing import (
    decode_verify_key,
    parse_x_matrix,
    request_object,
    verify_signature,
)

SEND_PREFIX = "/_matrix/federation/v1/send/"


@dataclass
class ReceivedTxn:
    destination: str
    txn_id: str
    body: dict
    status: int  # what we answered


class TransactionSink:
    def __init__(self, peer):
        self.peer = peer
        self.transactions: list[ReceivedTxn] = []
        self.verify_keys: dict[str, dict] = {}  # server name -> {key id: verify key}
        self.failing: dict[str, int] = {}  # destination -> status to answer
        self.gates: dict[str, Event] = {}  # destination -> held until set
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self._changed = Event()
        peer.route("PUT", SEND_PREFIX, self._receive, prefix=True)

    def trust(self, server_name: str, federation_url: str, ca) -> None:
        """Fetches the sender's keys from its federation listener."""
        doc = requests.get(
            federation_url + "/_matrix/key/v2/server", verify=ca.ca_path, timeout=10
        ).json()
        self.verify_keys[server_name] = {
            key_id: decode_verify_key(key_id, v["key"]) for key_id, v in doc["verify_keys"].items()
        }

    # -- behaviour -------------------------------------------------------------------------

    def fail(self, destination: str, status: int = 500) -> None:
        self.failing[destination] = status

    def succeed(self, destination: str) -> None:
        self.failing.pop(destination, None)

    def hold(self, destination: str) -> None:
        self.gates[destination] = Event()

    def release(self, destination: str) -> None:
        gate = self.gates.pop(destination, None)
        if gate is not None:
            gate.set()

    # -- observations ----------------------------------------------------------------------

    def accepted(self, destination: str) -> list[ReceivedTxn]:
        return [t for t in self.transactions if t.destination == destination and t.status == 200]

    def attempts(self, destination: str) -> list[ReceivedTxn]:
        return [t for t in self.transactions if t.destination == destination]

    def ids_keep_their_pdus(self, destination: str) -> bool:
        """Whether each transaction ID sent to `destination` more than once (a transaction
        its sender died waiting on, sent again) carried the same PDUs every time."""
        pdus_of: dict[str, list] = {}
        return all(
            pdus_of.setdefault(t.txn_id, t.body["pdus"]) == t.body["pdus"]
            for t in self.attempts(destination)
        )

    def pdus(self, destination: str) -> list[dict]:
        """Every PDU accepted for `destination`, in the order received."""
        return [p for t in self.accepted(destination) for p in t.body.get("pdus", [])]

    def edus(self, destination: str) -> list[dict]:
        return [e for t in self.accepted(destination) for e in t.body.get("edus", [])]

    def wait_until(self, predicate, timeout: float = 10) -> bool:
        end = time.monotonic() + timeout
        while not predicate():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    def wait_pdus(self, destination: str, n: int, timeout: float = 10) -> bool:
        return self.wait_until(lambda: len(self.pdus(destination)) >= n, timeout)

    def _notify(self) -> None:
        changed, self._changed = self._changed, Event()
        changed.set()

    # -- serving ---------------------------------------------------------------------------

    def _verified(self, req, destination: str) -> bool:
        try:
            auth = parse_x_matrix(req.headers.get("Authorization", ""))
            key = self.verify_keys[auth.origin][auth.key_id]
            obj = request_object("PUT", req.target, auth.origin, destination, req.json())
            obj["signatures"] = {auth.origin: {auth.key_id: auth.sig}}
            verify_signature(obj, auth.origin, key)
        except Exception:
            return False
        return auth.destination == destination and req.json().get("origin") == auth.origin

    def _receive(self, req) -> tuple:
        destination = req.host
        self.in_flight[destination] = self.in_flight.get(destination, 0) + 1
        self.max_in_flight[destination] = max(
            self.max_in_flight.get(destination, 0), self.in_flight[destination]
        )
        self._notify()  # a held transaction arrived: waiters on in_flight see it
        try:
            gate = self.gates.get(destination)
            if gate is not None:
                gate.wait()
            if not self._verified(req, destination):
                status, body = 401, {"errcode": "M_UNAUTHORIZED", "error": "bad signature"}
            elif destination in self.failing:
                status = self.failing[destination]
                body = {"errcode": "M_UNKNOWN", "error": "told to fail"}
            else:
                status = 200
                body = {"pdus": {}}
            txn_id = req.path[len(SEND_PREFIX) :]
            self.transactions.append(ReceivedTxn(destination, txn_id, req.json(), status))
            return status, body
        finally:
            self.in_flight[destination] -= 1
            self._notify()
