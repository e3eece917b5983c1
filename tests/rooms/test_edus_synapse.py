"""Typing and read receipts cross both ways with a real Synapse 1.163 (TLS both ways) within
5 s: a Synapse user joined to our room types and reads, and our user sees it in /sync
ephemeral; our user types and reads, and Synapse's user sees it in Synapse's /sync. Presence
crosses both ways within 10 s, in each side's /sync and GET /presence."""

import time
from urllib.parse import quote

import pytest

from tests.rooms.test_membership_synapse import SynapseUser
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.31.109.2"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"
# The bar: typing and receipts cross within 5 s.
WITHIN = 5.0


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-edus"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def weir_call(client):
    def call(method, path, **kw):
        return client.request(method, V3 + path, timeout=30, **kw)

    return call


def ephemeral_until(call, since: str, room_id: str, seen, within: float = WITHIN) -> dict:
    """Long-polls /sync from `since` until an ephemeral event of `room_id` satisfies `seen`;
    returns it. Fails after `within` seconds."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        r = call("GET", "/sync", params={"since": since, "timeout": int(left * 1000)})
        assert r.status_code == 200, r.text
        body = r.json()
        room = body.get("rooms", {}).get("join", {}).get(room_id, {})
        for event in room.get("ephemeral", {}).get("events", []):
            if seen(event):
                return event
        since = body["next_batch"]
    raise AssertionError(f"not seen in {room_id}'s ephemeral events within {within} s")


def next_batch(call) -> str:
    r = call("GET", "/sync", params={"timeout": 0})
    assert r.status_code == 200, r.text
    return r.json()["next_batch"]


def is_typing(user_ids):
    return lambda e: e["type"] == "m.typing" and e["content"]["user_ids"] == user_ids


def has_read(event_id, user_id):
    return lambda e: (
        e["type"] == "m.receipt" and user_id in e["content"].get(event_id, {}).get("m.read", {})
    )


def test_typing_and_receipts_cross_both_ways_with_synapse(weir, synapse):
    alice = MatrixClient(weir.client_url)
    alice_id = alice.register("alice")["user_id"]
    r = alice.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": "10"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    room = quote(room_id, safe="")
    bob = SynapseUser(synapse, "edus_bob")
    r = bob.call("POST", f"/join/{room}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    at_weir, at_synapse = weir_call(alice), bob.call
    r = alice.put(
        f"{V3}/rooms/{room}/send/m.room.message/m1", json={"msgtype": "m.text", "body": "a"}
    )
    ours = r.json()["event_id"]
    r = bob.call(
        "PUT", f"/rooms/{room}/send/m.room.message/m1", json={"msgtype": "m.text", "body": "b"}
    )
    theirs = r.json()["event_id"]

    # Synapse -> Weir: typing, then it stops; a read receipt.
    since = next_batch(at_weir)
    r = bob.call(
        "PUT", f"/rooms/{room}/typing/{bob.user_id}", json={"typing": True, "timeout": 30000}
    )
    assert r.status_code == 200, r.text
    ephemeral_until(at_weir, since, room_id, is_typing([bob.user_id]))
    r = bob.call("PUT", f"/rooms/{room}/typing/{bob.user_id}", json={"typing": False})
    assert r.status_code == 200, r.text
    ephemeral_until(at_weir, since, room_id, is_typing([]))
    r = bob.call("POST", f"/rooms/{room}/receipt/m.read/{quote(ours, safe='')}", json={})
    assert r.status_code == 200, r.text
    ephemeral_until(at_weir, since, room_id, has_read(ours, bob.user_id))

    # Weir -> Synapse: the same, through our federation sender.
    since = next_batch(at_synapse)
    r = alice.put(f"{V3}/rooms/{room}/typing/{alice_id}", json={"typing": True, "timeout": 30000})
    assert r.status_code == 200, r.text
    ephemeral_until(at_synapse, since, room_id, is_typing([alice_id]))
    r = alice.put(f"{V3}/rooms/{room}/typing/{alice_id}", json={"typing": False})
    assert r.status_code == 200, r.text
    ephemeral_until(at_synapse, since, room_id, is_typing([]))
    r = alice.post(f"{V3}/rooms/{room}/receipt/m.read/{quote(theirs, safe='')}", json={})
    assert r.status_code == 200, r.text
    ephemeral_until(at_synapse, since, room_id, has_read(theirs, alice_id))


def presence_until(call, since: str, user_id: str, seen, within: float = 10.0) -> dict:
    """Long-polls /sync (with set_presence=offline, so the poll itself changes nothing)
    until `user_id`'s m.presence content satisfies `seen`; returns it."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        params = {"since": since, "timeout": int(left * 1000), "set_presence": "offline"}
        r = call("GET", "/sync", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        for event in body.get("presence", {}).get("events", []):
            if event["sender"] == user_id and seen(event["content"]):
                return event["content"]
        since = body["next_batch"]
    raise AssertionError(f"{user_id}'s presence not seen within {within} s")


def test_presence_crosses_both_ways_with_synapse(weir, synapse):
    """The issue's bar: within 10 s each way, status message included."""
    carol = MatrixClient(weir.client_url)
    carol_id = carol.register("carol")["user_id"]
    r = carol.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    assert r.status_code == 200, r.text
    room = quote(r.json()["room_id"], safe="")
    dave = SynapseUser(synapse, "presence_dave")
    r = dave.call("POST", f"/join/{room}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    at_weir, at_synapse = weir_call(carol), dave.call

    # Synapse -> Weir.
    since = next_batch(at_weir)
    r = dave.call(
        "PUT",
        f"/presence/{quote(dave.user_id)}/status",
        json={"presence": "unavailable", "status_msg": "in a meeting"},
    )
    assert r.status_code == 200, r.text
    seen = presence_until(
        at_weir, since, dave.user_id, lambda c: c.get("status_msg") == "in a meeting"
    )
    assert seen["presence"] == "unavailable"
    r = carol.get(f"{V3}/presence/{quote(dave.user_id)}/status")
    assert r.status_code == 200 and r.json()["status_msg"] == "in a meeting", r.text

    # Weir -> Synapse.
    since = next_batch(at_synapse)
    r = carol.put(
        f"{V3}/presence/{quote(carol_id)}/status",
        json={"presence": "online", "status_msg": "writing tests"},
    )
    assert r.status_code == 200, r.text
    seen = presence_until(
        at_synapse, since, carol_id, lambda c: c.get("status_msg") == "writing tests"
    )
    assert seen["presence"] == "online"
    r = dave.call("GET", f"/presence/{quote(carol_id)}/status")
    assert r.status_code == 200 and r.json()["presence"] == "online", r.text
