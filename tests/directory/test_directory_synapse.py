"""Room directory interop with a real Synapse 1.163 on loopback, TLS on both sides:
each side resolves the other's alias and lists the other's public rooms over federation."""

from urllib.parse import quote

import pytest
import requests

from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.40.4.1"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-dir-interop"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


@pytest.fixture(scope="module")
def synapse_user(synapse):
    token = synapse.register("dirbob")["access_token"]
    return MatrixClient(synapse.client_url, token)


@pytest.fixture(scope="module")
def weir_user(weir):
    user = MatrixClient(weir.client_url)
    user.register("diralice")
    return user


def test_synapse_resolves_our_alias_and_lists_our_rooms(weir, weir_user, synapse_user):
    created = weir_user.post(
        f"{V3}/createRoom",
        json={
            "preset": "public_chat",
            "visibility": "public",
            "name": "Weir Lobby",
            "topic": "hello from weir",
            "room_alias_name": "weirlobby",
        },
    )
    assert created.status_code == 200, created.text
    room_id = created.json()["room_id"]

    alias = f"#weirlobby:{WEIR_NAME}"
    r = synapse_user.get(f"{V3}/directory/room/{quote(alias)}")
    assert r.status_code == 200, r.text
    assert r.json()["room_id"] == room_id
    assert WEIR_NAME in r.json()["servers"]

    listed = synapse_user.get(f"{V3}/publicRooms", params={"server": WEIR_NAME})
    assert listed.status_code == 200, listed.text
    entry = next(e for e in listed.json()["chunk"] if e["room_id"] == room_id)
    assert entry["name"] == "Weir Lobby" and entry["num_joined_members"] == 1
    searched = synapse_user.post(
        f"{V3}/publicRooms",
        params={"server": WEIR_NAME},
        json={"filter": {"generic_search_term": "weir lobby"}},
    )
    assert [e["room_id"] for e in searched.json()["chunk"]] == [room_id]


def test_we_resolve_a_synapse_alias_and_list_its_rooms(weir, weir_user, synapse, synapse_user):
    created = synapse_user.post(
        f"{V3}/createRoom",
        json={
            "preset": "public_chat",
            "visibility": "public",
            "name": "Synapse Square",
            "room_alias_name": "square",
        },
    )
    assert created.status_code == 200, created.text
    room_id = created.json()["room_id"]

    alias = f"#square:{synapse.server_name}"
    r = requests.get(weir.url(f"{V3}/directory/room/{quote(alias)}"), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["room_id"] == room_id and synapse.server_name in r.json()["servers"]

    listed = requests.get(
        weir.url(f"{V3}/publicRooms"), params={"server": synapse.server_name}, timeout=60
    )
    assert listed.status_code == 200, listed.text
    assert room_id in [e["room_id"] for e in listed.json()["chunk"]]
    searched = weir_user.post(
        f"{V3}/publicRooms",
        params={"server": synapse.server_name},
        json={"filter": {"generic_search_term": "square"}},
    )
    assert searched.status_code == 200, searched.text
    assert [e["room_id"] for e in searched.json()["chunk"]] == [room_id]

    unknown = requests.get(
        weir.url(f"{V3}/directory/room/{quote('#nope:' + synapse.server_name)}"), timeout=60
    )
    assert (unknown.status_code, unknown.json()["errcode"]) == (404, "M_NOT_FOUND")
