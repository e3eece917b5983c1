"""Account settings on the real server (SQLite and PostgreSQL): changing the password and
deactivating the account behind user-interactive auth, third-party identifiers refused,
OpenID tokens checked through the federation listener, TURN credentials, and what
/capabilities says of them; and a deactivation seen by a server sharing the room."""

import base64
import hashlib
import hmac
import itertools
import json
import os
import socket
import sqlite3
import time
from urllib.parse import quote, urlsplit

import pytest
import requests
from gevent.event import Event

from tests.e2ee.conftest import Device
from tests.peers.origins import OriginKeyServer, federation_request
from tests.peers.receiver import TransactionSink
from tests.rooms.conftest import create_room, whoami
from tests.rooms.test_federation_membership import invite_pdu
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec

V3 = "/_matrix/client/v3"
PASSWORD = "correct horse battery"
TURN = {
    "turn_uris": ["turn:turn.weir.test:3478?transport=udp", "turns:turn.weir.test:5349"],
    "turn_shared_secret": "turn-secret-for-tests",
    "turn_user_lifetime": 600,
}
_names = itertools.count()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("settings")
    settings = merge(base_settings(str(directory / "data")), {"voip": TURN})
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(str(directory), settings).start()
    proc.database_url = settings.get("database", {}).get(
        "url", f"sqlite:///{directory}/data/homeserver.db"
    )
    yield proc
    proc.stop()


@pytest.fixture
def user(server):
    def make(prefix: str = "user") -> MatrixClient:
        client = MatrixClient(server.client_url)
        client.register(f"{prefix}{next(_names)}", PASSWORD)
        client.user_id = whoami(client)
        return client

    return make


def execute(server, sql: str, params: tuple) -> None:
    """A write to the database the server uses (`?` placeholders)."""
    url = server.database_url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///") :])
        try:
            with conn:
                conn.execute(sql, params)
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(sql.replace("?", "%s"), params)


def password_auth(client, password: str = PASSWORD, session: str | None = None) -> dict:
    auth = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": client.user_id},
        "password": password,
    }
    return {**auth, "session": session} if session else auth


def login(server, user_id: str, password: str = PASSWORD) -> requests.Response:
    return MatrixClient(server.client_url).post(
        f"{V3}/login",
        auth=False,
        json={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user_id},
            "password": password,
        },
    )


def logged_in(server, client) -> MatrixClient:
    """Another device of the same user."""
    r = login(server, client.user_id)
    assert r.status_code == 200, r.text
    other = MatrixClient(server.client_url, r.json()["access_token"])
    other.user_id = client.user_id
    return other


def q(value: str) -> str:
    return quote(value, safe="")


# --- capabilities ------------------------------------------------------------------------


def test_capabilities_say_what_the_server_does(user):
    r = user("caps").get(f"{V3}/capabilities")
    assert r.status_code == 200, r.text
    caps = r.json()["capabilities"]
    assert caps["m.change_password"] == {"enabled": True}
    assert caps["m.3pid_changes"] == {"enabled": False}
    assert caps["m.set_displayname"] == caps["m.set_avatar_url"] == {"enabled": True}


# --- password ----------------------------------------------------------------------------


def test_password_change_asks_for_the_old_one_and_logs_other_devices_out(server, user):
    alice = user("pw")
    phone = logged_in(server, alice)
    path = f"{V3}/account/password"

    first = alice.post(path, json={"new_password": "new one"})
    assert first.status_code == 401, first.text
    assert_matches_spec(first, "post", path)
    body = first.json()
    assert body["flows"] == [{"stages": ["m.login.password"]}] and "errcode" not in body

    wrong = alice.post(
        path,
        json={"new_password": "new one", "auth": password_auth(alice, "nope", body["session"])},
    )
    assert wrong.status_code == 401, wrong.text
    assert wrong.json()["errcode"] == "M_FORBIDDEN"
    assert wrong.json()["flows"] == [{"stages": ["m.login.password"]}]
    assert login(server, alice.user_id).status_code == 200  # unchanged so far

    assert alice.post(path, json={"auth": password_auth(alice)}).json()["errcode"] == (
        "M_MISSING_PARAM"
    )
    r = alice.post(
        path,
        json={"new_password": "new one", "auth": password_auth(alice, session=body["session"])},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {}

    assert phone.get(f"{V3}/account/whoami").json()["errcode"] == "M_UNKNOWN_TOKEN"
    assert alice.get(f"{V3}/account/whoami").status_code == 200  # the current device stays
    devices = alice.get(f"{V3}/devices").json()["devices"]
    assert [d["device_id"] for d in devices] == [
        alice.get(f"{V3}/account/whoami").json()["device_id"]
    ]
    old = login(server, alice.user_id)
    assert (old.status_code, old.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert login(server, alice.user_id, "new one").status_code == 200


def test_password_change_may_keep_other_devices(server, user):
    bob = user("pwkeep")
    laptop = logged_in(server, bob)
    r = bob.post(
        f"{V3}/account/password",
        json={"new_password": "second", "logout_devices": False, "auth": password_auth(bob)},
    )
    assert r.status_code == 200, r.text
    assert laptop.get(f"{V3}/account/whoami").status_code == 200
    assert login(server, bob.user_id, "second").status_code == 200
    bad = bob.post(f"{V3}/account/password", json={"new_password": 5, "auth": password_auth(bob)})
    assert (bad.status_code, bad.json()["errcode"]) == (400, "M_BAD_JSON")


# --- deactivation ------------------------------------------------------------------------


def members(client, room_id: str) -> dict[str, str]:
    r = client.get(f"{V3}/rooms/{q(room_id)}/members")
    assert r.status_code == 200, r.text
    return {e["state_key"]: e["content"]["membership"] for e in r.json()["chunk"]}


def test_deactivation_leaves_rooms_rejects_invites_and_refuses_login(server, user):
    alice, bob = user("gone"), user("stays")
    r = alice.post(f"{V3}/keys/upload", json={"device_keys": Device(alice).device_keys()})
    assert r.status_code == 200, r.text
    assert alice.put(f"{V3}/profile/{q(alice.user_id)}/displayname", json={"displayname": "Al"})
    joined = create_room(bob, preset="public_chat")
    assert alice.post(f"{V3}/join/{q(joined)}", json={}).status_code == 200
    invited = create_room(bob)
    assert bob.post(f"{V3}/rooms/{q(invited)}/invite", json={"user_id": alice.user_id}).ok

    path = f"{V3}/account/deactivate"
    challenge = alice.post(path, json={})
    assert challenge.status_code == 401 and challenge.json()["flows"]
    wrong = alice.post(path, json={"auth": password_auth(alice, "wrong")})
    assert (wrong.status_code, wrong.json()["errcode"]) == (401, "M_FORBIDDEN")
    assert alice.get(f"{V3}/account/whoami").status_code == 200  # still there

    r = alice.post(path, json={"auth": password_auth(alice), "erase": True})
    assert r.status_code == 200, r.text
    assert r.json() == {"id_server_unbind_result": "no-support"}
    assert_matches_spec(r, "post", path)

    assert alice.get(f"{V3}/account/whoami").json()["errcode"] == "M_UNKNOWN_TOKEN"
    refused = login(server, alice.user_id)
    assert (refused.status_code, refused.json()["errcode"]) == (403, "M_USER_DEACTIVATED")
    guessed = login(server, alice.user_id, "a guess")
    assert (guessed.status_code, guessed.json()["errcode"]) == (403, "M_FORBIDDEN")
    again = MatrixClient(server.client_url).post(
        f"{V3}/register",
        auth=False,
        json={"username": alice.user_id[1:].split(":")[0], "password": "x"},
    )
    assert (again.status_code, again.json()["errcode"]) == (400, "M_USER_IN_USE")

    assert members(bob, joined)[alice.user_id] == "leave"
    assert members(bob, invited)[alice.user_id] == "leave"
    assert bob.get(f"{V3}/profile/{q(alice.user_id)}").json() == {}
    keys = bob.post(f"{V3}/keys/query", json={"device_keys": {alice.user_id: []}}).json()
    assert keys["device_keys"].get(alice.user_id, {}) == {}


def test_deactivation_without_erase_keeps_the_profile(user):
    carol = user("keep")
    carol.put(f"{V3}/profile/{q(carol.user_id)}/displayname", json={"displayname": "Carol"})
    r = carol.post(f"{V3}/account/deactivate", json={"auth": password_auth(carol)})
    assert r.status_code == 200, r.text
    reader = user("reader")
    assert reader.get(f"{V3}/profile/{q(carol.user_id)}").json() == {"displayname": "Carol"}


# --- third-party identifiers -------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/register/email/requestToken",
        "/register/msisdn/requestToken",
        "/account/password/email/requestToken",
        "/account/password/msisdn/requestToken",
        "/account/3pid/email/requestToken",
        "/account/3pid/msisdn/requestToken",
    ],
)
def test_no_validation_token_is_ever_sent(server, path):
    body = {"client_secret": "s3cret", "email": "a@example.org", "send_attempt": 1}
    r = MatrixClient(server.client_url).post(V3 + path, auth=False, json=body)
    assert (r.status_code, r.json()["errcode"]) == (403, "M_THREEPID_DENIED"), r.text


def test_threepids_are_none_and_none_can_be_added(user):
    dave = user("threepid")
    r = dave.get(f"{V3}/account/3pid")
    assert (r.status_code, r.json()) == (200, {"threepids": []})
    assert_matches_spec(r, "get", f"{V3}/account/3pid")
    session = {"client_secret": "s3cret", "sid": "1", "auth": password_auth(dave)}
    for path in ("/account/3pid/add", "/account/3pid/bind", "/account/3pid"):
        extra = {"id_server": "id.example.org", "id_access_token": "t"}
        r = dave.post(V3 + path, json={**session, **extra})
        assert (r.status_code, r.json()["errcode"]) == (400, "M_THREEPID_AUTH_FAILED"), path
    for path in ("/account/3pid/delete", "/account/3pid/unbind"):
        r = dave.post(V3 + path, json={"medium": "email", "address": "a@example.org"})
        assert (r.status_code, r.json()) == (200, {"id_server_unbind_result": "no-support"})
        assert dave.post(V3 + path, json={"medium": "email"}).json()["errcode"] == (
            "M_MISSING_PARAM"
        )
    assert MatrixClient(dave.base_url).get(f"{V3}/account/3pid", auth=False).status_code == 401


# --- OpenID ------------------------------------------------------------------------------


def userinfo(server, token: str | None) -> requests.Response:
    params = {"access_token": token} if token is not None else {}
    return requests.get(
        server.fed_url("/_matrix/federation/v1/openid/userinfo"), params=params, timeout=10
    )


def test_openid_token_is_verified_by_the_federation_listener(server, user):
    erin, frank = user("openid"), user("other")
    path = f"{V3}/user/{q(erin.user_id)}/openid/request_token"
    r = erin.post(path, json={})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "post", f"{V3}/user/{{userId}}/openid/request_token")
    token = r.json()
    assert token["token_type"] == "Bearer" and token["expires_in"] == 3600
    assert token["matrix_server_name"] == "weir.test"

    info = userinfo(server, token["access_token"])
    assert (info.status_code, info.json()) == (200, {"sub": erin.user_id})
    assert_matches_spec(info, "get", "/_matrix/federation/v1/openid/userinfo", "server-server")

    theirs = frank.post(path, json={})
    assert (theirs.status_code, theirs.json()["errcode"]) == (403, "M_FORBIDDEN")
    for bad in ("nope", erin.token):  # an access token is no OpenID token
        r = userinfo(server, bad)
        assert (r.status_code, r.json()["errcode"]) == (401, "M_UNKNOWN_TOKEN")
    assert userinfo(server, None).json()["errcode"] == "M_MISSING_TOKEN"

    # Past its expiry, the same token is unknown.
    token_hash = hashlib.sha256(token["access_token"].encode()).hexdigest()
    past = int(time.time() * 1000) - 1
    execute(
        server, "UPDATE openid_tokens SET expires_ts = ? WHERE token_hash = ?", (past, token_hash)
    )
    expired = userinfo(server, token["access_token"])
    assert (expired.status_code, expired.json()["errcode"]) == (401, "M_UNKNOWN_TOKEN")


def test_openid_token_of_a_deactivated_user_is_refused(server, user):
    gina = user("gina")
    token = gina.post(f"{V3}/user/{q(gina.user_id)}/openid/request_token", json={}).json()
    assert userinfo(server, token["access_token"]).status_code == 200
    assert gina.post(f"{V3}/account/deactivate", json={"auth": password_auth(gina)}).ok
    assert userinfo(server, token["access_token"]).status_code == 401


# --- TURN --------------------------------------------------------------------------------


def test_turn_credentials_from_the_shared_secret(user):
    hank = user("turn")
    before = int(time.time())
    r = hank.get(f"{V3}/voip/turnServer")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", f"{V3}/voip/turnServer")
    creds = r.json()
    assert creds["uris"] == TURN["turn_uris"] and creds["ttl"] == 600
    expiry, _, named = creds["username"].partition(":")
    assert named == hank.user_id
    assert before + 600 <= int(expiry) <= int(time.time()) + 600
    mac = hmac.new(TURN["turn_shared_secret"].encode(), creds["username"].encode(), hashlib.sha1)
    assert creds["password"] == base64.b64encode(mac.digest()).decode()
    assert MatrixClient(hank.base_url).get(f"{V3}/voip/turnServer", auth=False).status_code == 401


def test_turn_credentials_static_or_none(start_weir):
    """On SQLite alone: these credentials come from the config, not the database."""
    static = {"turn_uris": ["turn:t.example"], "turn_username": "u", "turn_password": "p"}
    for voip, expected in [
        (static, {"username": "u", "password": "p", "ttl": 86400, "uris": ["turn:t.example"]}),
        ({}, {}),
        ({"turn_shared_secret": "no URIs"}, {}),
    ]:
        weir = start_weir({"voip": voip}, name=f"t{len(voip)}")
        client = MatrixClient(weir.client_url)
        client.register("ivy")
        r = client.get(f"{V3}/voip/turnServer")
        assert (r.status_code, r.json()) == (200, expected)


# --- a deactivation seen by another server -----------------------------------------------


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("settings.test", test_ca, dns, host="127.63.36.2") as key_server:
        yield key_server


@pytest.fixture(scope="module")
def sink(keys):
    return TransactionSink(keys)


@pytest.fixture(scope="module")
def federating(test_ca, dns, tmp_path_factory, sink):
    directory = str(tmp_path_factory.mktemp("settings-fed"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.63.36.1", port=0))
    proc = WeirProcess(
        directory, merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    ).start()
    sink.trust("weir.test", proc.federation_url, test_ca)
    yield proc
    proc.stop()


def remote_invite(federating, test_ca, origin, invitee: str, prefix: str = "far") -> str:
    """An invite of ours from `origin`'s room, which no user of ours is in."""
    room_id = f"!{prefix}{next(_names)}:{origin.name}"
    event_id, pdu = invite_pdu(origin, room_id, invitee)
    r = federation_request(
        federating.federation_url,
        origin,
        "weir.test",
        "PUT",
        f"/_matrix/federation/v2/invite/{q(room_id)}/{q(event_id)}",
        test_ca,
        {"room_version": "10", "event": pdu, "invite_room_state": []},
    )
    assert r.status_code == 200, r.text
    return room_id


def test_a_remote_member_sees_the_leave_and_a_dead_inviter_stops_nothing(
    federating, test_ca, keys, sink
):
    """The room's other server gets the leave through the federation sender; rejecting an
    invite through a server with no make_leave fails, and the deactivation goes on."""
    jane = MatrixClient(federating.client_url)
    jane.register("jane", PASSWORD)
    jane.user_id = whoami(jane)
    origin = keys.add_origin("member")
    room, _ = room_joined_by(federating, test_ca, jane, origin)
    invited_from = keys.add_origin("inviter")
    far_room = remote_invite(federating, test_ca, invited_from, jane.user_id)

    r = jane.post(f"{V3}/account/deactivate", json={"auth": password_auth(jane)})
    assert r.status_code == 200, r.text

    def left() -> bool:
        return any(
            p["type"] == "m.room.member"
            and p["state_key"] == jane.user_id
            and p["content"]["membership"] == "leave"
            and p["room_id"] == room.room_id
            for p in sink.pdus(origin.name)
        )

    assert sink.wait_until(left), sink.attempts(origin.name)
    # The inviter was asked (and could not answer), and her login is refused all the same.
    assert any(
        r.path.startswith(f"/_matrix/federation/v1/make_leave/{far_room}/") for r in keys.requests
    )
    refused = login(federating, jane.user_id)
    assert (refused.status_code, refused.json()["errcode"]) == (403, "M_USER_DEACTIVATED")


def registered_on(weir, name: str) -> MatrixClient:
    client = MatrixClient(weir.client_url)
    client.register(name, PASSWORD)
    client.user_id = whoami(client)
    return client


def test_a_client_that_hangs_up_leaves_no_room_behind(federating, test_ca, keys, sink):
    """The client hangs up while one inviting server is slow to answer make_leave: the
    account can no longer ask again, so the invites after it are still rejected."""
    kim = registered_on(federating, "kim")
    slow_room = remote_invite(federating, test_ca, keys.add_origin("slow"), kim.user_id, "a")
    later_room = remote_invite(federating, test_ca, keys.add_origin("later"), kim.user_id, "b")
    asked, answer = Event(), Event()

    def slow_make_leave(req):
        asked.set()
        answer.wait(30)
        return 404, {"errcode": "M_NOT_FOUND", "error": "Unknown room"}

    keys.route("GET", f"/_matrix/federation/v1/make_leave/{slow_room}/", slow_make_leave, True)
    url = urlsplit(federating.client_url)
    body = json.dumps({"auth": password_auth(kim)}).encode()
    head = (
        f"POST {V3}/account/deactivate HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {kim.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port)) as conn:
        conn.sendall(head.encode() + body)
        assert asked.wait(30)
    # A request answered after the hang-up: the server's hub has seen the connection close.
    assert MatrixClient(federating.client_url).get("/_matrix/client/versions").ok
    answer.set()

    def asked_later() -> bool:
        prefix = f"/_matrix/federation/v1/make_leave/{later_room}/"
        return any(r.path.startswith(prefix) for r in keys.requests)

    assert keys.wait_until(asked_later, timeout=30)  # the peer that is asked
    refused = login(federating, kim.user_id)
    assert (refused.status_code, refused.json()["errcode"]) == (403, "M_USER_DEACTIVATED")
