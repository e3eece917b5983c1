"""Token-authenticated registration on the real server (SQLite and PostgreSQL): a token's
uses are counted pending then completed, a spent or expired token is refused with the
flows, the validity endpoint agrees, and without `requires_token` there is no token stage."""

import time

import pytest

from tests.support.admin import register_admin
from tests.support.server import MatrixClient, WeirProcess, base_settings

REGISTER = "/_matrix/client/v3/register"
VALIDITY = "/_matrix/client/v1/register/m.login.registration_token/validity"
TOKENS = "/_synapse/admin/v1/registration_tokens"
TOKEN_FLOW = [{"stages": ["m.login.registration_token", "m.login.dummy"]}]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("weir")
    settings = base_settings(str(directory / "data"))
    settings["registration"]["requires_token"] = True
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def admin(server):
    return register_admin(server.client_url, "tokenadmin")


def start(client: MatrixClient, username: str) -> str:
    r = client.post(REGISTER, auth=False, json={"username": username, "password": "pw"})
    assert r.status_code == 401, r.text
    assert r.json()["flows"] == TOKEN_FLOW
    return r.json()["session"]


def token_stage(client: MatrixClient, username: str, session: str, token: str):
    return client.post(
        REGISTER,
        auth=False,
        json={
            "username": username,
            "password": "pw",
            "auth": {"type": "m.login.registration_token", "token": token, "session": session},
        },
    )


def dummy_stage(client: MatrixClient, username: str, session: str):
    return client.post(
        REGISTER,
        auth=False,
        json={
            "username": username,
            "password": "pw",
            "auth": {"type": "m.login.dummy", "session": session},
        },
    )


def valid(client: MatrixClient, token: str) -> bool:
    r = client.get(VALIDITY, auth=False, params={"token": token})
    assert r.status_code == 200, r.text
    return r.json()["valid"]


def new_token(admin: MatrixClient, **body) -> dict:
    r = admin.post(f"{TOKENS}/new", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_one_use_token_registers_one_user(server, admin):
    client = MatrixClient(server.client_url)
    token = new_token(admin, uses_allowed=1)["token"]
    assert valid(client, token)

    session = start(client, "first")
    # The dummy stage alone does not do: the token stage comes first.
    skipped = dummy_stage(client, "first", session)
    assert skipped.status_code == 401 and skipped.json().get("completed") is None
    passed = token_stage(client, "first", session, token)
    assert passed.status_code == 401, passed.text
    assert passed.json()["completed"] == ["m.login.registration_token"]
    assert "errcode" not in passed.json()
    # Pending: the session holds the one use, so the token is spent for anyone else.
    assert admin.get(f"{TOKENS}/{token}").json() == {
        "token": token,
        "uses_allowed": 1,
        "pending": 1,
        "completed": 0,
        "expiry_time": None,
    }
    assert not valid(client, token)

    done = dummy_stage(client, "first", session)
    assert done.status_code == 200, done.text
    assert done.json()["user_id"] == "@first:weir.test"
    details = admin.get(f"{TOKENS}/{token}").json()
    assert (details["pending"], details["completed"]) == (0, 1)

    second = start(client, "second")
    refused = token_stage(client, "second", second, token)
    assert refused.status_code == 401
    body = refused.json()
    assert body["errcode"] == "M_FORBIDDEN"
    assert body["flows"] == TOKEN_FLOW and body["session"] == second
    assert dummy_stage(client, "second", second).status_code == 401
    assert not valid(client, token)
    assert (
        MatrixClient(server.client_url)
        .post(
            "/_matrix/client/v3/login",
            auth=False,
            json={"type": "m.login.password", "user": "second", "password": "pw"},
        )
        .status_code
        == 403
    )


def test_unknown_and_expired_tokens_are_refused(server, admin):
    client = MatrixClient(server.client_url)
    assert not valid(client, "no-such-token")
    assert not valid(client, "not a token!")
    session = start(client, "nobody")
    assert token_stage(client, "nobody", session, "no-such-token").json()["errcode"] == (
        "M_FORBIDDEN"
    )

    expiry = int(time.time() * 1000) + 1500
    token = new_token(admin, token="short-lived", expiry_time=expiry)["token"]
    assert token == "short-lived" and valid(client, token)
    # Wait for the clock to pass the expiry (a deadline, not a guess at a server's pace).
    time.sleep(max(0.0, expiry / 1000 - time.time()) + 0.05)
    assert not valid(client, token)
    late = start(client, "late")
    assert token_stage(client, "late", late, token).json()["errcode"] == "M_FORBIDDEN"

    # An admin makes it valid again, without an expiry and for any number of uses.
    changed = admin.put(f"{TOKENS}/{token}", json={"expiry_time": None})
    assert changed.status_code == 200 and changed.json()["expiry_time"] is None
    assert valid(client, token)
    assert token_stage(client, "late", late, token).status_code == 401
    assert dummy_stage(client, "late", late).status_code == 200


def test_validity_needs_a_token(server):
    r = MatrixClient(server.client_url).get(VALIDITY, auth=False)
    assert r.status_code == 400 and r.json()["errcode"] == "M_MISSING_PARAM"


def test_without_requires_token_there_is_no_token_stage(client):
    first = client.post(REGISTER, auth=False, json={"username": "open", "password": "pw"})
    assert first.status_code == 401
    assert first.json()["flows"] == [{"stages": ["m.login.dummy"]}]
    token_tried = token_stage(client, "open", first.json()["session"], "anything")
    assert token_tried.status_code == 401 and "completed" not in token_tried.json()
    assert dummy_stage(client, "open", first.json()["session"]).status_code == 200
