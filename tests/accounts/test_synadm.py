"""The real synadm CLI (requirements-dev.txt) against the real server: each command exits 0
and its effect is checked on the server through the client API."""

import itertools
import json
import subprocess
import sys
import time
from urllib.parse import quote

import pytest

from tests.rooms.conftest import V3, create_room
from tests.support.admin import register_admin
from tests.support.server import MatrixClient, WeirProcess, base_settings

_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("weir")
    proc = WeirProcess(str(directory), base_settings(str(directory / "data"))).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def admin(server):
    return register_admin(server.client_url, "synadmin")


@pytest.fixture(scope="module")
def synadm(server, admin, tmp_path_factory):
    """synadm(*args) runs the CLI non-interactively with a config file for the test server
    and the admin's token, and returns its output; the exit status must be 0."""
    config = tmp_path_factory.mktemp("synadm") / "synadm.yaml"
    config.write_text(
        "\n".join(
            [
                "user: synadmin",
                f"token: {admin.token}",
                "protocol: http",
                f"base_url: {server.client_url}",
                "admin_path: /_synapse/admin",
                "matrix_path: /_matrix",
                "format: json",
                "timeout: 30",
                "server_discovery: well-known",
                "homeserver: weir.test",  # no discovery needed for local media
                "ssl_verify: false",
            ]
        )
        + "\n"
    )

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "synadm", "-c", str(config), "--batch", "-o", "json", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        # synadm logs a server's refusal as a warning and may still exit 0: none expected.
        assert "returned status code" not in done.stderr, (args, done.stderr)
        return done.stdout

    return run


@pytest.fixture
def user(server):
    def make(prefix: str) -> MatrixClient:
        client = MatrixClient(server.client_url)
        client.user_id = client.register(f"{prefix}{next(_names)}")["user_id"]
        return client

    return make


def q(value: str) -> str:
    return quote(value, safe="")


def login_status(server, user_id: str) -> int:
    r = MatrixClient(server.client_url).post(
        f"{V3}/login",
        auth=False,
        json={"type": "m.login.password", "user": user_id, "password": "correct horse battery"},
    )
    return r.status_code


def test_user_list_modify_and_deactivate(server, admin, synadm, user):
    alice, bob = user("alice"), user("bob")
    listed = json.loads(synadm("user", "list"))
    names = [u["name"] for u in listed["users"]]
    assert alice.user_id in names and bob.user_id in names and listed["total"] >= 3

    synadm("user", "modify", alice.user_id, "--display-name", "Alice A.", "--admin")
    details = admin.get(f"/_synapse/admin/v2/users/{q(alice.user_id)}").json()
    assert details["displayname"] == "Alice A." and details["admin"] is True
    assert alice.get("/_synapse/admin/v2/users").status_code == 200  # now an admin

    room = create_room(alice, preset="public_chat")
    assert bob.post(f"{V3}/join/{q(room)}", json={}).status_code == 200
    synadm("user", "deactivate", bob.user_id)
    assert login_status(server, bob.user_id) == 403
    assert bob.get(f"{V3}/account/whoami").status_code == 401
    members = alice.get(f"{V3}/rooms/{q(room)}/joined_members").json()["joined"]
    assert list(members) == [alice.user_id]


def test_room_list_details_and_delete(server, admin, synadm, user):
    owner, member = user("owner"), user("member")
    room = create_room(owner, preset="public_chat", name="Synadm Room")
    assert member.post(f"{V3}/join/{q(room)}", json={}).status_code == 200

    rooms = json.loads(synadm("room", "list"))["rooms"]
    listed = next(r for r in rooms if r["room_id"] == room)
    assert listed["name"] == "Synadm Room" and listed["joined_local_members"] == 2
    details = json.loads(synadm("room", "details", room))
    assert details["room_id"] == room and details["creator"] == owner.user_id

    synadm("room", "delete", room)
    # The deletion runs on its own (v2); wait for its status, as synadm's delete-status.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        results = admin.get(f"/_synapse/admin/v2/rooms/{q(room)}/delete_status").json()
        if results["results"][0]["status"] != "active":
            break
        time.sleep(0.05)
    assert results["results"][0]["status"] == "complete", results
    for client in (owner, member):
        assert client.get(f"{V3}/joined_rooms").json()["joined_rooms"] == []
    assert admin.get(f"/_synapse/admin/v1/rooms/{q(room)}").status_code == 404


def test_media_quarantine(synadm, user):
    uploader = user("uploader")
    r = uploader.post(
        "/_matrix/media/v3/upload",
        params={"filename": "a.txt"},
        data=b"quarantine me",
        headers={"Content-Type": "text/plain"},
    )
    media_id = r.json()["content_uri"].rsplit("/", 1)[1]
    download = f"/_matrix/client/v1/media/download/weir.test/{media_id}"
    assert uploader.get(download).status_code == 200
    listed = json.loads(synadm("user", "media", uploader.user_id))
    assert [m["media_id"] for m in listed["media"]] == [media_id]
    synadm("media", "quarantine", "--media-id", media_id)
    assert uploader.get(download).status_code == 404

    room = create_room(uploader)
    message = {"msgtype": "m.file", "body": "a.txt", "url": f"mxc://weir.test/{media_id}"}
    sent = uploader.put(f"{V3}/rooms/{q(room)}/send/m.room.message/t1", json=message)
    assert sent.status_code == 200
    in_room = json.loads(synadm("media", "list", "--room-id", room))
    assert in_room == {"local": [f"mxc://weir.test/{media_id}"], "remote": []}


def test_registration_tokens(server, synadm):
    made = json.loads(synadm("regtok", "new", "--uses-allowed", "1"))
    token = made["token"]
    assert len(token) == 16 and made["uses_allowed"] == 1
    listed = json.loads(synadm("regtok", "list"))["registration_tokens"]
    assert token in [t["token"] for t in listed]
    validity = MatrixClient(server.client_url).get(
        "/_matrix/client/v1/register/m.login.registration_token/validity",
        auth=False,
        params={"token": token},
    )
    assert validity.json() == {"valid": True}
