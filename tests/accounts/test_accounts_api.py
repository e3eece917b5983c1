"""Accounts over HTTP against the real server process."""

import hashlib
import hmac

import requests
from signedjson.key import decode_verify_key_bytes
from signedjson.sign import verify_signed_json
from unpaddedbase64 import decode_base64

from tests.support.server import MatrixClient, run_app

V3 = "/_matrix/client/v3"


def test_register_login_whoami_logout(client):
    registered = client.register("alice")
    assert registered["user_id"] == "@alice:weir.test"
    assert registered["device_id"]
    assert client.get(f"{V3}/account/whoami").json() == {
        "user_id": "@alice:weir.test",
        "device_id": registered["device_id"],
        "is_guest": False,
    }

    other = MatrixClient(client.base_url)
    logged_in = other.login("alice")
    assert logged_in["access_token"] != registered["access_token"]
    assert other.get(f"{V3}/account/whoami").json()["user_id"] == "@alice:weir.test"

    assert other.post(f"{V3}/logout", json={}).json() == {}
    gone = other.get(f"{V3}/account/whoami")
    assert gone.status_code == 401
    assert gone.json()["errcode"] == "M_UNKNOWN_TOKEN"
    # The first session is untouched by the second one's logout.
    assert client.get(f"{V3}/account/whoami").status_code == 200


def test_logout_all_ends_every_session(client):
    client.register("bob")
    second = MatrixClient(client.base_url)
    second.login("@bob:weir.test")
    assert client.post(f"{V3}/logout/all", json={}).status_code == 200
    for c in (client, second):
        assert c.get(f"{V3}/account/whoami").json()["errcode"] == "M_UNKNOWN_TOKEN"


def test_a_token_that_ends_is_refused_at_once_though_it_was_just_used(client):
    """Each token is used (and so cached) right before the change that ends it."""
    client.register("erin")
    phone, laptop = MatrixClient(client.base_url), MatrixClient(client.base_url)
    for c in (phone, laptop):
        c.login("erin")
    old_phone = MatrixClient(client.base_url, phone.token)

    # A login that names the phone's device ID replaces the phone's token.
    phone_device = phone.get(f"{V3}/account/whoami").json()["device_id"]
    relogin = phone.post(
        f"{V3}/login",
        auth=False,
        json={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "erin"},
            "password": "correct horse battery",
            "device_id": phone_device,
        },
    )
    assert relogin.json()["device_id"] == phone_device
    phone.token = relogin.json()["access_token"]
    assert old_phone.get(f"{V3}/account/whoami").json()["errcode"] == "M_UNKNOWN_TOKEN"
    assert phone.get(f"{V3}/account/whoami").json()["device_id"] == phone_device

    # Deleting a device from another session ends that device's token.
    laptop_device = laptop.get(f"{V3}/account/whoami").json()["device_id"]
    auth = {"type": "m.login.password", "user": "erin", "password": "correct horse battery"}
    deleted = client.delete(f"{V3}/devices/{laptop_device}", json={"auth": auth})
    assert deleted.status_code == 200, deleted.text
    gone = laptop.get(f"{V3}/account/whoami")
    assert (gone.status_code, gone.json()["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    assert client.get(f"{V3}/account/whoami").status_code == 200


def test_token_in_query_parameter(client):
    token = client.register("carol")["access_token"]
    r = client.get(f"{V3}/account/whoami", auth=False, params={"access_token": token})
    assert r.json()["user_id"] == "@carol:weir.test"


def test_login_errors(client):
    client.register("dave", "right password")
    anon = MatrixClient(client.base_url)
    wrong = anon.post(
        f"{V3}/login", json={"type": "m.login.password", "user": "dave", "password": "wrong"}
    )
    assert (wrong.status_code, wrong.json()["errcode"]) == (403, "M_FORBIDDEN")
    nobody = anon.post(
        f"{V3}/login",
        json={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": "nobody"},
            "password": "x",
        },
    )
    assert (nobody.status_code, nobody.json()["errcode"]) == (403, "M_FORBIDDEN")
    # The old top-level "user" field works as well as an identifier.
    ok = anon.post(
        f"{V3}/login",
        json={"type": "m.login.password", "user": "dave", "password": "right password"},
    )
    assert ok.status_code == 200
    # An email typed into the login form: a clear "not supported", not a schema complaint.
    email = anon.post(
        f"{V3}/login",
        json={
            "type": "m.login.password",
            "password": "x",
            "identifier": {"type": "m.id.thirdparty", "medium": "email", "address": "d@x.test"},
        },
    )
    assert (email.status_code, email.json()["errcode"]) == (400, "M_UNKNOWN")
    assert "m.id.user" in email.json()["error"]
    unknown_type = anon.post(f"{V3}/login", json={"type": "m.login.magic"})
    assert (unknown_type.status_code, unknown_type.json()["errcode"]) == (400, "M_UNKNOWN")
    missing = anon.post(f"{V3}/login", json={"type": "m.login.password", "user": "dave"})
    assert (missing.status_code, missing.json()["errcode"]) == (400, "M_MISSING_PARAM")
    assert "password" in missing.json()["error"]
    assert anon.get(f"{V3}/login").json() == {"flows": [{"type": "m.login.password"}]}


def test_registration_errors(client):
    client.register("erin")
    anon = MatrixClient(client.base_url)
    taken = anon.post(f"{V3}/register", json={"username": "erin", "password": "x"})
    assert (taken.status_code, taken.json()["errcode"]) == (400, "M_USER_IN_USE")
    bad = anon.post(f"{V3}/register", json={"username": "Er!n", "password": "x"})
    assert (bad.status_code, bad.json()["errcode"]) == (400, "M_INVALID_USERNAME")
    flows = anon.post(f"{V3}/register", json={"username": "frank", "password": "x"})
    assert flows.status_code == 401
    assert flows.json()["flows"] == [{"stages": ["m.login.dummy"]}]
    stale = anon.post(
        f"{V3}/register",
        json={
            "username": "frank",
            "password": "x",
            "auth": {"type": "m.login.dummy", "session": "not-a-session"},
        },
    )
    assert stale.status_code == 401

    assert anon.get(f"{V3}/register/available", params={"username": "nobody"}).json() == {
        "available": True
    }
    used = anon.get(f"{V3}/register/available", params={"username": "erin"})
    assert (used.status_code, used.json()["errcode"]) == (400, "M_USER_IN_USE")
    guest = anon.post(f"{V3}/register", params={"kind": "guest"}, json={})
    assert guest.status_code == 403
    # The spec's kinds are `user` and `guest`; anything else is not a normal registration.
    odd = anon.post(f"{V3}/register", params={"kind": "admin"}, json={})
    assert (odd.status_code, odd.json()["errcode"]) == (400, "M_INVALID_PARAM")


def test_a_name_ending_in_a_newline_is_not_a_localpart(client, weir):
    # User identifiers (spec, Appendices): the localpart is only a-z 0-9 . _ = - / +; a
    # regex ending in `$` would also let a trailing newline through.
    anon = MatrixClient(client.base_url)
    bad = anon.post(f"{V3}/register", json={"username": "nina\n", "password": "x"})
    assert (bad.status_code, bad.json()["errcode"]) == (400, "M_INVALID_USERNAME")
    result = run_app(
        ["register-user", "nina\n", "--password", "pw", "--config", weir.config_path],
        cwd=weir.directory,
    )
    assert result.returncode == 1 and "M_INVALID_USERNAME" in result.stderr, result.stdout


def test_inhibit_login(client):
    first = client.post(f"{V3}/register", auth=False, json={"username": "gina", "password": "p"})
    r = client.post(
        f"{V3}/register",
        auth=False,
        json={
            "username": "gina",
            "password": "p",
            "inhibit_login": True,
            "auth": {"type": "m.login.dummy", "session": first.json()["session"]},
        },
    )
    assert r.json() == {"user_id": "@gina:weir.test"}


def test_registration_disabled_is_forbidden(start_weir):
    weir = start_weir({"registration": {"enabled": False}})
    r = requests.post(weir.url(f"{V3}/register"), json={"username": "x", "password": "y"})
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")


def test_login_is_rate_limited_per_client_key(start_weir):
    weir = start_weir({"ratelimiting": {"login": {"max_requests": 2, "per_seconds": 600}}})
    body = {"type": "m.login.password", "user": "nobody", "password": "x"}
    statuses = [requests.post(weir.url(f"{V3}/login"), json=body).status_code for _ in range(3)]
    assert statuses == [403, 403, 429]
    limited = requests.post(weir.url(f"{V3}/login"), json=body)
    assert limited.json()["errcode"] == "M_LIMIT_EXCEEDED"
    assert limited.json()["retry_after_ms"] > 0
    assert int(limited.headers["Retry-After"]) >= 1


def test_shared_secret_admin_registration(weir):
    url = weir.url("/_synapse/admin/v1/register")
    nonce = requests.get(url).json()["nonce"]
    mac = hmac.new(
        b"test-shared-secret",
        b"\x00".join([nonce.encode(), b"root", b"pw", b"admin"]),
        hashlib.sha1,
    ).hexdigest()
    r = requests.post(
        url, json={"nonce": nonce, "username": "root", "password": "pw", "admin": True, "mac": mac}
    )
    assert r.status_code == 200, r.text
    assert r.json()["user_id"] == "@root:weir.test"
    # A nonce is single-use.
    again = requests.post(
        url, json={"nonce": nonce, "username": "root2", "password": "pw", "admin": True, "mac": mac}
    )
    assert again.status_code == 400
    nonce = requests.get(url).json()["nonce"]
    bad = requests.post(
        url, json={"nonce": nonce, "username": "x", "password": "pw", "mac": "00" * 20}
    )
    assert (bad.status_code, bad.json()["errcode"]) == (403, "M_FORBIDDEN")


def test_register_user_command(weir, tmp_path):
    result = run_app(
        [
            "register-user",
            "operator",
            "--password",
            "s3cret",
            "--admin",
            "--config",
            weir.config_path,
        ],
        cwd=weir.directory,
    )
    assert result.returncode == 0, result.stderr
    assert "@operator:weir.test" in result.stdout
    MatrixClient(weir.client_url).login("operator", "s3cret")
    again = run_app(
        ["register-user", "operator", "--password", "x", "--config", weir.config_path],
        cwd=weir.directory,
    )
    assert again.returncode == 1
    assert "M_USER_IN_USE" in again.stderr


def test_passwords_and_tokens_are_stored_hashed(weir):
    import sqlite3

    c = MatrixClient(weir.client_url)
    token = c.register("hank", "plain-text-password")["access_token"]
    db = sqlite3.connect(f"{weir.directory}/data/homeserver.db")
    dump = "\n".join(db.iterdump())
    assert "plain-text-password" not in dump
    assert token not in dump
    assert hashlib.sha256(token.encode()).hexdigest() in dump
    (stored,) = db.execute(
        "SELECT password_hash FROM users WHERE user_id = ?", ("@hank:weir.test",)
    ).fetchone()
    assert stored.startswith("scrypt$")


def _verify_key_document(doc: dict, server_name: str):
    for key_id, key in doc["verify_keys"].items():
        algorithm, version = key_id.split(":")
        verify_key = decode_verify_key_bytes(key_id, decode_base64(key["key"]))
        verify_signed_json(doc, server_name, verify_key)
        return key_id


def test_signing_key_document_verifies_and_survives_restart(start_weir):
    weir = start_weir()
    doc = requests.get(weir.fed_url("/_matrix/key/v2/server")).json()
    assert doc["server_name"] == "weir.test"
    key_id = _verify_key_document(doc, "weir.test")
    assert key_id.startswith("ed25519:a_") and len(key_id) == len("ed25519:a_XXXX")
    assert doc["valid_until_ts"] > 0
    assert weir.stop() == 0

    again = start_weir()  # same directory, same data_dir
    doc2 = requests.get(again.fed_url("/_matrix/key/v2/server")).json()
    assert _verify_key_document(doc2, "weir.test") == key_id
    assert doc2["verify_keys"] == doc["verify_keys"]


def test_federation_version(weir):
    body = requests.get(weir.fed_url("/_matrix/federation/v1/version")).json()
    assert body["server"]["name"] == "Weir"
