"""Devices, keys and cross-signing on the real server (SQLite and PostgreSQL): what a client
uploads, what another user sees, and every refusal."""

import gevent
from signedjson.sign import sign_json

from tests.e2ee.conftest import (
    V3,
    Device,
    cross_signing_keys,
    password_auth,
    public,
)
from tests.support.server import MatrixClient
from tests.support.spec import assert_matches_spec


def test_device_keys_upload_and_query_show_the_display_name(server, device):
    alice, bob = device("alice"), device("bob")
    r = alice.client.put(f"{V3}/devices/{alice.device_id}", json={"display_name": "Alice's phone"})
    assert r.status_code == 200, r.text
    r = alice.upload(device_keys=alice.device_keys(), one_time_keys=alice.one_time_keys(3))
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/keys/upload")
    assert r.json()["one_time_key_counts"] == {"signed_curve25519": 3}

    r = bob.client.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/keys/query")
    shown = r.json()["device_keys"][alice.user_id][alice.device_id]
    assert shown["unsigned"]["device_display_name"] == "Alice's phone"
    del shown["unsigned"]
    assert shown == alice.device_keys()  # exactly what the device signed
    assert r.json()["failures"] == {}


def test_device_keys_for_another_user_or_device_or_badly_signed_are_refused(server, device):
    alice = device("alice")
    for override in ({"user_id": "@mallory:localhost"}, {"device_id": "OTHERDEVICE"}):
        r = alice.upload(device_keys=alice.device_keys(**override))
        assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM"), r.text
    forged = alice.device_keys()
    forged["algorithms"] = ["m.megolm.v1.aes-sha2"]  # changed after signing
    r = alice.upload(device_keys=forged)
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_SIGNATURE"), r.text
    alice.upload(device_keys=alice.device_keys())
    bad_otk = alice.one_time_keys(1)
    next(iter(bad_otk.values()))["key"] = "tampered"
    r = alice.upload(one_time_keys=bad_otk)
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_SIGNATURE"), r.text
    r = alice.client.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}})
    assert r.json()["device_keys"][alice.user_id][alice.device_id] == alice.device_keys()


def test_a_one_time_key_id_reused_with_other_content_is_refused(server, device):
    alice = device("alice")
    alice.upload(device_keys=alice.device_keys())
    keys = alice.one_time_keys(1)
    assert alice.upload(one_time_keys=keys).status_code == 200
    assert alice.upload(one_time_keys=keys).json()["one_time_key_counts"] == {
        "signed_curve25519": 1
    }  # the same key again is no new key
    (key_id,) = keys
    other = {key_id: next(iter(alice.one_time_keys(1).values()))}
    r = alice.upload(one_time_keys=other)
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM"), r.text


def test_claims_race_for_the_last_one_time_key_and_the_loser_gets_the_fallback(server, device):
    alice = device("alice")
    fallback = alice.one_time_keys(1, fallback=True)
    otk = alice.one_time_keys(1)
    r = alice.upload(device_keys=alice.device_keys(), one_time_keys=otk, fallback_keys=fallback)
    assert r.status_code == 200, r.text
    claimants = [device("bob").client for _ in range(6)]
    body = {"one_time_keys": {alice.user_id: {alice.device_id: "signed_curve25519"}}}

    def claim(client):
        r = client.post(f"{V3}/keys/claim", json=body)
        assert r.status_code == 200, r.text
        assert_matches_spec(r, "post", "/_matrix/client/v3/keys/claim")
        return r.json()["one_time_keys"][alice.user_id][alice.device_id]

    racers = [gevent.spawn(claim, c) for c in claimants]
    gevent.joinall(racers, raise_error=True)
    got = [g.value for g in racers]
    assert sum(1 for g in got if g == otk) == 1  # exactly one claimant has the one-time key
    assert sum(1 for g in got if g == fallback) == len(claimants) - 1  # the rest the fallback


def test_claim_and_query_name_other_servers_in_failures(server, device):
    alice = device("alice")
    alice.upload(device_keys=alice.device_keys())
    r = alice.client.post(
        f"{V3}/keys/query",
        json={"device_keys": {alice.user_id: [], "@bob:elsewhere.example": []}},
    )
    assert r.status_code == 200, r.text
    assert list(r.json()["failures"]) == ["elsewhere.example"]
    assert alice.device_id in r.json()["device_keys"][alice.user_id]
    r = alice.client.post(
        f"{V3}/keys/claim",
        json={"one_time_keys": {"@bob:elsewhere.example": {"DEV": "signed_curve25519"}}},
    )
    assert r.status_code == 200, r.text
    assert list(r.json()["failures"]) == ["elsewhere.example"]


def test_devices_list_rename_and_delete_with_password_auth(server, device):
    alice = device("alice")
    second = MatrixClient(server.client_url)
    second.login(alice.user_id)
    second.user_id = alice.user_id
    phone = Device(second)
    phone.upload(device_keys=phone.device_keys(), one_time_keys=phone.one_time_keys(2))

    r = alice.client.get(f"{V3}/devices")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", "/_matrix/client/v3/devices")
    assert {d["device_id"] for d in r.json()["devices"]} == {alice.device_id, phone.device_id}
    assert alice.client.get(f"{V3}/devices/NOSUCH").status_code == 404

    r = alice.client.delete(f"{V3}/devices/{phone.device_id}", json={})
    assert r.status_code == 401, r.text
    assert_matches_spec(r, "delete", "/_matrix/client/v3/devices/{deviceId}")
    assert r.json()["flows"] == [{"stages": ["m.login.password"]}] and "errcode" not in r.json()
    session = r.json()["session"]
    wrong = {**password_auth(alice.client, session), "password": "wrong"}
    r = alice.client.delete(f"{V3}/devices/{phone.device_id}", json={"auth": wrong})
    assert (r.status_code, r.json()["errcode"]) == (401, "M_FORBIDDEN")
    assert second.get(f"{V3}/account/whoami").status_code == 200  # nothing deleted

    auth = password_auth(alice.client, r.json()["session"])
    r = alice.client.delete(f"{V3}/devices/{phone.device_id}", json={"auth": auth})
    assert r.status_code == 200, r.text
    assert second.get(f"{V3}/account/whoami").json()["errcode"] == "M_UNKNOWN_TOKEN"
    r = alice.client.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}})
    assert phone.device_id not in r.json()["device_keys"][alice.user_id]
    r = alice.client.post(
        f"{V3}/keys/claim",
        json={"one_time_keys": {alice.user_id: {phone.device_id: "signed_curve25519"}}},
    )
    assert r.json()["one_time_keys"] == {}  # its one-time keys went with it
    # A spent session is not accepted again.
    r = alice.client.post(f"{V3}/delete_devices", json={"devices": [alice.device_id], "auth": auth})
    assert r.status_code == 401 and r.json()["session"] != auth["session"]


def test_delete_devices_in_one_request(server, device):
    alice = device("alice")
    other = MatrixClient(server.client_url)
    other.login(alice.user_id)
    other_id = other.get(f"{V3}/account/whoami").json()["device_id"]
    r = alice.client.post(f"{V3}/delete_devices", json={"devices": [other_id]})
    assert r.status_code == 401
    assert_matches_spec(r, "post", "/_matrix/client/v3/delete_devices")
    auth = password_auth(alice.client, r.json()["session"])
    r = alice.client.post(f"{V3}/delete_devices", json={"devices": [other_id], "auth": auth})
    assert r.status_code == 200, r.text
    assert [d["device_id"] for d in alice.client.get(f"{V3}/devices").json()["devices"]] == [
        alice.device_id
    ]


def test_cross_signing_upload_replace_with_auth_and_sign_a_device(server, device):
    alice, bob = device("alice"), device("bob")
    alice.upload(device_keys=alice.device_keys())
    body, master, ssk, usk = cross_signing_keys(alice.user_id)
    # The first master key needs no password; the same keys again neither.
    for _ in range(2):
        r = alice.client.post(f"{V3}/keys/device_signing/upload", json=body)
        assert r.status_code == 200, r.text

    badly_signed, _, _, _ = cross_signing_keys(alice.user_id)
    badly_signed["master_key"] = body["master_key"]  # the other keys signed by another master
    r = alice.client.post(f"{V3}/keys/device_signing/upload", json=badly_signed)
    assert r.status_code == 401  # a change asks for the password first
    badly_signed["auth"] = password_auth(alice.client, r.json()["session"])
    r = alice.client.post(f"{V3}/keys/device_signing/upload", json=badly_signed)
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_SIGNATURE"), r.text

    # The self-signing key signs the device; a forged signature lands in failures.
    signed_device = sign_json(alice.device_keys(), alice.user_id, ssk)
    forged = sign_json(alice.device_keys(), alice.user_id, usk)
    forged["signatures"][alice.user_id] = {
        f"ed25519:{public(ssk)}": forged["signatures"][alice.user_id][f"ed25519:{public(usk)}"]
    }
    r = alice.client.post(
        f"{V3}/keys/signatures/upload", json={alice.user_id: {alice.device_id: forged}}
    )
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", "/_matrix/client/v3/keys/signatures/upload")
    assert r.json()["failures"][alice.user_id][alice.device_id]["errcode"] == "M_INVALID_SIGNATURE"
    r = alice.client.post(
        f"{V3}/keys/signatures/upload", json={alice.user_id: {alice.device_id: signed_device}}
    )
    assert r.json() == {"failures": {}}

    r = bob.client.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}})
    assert_matches_spec(r, "post", "/_matrix/client/v3/keys/query")
    shown = r.json()["device_keys"][alice.user_id][alice.device_id]
    assert shown["signatures"] == signed_device["signatures"]
    assert r.json()["master_keys"][alice.user_id] == body["master_key"]
    assert r.json()["self_signing_keys"][alice.user_id] == body["self_signing_key"]
    assert alice.user_id not in r.json()["user_signing_keys"]  # the owner's alone
    mine = alice.client.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}})
    assert mine.json()["user_signing_keys"][alice.user_id] == body["user_signing_key"]


def test_logout_forgets_the_device_keys(server, device):
    alice, bob = device("alice"), device("bob")
    alice.upload(device_keys=alice.device_keys(), one_time_keys=alice.one_time_keys(1))
    assert alice.client.post(f"{V3}/logout", json={}).status_code == 200
    r = bob.client.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}})
    assert r.json()["device_keys"][alice.user_id] == {}
