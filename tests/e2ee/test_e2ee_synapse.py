"""End-to-end encryption across servers with a real Synapse 1.163 (TLS both ways), at the
protocol level: a Weir user and a Synapse user in one room see each other's device keys
(/keys/query through their own server), claim each other's one-time keys, see each other's
new devices in /sync device_lists.changed, and get each other's to-device messages."""

import os
import signal
import time
from urllib.parse import quote

import pytest
import requests
from signedjson.sign import sign_json
from unpaddedbase64 import encode_base64

from tests.e2ee.conftest import Device, count_rows, cross_signing_keys, new_signing_key, public
from tests.rooms.test_membership_synapse import SynapseUser
from tests.support.federation import tls_weir
from tests.support.metrics import metric, wait_for_metric
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

_base = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
WEIR_IP = f"{_base}.2"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"
WITHIN = 15.0


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-e2ee"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        proc.database_url = f"sqlite:///{directory}/data/homeserver.db"
        yield proc


class SynapseDevice:
    def __init__(self, synapse, localpart: str):
        self.user = SynapseUser(synapse, localpart)
        self.user_id = self.user.user_id
        self.device_id = self.user.call("GET", "/account/whoami").json()["device_id"]
        self.key = new_signing_key(self.device_id)

    def upload_keys(self) -> None:
        keys = {
            "user_id": self.user_id,
            "device_id": self.device_id,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {
                f"curve25519:{self.device_id}": encode_base64(b"s" * 32),
                f"ed25519:{self.device_id}": public(self.key),
            },
        }
        otk = sign_json({"key": encode_base64(b"o" * 32)}, self.user_id, self.key)
        body = {
            "device_keys": sign_json(keys, self.user_id, self.key),
            "one_time_keys": {"signed_curve25519:AAAAsyn": otk},
        }
        r = self.user.call("POST", "/keys/upload", json=body)
        assert r.status_code == 200, r.text


def sync_until(sync, seen, within: float = WITHIN) -> dict:
    """Long-polls `sync(since, timeout_ms)` until `seen(body)`; returns that body."""
    deadline, since = time.monotonic() + within, None
    while (left := deadline - time.monotonic()) > 0:
        body = sync(since, int(min(left, 5) * 1000))
        if seen(body):
            return body
        since = body["next_batch"]
    raise AssertionError(f"not seen within {within} s")


def weir_sync(client):
    def sync(since, timeout_ms):
        params = {"timeout": timeout_ms if since else 0, **({"since": since} if since else {})}
        r = client.get(f"{V3}/sync", params=params, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    return sync


def synapse_sync(user):
    def sync(since, timeout_ms):
        params = {"timeout": timeout_ms if since else 0, **({"since": since} if since else {})}
        r = user.call("GET", "/sync", params=params)
        assert r.status_code == 200, r.text
        return r.json()

    return sync


def changed(user_id):
    return lambda body: user_id in body.get("device_lists", {}).get("changed", [])


def to_device(sender, marker):
    return lambda body: any(
        e["sender"] == sender and e["content"].get("marker") == marker
        for e in body.get("to_device", {}).get("events", [])
    )


def test_keys_device_lists_and_to_device_cross_both_ways(weir, synapse):
    client = MatrixClient(weir.client_url)
    client.user_id = client.register("alice")["user_id"]
    alice = Device(client)
    assert (
        alice.upload(
            device_keys=alice.device_keys(), one_time_keys=alice.one_time_keys(1)
        ).status_code
        == 200
    )
    r = client.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": "10"})
    room = quote(r.json()["room_id"], safe="")
    bob = SynapseDevice(synapse, "bobkeys")
    bob.upload_keys()
    r = bob.user.call("POST", f"/join/{room}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())

    # Synapse's user's keys, through us; a claim of its one-time key through us.
    r = client.post(f"{V3}/keys/query", json={"device_keys": {bob.user_id: []}})
    assert r.status_code == 200, r.text
    assert bob.device_id in r.json()["device_keys"][bob.user_id], r.json()
    r = client.post(
        f"{V3}/keys/claim",
        json={"one_time_keys": {bob.user_id: {bob.device_id: "signed_curve25519"}}},
    )
    assert r.status_code == 200, r.text
    assert "signed_curve25519:AAAAsyn" in r.json()["one_time_keys"][bob.user_id][bob.device_id]

    # Our user's keys, through Synapse; a claim of ours through Synapse.
    r = bob.user.call("POST", "/keys/query", json={"device_keys": {client.user_id: []}})
    assert r.status_code == 200, r.text
    assert alice.device_id in r.json()["device_keys"][client.user_id], r.json()
    r = bob.user.call(
        "POST",
        "/keys/claim",
        json={"one_time_keys": {client.user_id: {alice.device_id: "signed_curve25519"}}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["one_time_keys"][client.user_id][alice.device_id]

    # To-device messages both ways.
    at_weir, at_synapse = weir_sync(client), synapse_sync(bob.user)
    messages = {bob.user_id: {bob.device_id: {"marker": "w2s"}}}
    r = client.put(f"{V3}/sendToDevice/m.test/t1", json={"messages": messages})
    assert r.status_code == 200, r.text
    sync_until(at_synapse, to_device(client.user_id, "w2s"))
    messages = {client.user_id: {alice.device_id: {"marker": "s2w"}}}
    r = bob.user.call("PUT", "/sendToDevice/m.test/t1", json={"messages": messages})
    assert r.status_code == 200, r.text
    sync_until(at_weir, to_device(bob.user_id, "s2w"))

    # A new device on either side shows in the other side's device_lists.changed.
    second = MatrixClient(weir.client_url)
    second.login("alice")
    second.user_id = client.user_id
    new = Device(second)
    since = at_synapse(None, 0)["next_batch"]
    assert new.upload(device_keys=new.device_keys()).status_code == 200
    sync_until(lambda s, t: at_synapse(s or since, t), changed(client.user_id))
    r = bob.user.call("POST", "/keys/query", json={"device_keys": {client.user_id: []}})
    assert new.device_id in r.json()["device_keys"][client.user_id], r.json()

    since = at_weir(None, 0)["next_batch"]
    r = requests.post(
        synapse.client_url + V3 + "/login",
        json={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "bobkeys"},
            "password": "correct horse battery",
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    login = r.json()
    bob2 = SynapseDevice.__new__(SynapseDevice)
    bob2.user = SynapseUser.__new__(SynapseUser)
    bob2.user.synapse = synapse
    bob2.user.user_id = bob.user_id
    bob2.user.headers = {"Authorization": f"Bearer {login['access_token']}"}
    bob2.user_id, bob2.device_id = bob.user_id, login["device_id"]
    bob2.key = new_signing_key(bob2.device_id)
    bob2.upload_keys()
    sync_until(lambda s, t: at_weir(s or since, t), changed(bob.user_id))
    r = client.post(f"{V3}/keys/query", json={"device_keys": {bob.user_id: []}})
    assert bob2.device_id in r.json()["device_keys"][bob.user_id], r.json()


def test_to_device_and_a_new_device_reach_synapse_after_it_was_down_and_we_restarted(weir, synapse):
    """Synapse is down (stopped: it accepts connections and answers nothing) while our user
    sends to-device messages to its device and adds a device. We restart; Synapse comes
    back; every message arrives in order, and Synapse's /keys/query has the new device."""
    client = MatrixClient(weir.client_url)
    client.user_id = client.register("carol")["user_id"]
    phone = Device(client)
    assert phone.upload(device_keys=phone.device_keys()).status_code == 200
    r = client.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": "10"})
    room = quote(r.json()["room_id"], safe="")
    dan = SynapseDevice(synapse, "dandown")
    dan.upload_keys()
    r = dan.user.call("POST", f"/join/{room}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    # Synapse now holds carol's device list: only an update tells it of a new device.
    r = dan.user.call("POST", "/keys/query", json={"device_keys": {client.user_id: []}})
    assert list(r.json()["device_keys"][client.user_id]) == [phone.device_id]
    since = synapse_sync(dan.user)(None, 0)["next_batch"]

    os.kill(synapse.proc.pid, signal.SIGSTOP)
    try:
        for n in range(5):
            messages = {dan.user_id: {dan.device_id: {"marker": f"down{n}"}}}
            r = client.put(f"{V3}/sendToDevice/m.test/down{n}", json={"messages": messages})
            assert r.status_code == 200, r.text
        second = MatrixClient(weir.client_url)
        second.login("carol")
        second.user_id = client.user_id
        laptop = Device(second)
        assert laptop.upload(device_keys=laptop.device_keys()).status_code == 200
        # Queued, and a transaction to Synapse is on its way: then we restart.
        wait_for_metric(weir.client_url, "weir_pool_greenlets", 1, pool="federation_sender")
        assert metric(weir.client_url, "weir_federation_sender_edu_queue") >= 6
        weir.stop()
        weir.start()
    finally:
        os.kill(synapse.proc.pid, signal.SIGCONT)

    markers: list[str] = []

    def all_arrived(body) -> bool:
        markers.extend(
            e["content"]["marker"]
            for e in body.get("to_device", {}).get("events", [])
            if e["sender"] == client.user_id
        )
        return len(markers) >= 5

    sync_until(lambda s, t: synapse_sync(dan.user)(s or since, t), all_arrived, within=30)
    assert markers == [f"down{n}" for n in range(5)]
    r = dan.user.call("POST", "/keys/query", json={"device_keys": {client.user_id: []}})
    assert laptop.device_id in r.json()["device_keys"][client.user_id], r.json()
    wait_for_metric(weir.client_url, "weir_federation_sender_edu_queue", 0)


def test_our_user_cross_signs_a_synapse_user(weir, synapse):
    """What Element does once our user has verified another server's user: sign their
    master key with our user's user-signing key. The signature is checked against the key
    their server gives, stored, and shown to our user in /keys/query; a forged one fails."""
    client = MatrixClient(weir.client_url)
    client.user_id = client.register("erin")["user_id"]
    erin = Device(client)
    assert erin.upload(device_keys=erin.device_keys()).status_code == 200
    ours, _, _, usk = cross_signing_keys(client.user_id)
    r = client.post(f"{V3}/keys/device_signing/upload", json=ours)
    assert r.status_code == 200, r.text
    frank = SynapseDevice(synapse, "frank_xsign")
    frank.upload_keys()
    theirs, frank_master, _, _ = cross_signing_keys(frank.user_id)
    r = frank.user.call("POST", "/keys/device_signing/upload", json=theirs)
    assert r.status_code == 200, r.text

    master_id = public(frank_master)
    forged = sign_json(dict(theirs["master_key"]), client.user_id, new_signing_key(public(usk)))
    r = client.post(f"{V3}/keys/signatures/upload", json={frank.user_id: {master_id: forged}})
    assert r.json()["failures"][frank.user_id][master_id]["errcode"] == "M_INVALID_SIGNATURE"
    signed = sign_json(dict(theirs["master_key"]), client.user_id, usk)
    r = client.post(f"{V3}/keys/signatures/upload", json={frank.user_id: {master_id: signed}})
    assert r.status_code == 200 and r.json() == {"failures": {}}, r.text

    r = client.post(f"{V3}/keys/query", json={"device_keys": {frank.user_id: []}})
    shown = r.json()["master_keys"][frank.user_id]
    assert shown["signatures"][client.user_id] == signed["signatures"][client.user_id]
    # Another of our users sees their master key without erin's signature.
    other = MatrixClient(weir.client_url)
    other.register("erin_friend")
    r = other.post(f"{V3}/keys/query", json={"device_keys": {frank.user_id: []}})
    assert client.user_id not in r.json()["master_keys"][frank.user_id].get("signatures", {})


def test_a_synapse_users_keys_are_answered_from_our_copy_while_synapse_is_down(weir, synapse):
    """The first query of a user we share a room with goes to their server, and their
    whole device list is then kept here (updated by their EDUs): the next query is answered
    from it, though their server answers nothing."""
    client = MatrixClient(weir.client_url)
    client.register("gina")
    r = client.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    room = quote(r.json()["room_id"], safe="")
    henry = SynapseDevice(synapse, "henry_cache")
    henry.upload_keys()
    r = henry.user.call("POST", f"/join/{room}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    query = {"device_keys": {henry.user_id: []}}
    r = client.post(f"{V3}/keys/query", json=query)
    assert henry.device_id in r.json()["device_keys"][henry.user_id], r.json()
    kept = "SELECT COUNT(*) FROM e2e_remote_device_lists WHERE user_id = ?"
    deadline = time.monotonic() + WITHIN
    while count_rows(weir, kept, (henry.user_id,)) == 0:  # fetched in the background
        assert time.monotonic() < deadline, "their device list was never kept"
        time.sleep(0.05)

    os.kill(synapse.proc.pid, signal.SIGSTOP)
    try:
        r = client.post(f"{V3}/keys/query", json=query)
    finally:
        os.kill(synapse.proc.pid, signal.SIGCONT)
    assert r.status_code == 200 and r.json()["failures"] == {}, r.text
    shown = r.json()["device_keys"][henry.user_id][henry.device_id]
    assert shown["keys"][f"ed25519:{henry.device_id}"] == public(henry.key)
