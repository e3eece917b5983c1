"""Synapse's admin API on the real server (SQLite and PostgreSQL), over raw HTTP: users
(list, details, create and change, deactivate, reset password, whois, joined rooms), rooms
(list, details, members, state, delete with block and purge), media quarantine,
registration tokens and the server version; each refused to anyone but a server admin."""

import itertools
import time
from urllib.parse import quote

import pytest

from tests.rooms.conftest import V3, alias_path, create_room, send
from tests.support.admin import register_admin
from tests.support.server import MatrixClient, WeirProcess, base_settings

ADMIN = "/_synapse/admin"
_names = itertools.count()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("weir")
    settings = base_settings(str(directory / "data"))
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def admin(server):
    return register_admin(server.client_url, "root")


@pytest.fixture
def user(server):
    def make(prefix: str = "user", password: str = "correct horse battery") -> MatrixClient:
        client = MatrixClient(server.client_url)
        client.user_id = client.register(f"{prefix}{next(_names)}", password)["user_id"]
        return client

    return make


def q(value: str) -> str:
    return quote(value, safe="")


def ok(response, status: int = 200) -> dict:
    assert response.status_code == status, response.text
    return response.json()


def login_status(server, user_id: str, password: str) -> int:
    return (
        MatrixClient(server.client_url)
        .post(
            f"{V3}/login",
            auth=False,
            json={"type": "m.login.password", "user": user_id, "password": password},
        )
        .status_code
    )


def wait_for_deletion(admin: MatrixClient, delete_id: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = ok(admin.get(f"{ADMIN}/v2/rooms/delete_status/{delete_id}"))
        if status["status"] != "active":
            return status
        time.sleep(0.05)  # polling the status, as synadm does
    raise AssertionError("the deletion did not finish")


ENDPOINTS = [
    ("GET", "/v1/server_version"),
    ("GET", "/v2/users"),
    ("GET", "/v2/users/@someone:weir.test"),
    ("PUT", "/v2/users/@someone:weir.test"),
    ("POST", "/v1/deactivate/@someone:weir.test"),
    ("POST", "/v1/reset_password/@someone:weir.test"),
    ("GET", "/v1/whois/@someone:weir.test"),
    ("GET", "/v1/users/@someone:weir.test/joined_rooms"),
    ("GET", "/v1/rooms"),
    ("GET", "/v1/rooms/!r:weir.test"),
    ("GET", "/v1/rooms/!r:weir.test/members"),
    ("GET", "/v1/rooms/!r:weir.test/state"),
    ("DELETE", "/v2/rooms/!r:weir.test"),
    ("GET", "/v2/rooms/delete_status/abc"),
    ("POST", "/v1/media/quarantine/weir.test/abc"),
    ("POST", "/v1/media/unquarantine/weir.test/abc"),
    ("GET", "/v1/room/!r:weir.test/media"),
    ("POST", "/v1/room/!r:weir.test/media/quarantine"),
    ("POST", "/v1/user/@someone:weir.test/media/quarantine"),
    ("GET", "/v1/users/@someone:weir.test/media"),
    ("GET", "/v1/registration_tokens"),
    ("POST", "/v1/registration_tokens/new"),
    ("GET", "/v1/registration_tokens/abc"),
    ("PUT", "/v1/registration_tokens/abc"),
    ("DELETE", "/v1/registration_tokens/abc"),
]


def test_only_server_admins_may_call_it(server, user):
    someone = user("plain")
    anonymous = MatrixClient(server.client_url)
    for method, path in ENDPOINTS:
        refused = someone.request(method, ADMIN + path, json={})
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json()["errcode"] == "M_FORBIDDEN"
        assert anonymous.request(method, ADMIN + path, json={}).status_code == 401


def test_server_version(admin):
    assert ok(admin.get(f"{ADMIN}/v1/server_version"))["server_version"]


def test_list_and_read_users(admin, user):
    a, b = user("listed"), user("listed")
    ok(a.put(f"{V3}/profile/{q(a.user_id)}/displayname", json={"displayname": "Zephyrine"}))
    page = ok(admin.get(f"{ADMIN}/v2/users", params={"name": "listed", "limit": 1}))
    assert page["total"] == 2 and len(page["users"]) == 1 and page["next_token"] == "1"
    rest = ok(admin.get(f"{ADMIN}/v2/users", params={"name": "listed", "from": 1}))
    names = [u["name"] for u in page["users"] + rest["users"]]
    assert sorted(names) == sorted([a.user_id, b.user_id]) and "next_token" not in rest
    by_display = ok(admin.get(f"{ADMIN}/v2/users", params={"name": "zephyr"}))["users"]
    assert [(u["name"], u["displayname"]) for u in by_display] == [(a.user_id, "Zephyrine")]
    assert {u["name"]: u["admin"] for u in ok(admin.get(f"{ADMIN}/v2/users"))["users"]}[
        admin.user_id
    ]

    details = ok(admin.get(f"{ADMIN}/v2/users/{q(a.user_id)}"))
    assert details["name"] == a.user_id and details["displayname"] == "Zephyrine"
    assert details["admin"] is False and details["deactivated"] is False
    assert details["creation_ts"] > 0
    assert ok(admin.get(f"{ADMIN}/v2/users/@nobody:weir.test"), 404)["errcode"] == "M_NOT_FOUND"
    assert admin.get(f"{ADMIN}/v2/users/@x:elsewhere.test").status_code == 400
    assert admin.get(f"{ADMIN}/v2/users", params={"limit": "x"}).status_code == 400

    whois = ok(admin.get(f"{ADMIN}/v1/whois/{q(a.user_id)}"))
    device = ok(a.get(f"{V3}/account/whoami"))["device_id"]
    assert whois["user_id"] == a.user_id and list(whois["devices"]) == [device]


def test_create_and_change_a_user(server, admin, user):
    new_id = f"@made{next(_names)}:weir.test"
    created = admin.put(
        f"{ADMIN}/v2/users/{q(new_id)}", json={"password": "first pw", "displayname": "Made"}
    )
    assert ok(created, 201)["name"] == new_id and created.json()["displayname"] == "Made"
    assert login_status(server, new_id, "first pw") == 200

    made = MatrixClient(server.client_url)
    made.login(new_id, "first pw")
    assert made.get(f"{ADMIN}/v2/users").status_code == 403
    assert ok(admin.put(f"{ADMIN}/v2/users/{q(new_id)}", json={"admin": True}))["admin"] is True
    assert made.get(f"{ADMIN}/v2/users").status_code == 200  # the same token, now an admin

    # A new password logs every device out.
    ok(admin.put(f"{ADMIN}/v2/users/{q(new_id)}", json={"password": "second pw"}))
    assert made.get(f"{V3}/account/whoami").status_code == 401
    assert login_status(server, new_id, "first pw") == 403
    assert login_status(server, new_id, "second pw") == 200
    assert admin.put(f"{ADMIN}/v2/users/{q(new_id)}", json={"admin": "yes"}).status_code == 400
    empty = admin.put(f"{ADMIN}/v2/users/@nopw{next(_names)}:weir.test", json={"password": ""})
    assert empty.status_code == 400

    other = user("reset")
    ok(admin.post(f"{ADMIN}/v1/reset_password/{q(other.user_id)}", json={"new_password": "n"}))
    assert other.get(f"{V3}/account/whoami").status_code == 401
    assert login_status(server, other.user_id, "n") == 200


def test_deactivation_logs_out_refuses_login_and_leaves_rooms(server, admin, user):
    owner, leaver = user("owner"), user("leaver")
    room = create_room(owner, preset="public_chat")
    ok(leaver.post(f"{V3}/join/{q(room)}", json={}))
    rooms = ok(admin.get(f"{ADMIN}/v1/users/{q(leaver.user_id)}/joined_rooms"))
    assert rooms == {"joined_rooms": [room], "total": 1}

    done = ok(admin.post(f"{ADMIN}/v1/deactivate/{q(leaver.user_id)}", json={"erase": False}))
    assert done == {"id_server_unbind_result": "success"}
    # The admin action is in the log, with the admin's user ID.
    server.wait_for_log(
        rf"admin {admin.user_id}: POST /_synapse/admin/v1/deactivate/{leaver.user_id}"
    )
    assert leaver.get(f"{V3}/account/whoami").status_code == 401
    assert login_status(server, leaver.user_id, "correct horse battery") == 403
    members = ok(owner.get(f"{V3}/rooms/{q(room)}/joined_members"))["joined"]
    assert leaver.user_id not in members and owner.user_id in members
    assert ok(admin.get(f"{ADMIN}/v1/users/{q(leaver.user_id)}/joined_rooms"))["total"] == 0
    assert ok(admin.get(f"{ADMIN}/v2/users/{q(leaver.user_id)}"))["deactivated"] is True

    listed = ok(admin.get(f"{ADMIN}/v2/users", params={"name": "leaver"}))["users"]
    assert leaver.user_id not in [u["name"] for u in listed]
    with_deactivated = admin.get(
        f"{ADMIN}/v2/users", params={"name": "leaver", "deactivated": "true"}
    )
    assert leaver.user_id in [u["name"] for u in ok(with_deactivated)["users"]]

    # Reactivating needs a password (it lost its own), and a refusal changes nothing.
    refused = admin.put(
        f"{ADMIN}/v2/users/{q(leaver.user_id)}", json={"deactivated": False, "admin": True}
    )
    assert refused.status_code == 400 and refused.json()["errcode"] == "M_INVALID_PARAM"
    assert ok(admin.get(f"{ADMIN}/v2/users/{q(leaver.user_id)}"))["admin"] is False
    # Reactivated with a new password, the account logs in again.
    back = admin.put(
        f"{ADMIN}/v2/users/{q(leaver.user_id)}", json={"deactivated": False, "password": "back"}
    )
    assert ok(back)["deactivated"] is False
    assert login_status(server, leaver.user_id, "back") == 200


def test_list_read_and_delete_rooms(admin, user):
    owner, guest = user("roomowner"), user("roomguest")
    alias_name = f"doomed{next(_names)}"
    room = create_room(owner, preset="public_chat", name="Doomed Room", room_alias_name=alias_name)
    ok(guest.post(f"{V3}/join/{q(room)}", json={}))
    send(owner, room, "hello")
    ok(owner.put(f"{V3}/directory/list/room/{q(room)}", json={"visibility": "public"}))

    page = ok(admin.get(f"{ADMIN}/v1/rooms", params={"search_term": "doomed"}))
    assert page["total_rooms"] == 1 and page["offset"] == 0
    listed = page["rooms"][0]
    assert listed["room_id"] == room and listed["name"] == "Doomed Room"
    assert listed["canonical_alias"] == f"#{alias_name}:weir.test"
    assert (listed["joined_members"], listed["joined_local_members"]) == (2, 2)
    assert listed["version"] == "12" and listed["creator"] == owner.user_id
    assert listed["public"] is True and listed["join_rules"] == "public"
    assert listed["federatable"] is True and listed["encryption"] is None
    assert listed["state_events"] >= 6
    assert admin.get(f"{ADMIN}/v1/rooms", params={"order_by": "nope"}).status_code == 400
    ordered = ok(admin.get(f"{ADMIN}/v1/rooms", params={"order_by": "joined_members", "dir": "b"}))
    counts = [r["joined_members"] for r in ordered["rooms"]]
    assert counts == sorted(counts, reverse=True)

    details = ok(admin.get(f"{ADMIN}/v1/rooms/{q(room)}"))
    assert details["room_id"] == room and details["blocked"] is False
    members = ok(admin.get(f"{ADMIN}/v1/rooms/{q(room)}/members"))
    assert members == {"members": sorted([owner.user_id, guest.user_id]), "total": 2}
    state = ok(admin.get(f"{ADMIN}/v1/rooms/{q(room)}/state"))["state"]
    assert {e["type"] for e in state} >= {"m.room.create", "m.room.name", "m.room.member"}
    assert admin.get(f"{ADMIN}/v1/rooms/!nope:weir.test").status_code == 404

    refused = admin.delete(f"{ADMIN}/v2/rooms/{q(room)}", json={"new_room_user_id": "@x:else.test"})
    assert refused.status_code == 400 and refused.json()["errcode"] == "M_INVALID_PARAM"
    delete_id = ok(admin.delete(f"{ADMIN}/v2/rooms/{q(room)}", json={"block": True}))["delete_id"]
    status = wait_for_deletion(admin, delete_id)
    assert status["status"] == "complete", status
    shut = status["shutdown_room"]
    assert sorted(shut["kicked_users"]) == sorted([owner.user_id, guest.user_id])
    assert shut["local_aliases"] == [f"#{alias_name}:weir.test"]
    by_room = ok(admin.get(f"{ADMIN}/v2/rooms/{q(room)}/delete_status"))["results"]
    assert [r["delete_id"] for r in by_room] == [delete_id]

    # Purged: gone from the lists, the alias and the members' rooms; blocked: no rejoining.
    assert admin.get(f"{ADMIN}/v1/rooms/{q(room)}").status_code == 404
    assert ok(admin.get(f"{ADMIN}/v1/rooms", params={"search_term": "doomed"}))["total_rooms"] == 0
    assert owner.get(alias_path(f"#{alias_name}:weir.test")).status_code == 404
    assert ok(owner.get(f"{V3}/joined_rooms"))["joined_rooms"] == []
    rejoin = guest.post(f"{V3}/join/{q(room)}", json={})
    assert rejoin.status_code == 403 and rejoin.json()["errcode"] == "M_FORBIDDEN"
    assert ok(admin.get(f"{ADMIN}/v2/rooms/delete_status/nope"), 404)["errcode"] == "M_NOT_FOUND"


def test_deleting_without_purge_keeps_the_room_empty_of_our_users(admin, user):
    owner = user("keeper")
    room = create_room(owner, preset="private_chat")
    body = {"purge": False, "block": False}
    delete_id = ok(admin.delete(f"{ADMIN}/v2/rooms/{q(room)}", json=body))["delete_id"]
    assert wait_for_deletion(admin, delete_id)["status"] == "complete"
    details = ok(admin.get(f"{ADMIN}/v1/rooms/{q(room)}"))
    assert details["joined_members"] == 0 and details["blocked"] is False
    assert ok(owner.get(f"{V3}/joined_rooms"))["joined_rooms"] == []


def test_quarantined_media_answers_404(admin, user):
    uploader = user("uploader")
    r = uploader.post(
        "/_matrix/media/v3/upload",
        params={"filename": "x.bin"},
        data=b"some bytes",
        headers={"Content-Type": "application/octet-stream"},
    )
    media_id = ok(r)["content_uri"].rsplit("/", 1)[1]
    download = f"/_matrix/client/v1/media/download/weir.test/{media_id}"
    assert uploader.get(download).content == b"some bytes"
    assert ok(admin.post(f"{ADMIN}/v1/media/quarantine/weir.test/{media_id}", json={})) == {}
    gone = uploader.get(download)
    assert gone.status_code == 404 and gone.json()["errcode"] == "M_NOT_FOUND"
    assert (
        uploader.get(
            f"/_matrix/client/v1/media/thumbnail/weir.test/{media_id}",
            params={"width": 32, "height": 32},
        ).status_code
        == 404
    )
    assert admin.post(f"{ADMIN}/v1/media/quarantine/bad%20name/x", json={}).status_code == 400
    ok(admin.post(f"{ADMIN}/v1/media/unquarantine/weir.test/{media_id}", json={}))
    assert uploader.get(download).content == b"some bytes"


def upload(client: MatrixClient, data: bytes, name: str) -> str:
    r = client.post(
        "/_matrix/media/v3/upload",
        params={"filename": name},
        data=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    return ok(r)["content_uri"]


def test_media_lists_and_quarantine_by_room_and_user(admin, user):
    poster, other = user("poster"), user("other")
    room = create_room(poster)
    in_room = upload(poster, b"posted", "posted.bin")
    thumb = upload(poster, b"thumb", "thumb.bin")
    kept = upload(poster, b"kept", "kept.bin")
    elsewhere = upload(other, b"other's", "o.bin")
    message = {
        "msgtype": "m.file",
        "body": "posted.bin",
        "url": in_room,
        "info": {"thumbnail_url": thumb},
    }
    ok(poster.put(f"{V3}/rooms/{q(room)}/send/m.room.message/t1", json=message))
    remote = {"msgtype": "m.image", "body": "r", "url": "mxc://elsewhere.test/abcdef"}
    ok(poster.put(f"{V3}/rooms/{q(room)}/send/m.room.message/t2", json=remote))

    found = ok(admin.get(f"{ADMIN}/v1/room/{q(room)}/media"))
    assert found == {"local": [in_room, thumb], "remote": ["mxc://elsewhere.test/abcdef"]}
    listed = ok(admin.get(f"{ADMIN}/v1/users/{q(poster.user_id)}/media", params={"limit": 2}))
    assert listed["total"] == 3 and listed["next_token"] == 2
    assert [m["upload_name"] for m in listed["media"]] == ["posted.bin", "thumb.bin"]
    assert listed["media"][0]["media_length"] == len(b"posted")
    assert admin.get(f"{ADMIN}/v1/users/@nobody:weir.test/media").status_code == 404

    count = ok(admin.post(f"{ADMIN}/v1/room/{q(room)}/media/quarantine", json={}))
    assert count == {"num_quarantined": 3}
    for uri in (in_room, thumb):
        assert poster.get(f"/_matrix/client/v1/media/download/{uri[6:]}").status_code == 404
    assert poster.get(f"/_matrix/client/v1/media/download/{kept[6:]}").status_code == 200
    by_user = ok(admin.post(f"{ADMIN}/v1/user/{q(poster.user_id)}/media/quarantine", json={}))
    assert by_user == {"num_quarantined": 1}  # the other two were already
    assert poster.get(f"/_matrix/client/v1/media/download/{kept[6:]}").status_code == 404
    assert other.get(f"/_matrix/client/v1/media/download/{elsewhere[6:]}").status_code == 200
    after = ok(admin.get(f"{ADMIN}/v1/users/{q(poster.user_id)}/media"))["media"]
    assert {m["quarantined_by"] for m in after} == {admin.user_id}


def test_registration_tokens(admin):
    made = ok(admin.post(f"{ADMIN}/v1/registration_tokens/new", json={"length": 20}))
    assert len(made["token"]) == 20
    assert (made["uses_allowed"], made["pending"], made["completed"]) == (None, 0, 0)
    named = ok(
        admin.post(
            f"{ADMIN}/v1/registration_tokens/new", json={"token": "abc-123", "uses_allowed": 3}
        )
    )
    assert named["token"] == "abc-123" and named["uses_allowed"] == 3
    again = admin.post(f"{ADMIN}/v1/registration_tokens/new", json={"token": "abc-123"})
    assert again.status_code == 400 and again.json()["errcode"] == "M_INVALID_PARAM"
    for bad in ({"token": "no spaces"}, {"uses_allowed": -1}, {"expiry_time": 1}, {"length": 65}):
        assert admin.post(f"{ADMIN}/v1/registration_tokens/new", json=bad).status_code == 400

    listed = ok(admin.get(f"{ADMIN}/v1/registration_tokens"))["registration_tokens"]
    assert {t["token"] for t in listed} >= {made["token"], "abc-123"}
    changed = ok(admin.put(f"{ADMIN}/v1/registration_tokens/abc-123", json={"uses_allowed": 0}))
    assert changed["uses_allowed"] == 0
    invalid = ok(admin.get(f"{ADMIN}/v1/registration_tokens", params={"valid": "false"}))
    assert "abc-123" in [t["token"] for t in invalid["registration_tokens"]]
    valid = ok(admin.get(f"{ADMIN}/v1/registration_tokens", params={"valid": "true"}))
    assert "abc-123" not in [t["token"] for t in valid["registration_tokens"]]

    assert ok(admin.delete(f"{ADMIN}/v1/registration_tokens/abc-123")) == {}
    assert admin.get(f"{ADMIN}/v1/registration_tokens/abc-123").status_code == 404
    assert admin.delete(f"{ADMIN}/v1/registration_tokens/abc-123").status_code == 404
    assert admin.put(f"{ADMIN}/v1/registration_tokens/nope", json={}).status_code == 404


def test_deleting_moves_the_members_to_a_new_room(admin, user):
    owner, member = user("moved"), user("moved")
    room = create_room(owner, preset="public_chat")
    ok(member.post(f"{V3}/join/{q(room)}", json={}))
    notices = f"@notices{next(_names)}:weir.test"  # not registered yet: made for the room
    body = {"new_room_user_id": notices, "room_name": "Moved", "message": "This room is gone."}
    delete_id = ok(admin.delete(f"{ADMIN}/v2/rooms/{q(room)}", json=body))["delete_id"]
    status = wait_for_deletion(admin, delete_id)
    assert status["status"] == "complete", status
    new_room = status["shutdown_room"]["new_room_id"]

    for client in (owner, member):
        assert ok(client.get(f"{V3}/joined_rooms"))["joined_rooms"] == [new_room]
    details = ok(admin.get(f"{ADMIN}/v1/rooms/{q(new_room)}"))
    assert details["name"] == "Moved" and details["creator"] == notices
    messages = ok(owner.get(f"{V3}/rooms/{q(new_room)}/messages", params={"dir": "b"}))
    bodies = [e["content"].get("body") for e in messages["chunk"] if e["type"] == "m.room.message"]
    assert bodies == ["This room is gone."]
    # Its members may not speak: the room is for the notice.
    speak = owner.put(
        f"{V3}/rooms/{q(new_room)}/send/m.room.message/t9", json={"msgtype": "m.text", "body": "x"}
    )
    assert speak.status_code == 403
