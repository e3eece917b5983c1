"""`GET /_matrix/federation/v1/hierarchy/{roomId}` on the real server, asked by a fake origin
that signs its requests (keys served over real TLS): the space with its children_state, its
accessible children, the rest named as inaccessible, and 404 for a room the asking server may
not see (unknown, private, or denied by the server ACL)."""

import os
from urllib.parse import quote

import pytest

from tests.peers.origins import OriginKeyServer, federation_request
from tests.rooms.conftest import V3, create_room
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec

HIERARCHY = "/_matrix/federation/v1/hierarchy/{roomId}"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("spaces.test", test_ca, dns, host="127.31.109.14") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("spaces"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.31.109.13", port=0))
    proc = WeirProcess(
        directory, merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    ).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.user_id = client.register("alice")["user_id"]
    return client


@pytest.fixture(scope="module")
def origin(keys):
    return keys.add_origin("o1")


def ask(weir, test_ca, origin, room_id: str, status: int = 200, query: str = "") -> dict:
    uri = f"/_matrix/federation/v1/hierarchy/{quote(room_id, safe='')}{query}"
    r = federation_request(weir.federation_url, origin, "weir.test", "GET", uri, test_ca)
    assert r.status_code == status, r.text
    assert_matches_spec(r, "GET", HIERARCHY, api="server-server")
    return r.json()


def link(client, parent: str, child: str, suggested: bool = False) -> None:
    content = {"via": ["weir.test"], "suggested": suggested}
    r = client.put(f"{V3}/rooms/{quote(parent, safe='')}/state/m.space.child/{child}", json=content)
    assert r.status_code == 200, r.text


def test_a_space_with_open_and_private_children(weir, test_ca, alice, origin):
    root = create_room(
        alice, name="Fed", preset="public_chat", creation_content={"type": "m.space"}
    )
    open_child = create_room(alice, name="Open", preset="public_chat")
    private = create_room(alice, name="Secret", preset="private_chat")
    link(alice, root, open_child, suggested=True)
    link(alice, root, private)
    body = ask(weir, test_ca, origin, root)
    assert body["room"]["room_id"] == root and body["room"]["room_type"] == "m.space"
    assert {c["state_key"] for c in body["room"]["children_state"]} == {open_child, private}
    assert [c["room_id"] for c in body["children"]] == [open_child]
    assert body["children"][0]["name"] == "Open"
    assert body["inaccessible_children"] == [private]
    suggested = ask(weir, test_ca, origin, root, query="?suggested_only=true")
    assert [c["state_key"] for c in suggested["room"]["children_state"]] == [open_child]
    assert suggested["inaccessible_children"] == []


def test_rooms_the_server_may_not_see_are_404(weir, test_ca, alice, origin):
    private = create_room(
        alice, name="P", preset="private_chat", creation_content={"type": "m.space"}
    )
    assert ask(weir, test_ca, origin, private, 404)["errcode"] == "M_NOT_FOUND"
    assert ask(weir, test_ca, origin, "!unknown:weir.test", 404)["errcode"] == "M_NOT_FOUND"
    denied = create_room(
        alice, name="D", preset="public_chat", creation_content={"type": "m.space"}
    )
    assert ask(weir, test_ca, origin, denied)["room"]["room_id"] == denied
    acl = {"allow": ["*"], "deny": [origin.name.split(":")[0]]}
    r = alice.put(f"{V3}/rooms/{quote(denied, safe='')}/state/m.room.server_acl/", json=acl)
    assert r.status_code == 200, r.text
    assert ask(weir, test_ca, origin, denied, 404)["errcode"] == "M_NOT_FOUND"
