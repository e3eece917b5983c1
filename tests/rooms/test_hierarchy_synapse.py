"""Spaces across Weir and a real Synapse 1.163, TLS both ways: a Weir space whose child
room lives on Synapse lists it (our walk asks Synapse's `GET /_matrix/federation/v1/
hierarchy`), and Synapse's user, in a Weir space, is shown its Weir child room (Synapse asks
our federation hierarchy endpoint)."""

from urllib.parse import quote

import pytest
import requests

from tests.rooms.test_membership_synapse import SynapseUser
from tests.support.federation import tls_weir
from tests.support.metrics import in_flight, metric
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.31.141.2"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-spaces-synapse"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("spacesalice")
    return client


def create(client: MatrixClient, **body) -> str:
    r = client.post(f"{V3}/createRoom", json={"preset": "public_chat", **body})
    assert r.status_code == 200, r.text
    return r.json()["room_id"]


def link(client: MatrixClient, space: str, child: str, via: str) -> None:
    path = f"{V3}/rooms/{quote(space, safe='')}/state/m.space.child/{quote(child, safe='')}"
    r = client.put(path, json={"via": [via]})
    assert r.status_code == 200, r.text


def test_a_weir_space_lists_its_child_room_on_synapse(weir, synapse, alice):
    sam = SynapseUser(synapse, "spacesam")
    r = sam.call("POST", "/createRoom", json={"preset": "public_chat", "name": "Lounge"})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    lounge = r.json()["room_id"]
    space = create(alice, name="Mixed", creation_content={"type": "m.space"})
    link(alice, space, lounge, synapse.server_name)
    r = alice.get(f"/_matrix/client/v1/rooms/{quote(space, safe='')}/hierarchy", timeout=30)
    assert r.status_code == 200, r.text
    rooms = {room["room_id"]: room for room in r.json()["rooms"]}
    assert list(rooms) == [space, lounge]
    assert rooms[lounge]["name"] == "Lounge" and rooms[lounge]["join_rule"] == "public"
    assert rooms[lounge]["num_joined_members"] == 1
    assert metric(weir.client_url, "weir_outbound_calls_total", call="hierarchy", outcome="ok") == 1
    assert in_flight(weir.client_url, "client_outbound") == 0


def test_synapse_shows_its_user_the_weir_child_of_a_weir_space(weir, synapse, alice):
    space = create(alice, name="Weir space", creation_content={"type": "m.space"})
    child = create(alice, name="Weir room", topic="made on weir")
    link(alice, space, child, WEIR_NAME)
    sam = SynapseUser(synapse, "spacesam2")
    r = sam.call("POST", f"/join/{quote(space, safe='')}", params={"server_name": WEIR_NAME})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    url = f"{synapse.client_url}/_matrix/client/v1/rooms/{quote(space, safe='')}/hierarchy"
    r = requests.get(url, headers=sam.headers, timeout=60)
    assert r.status_code == 200, (r.text, synapse.log_tail())
    rooms = {room["room_id"]: room for room in r.json()["rooms"]}
    assert list(rooms) == [space, child], r.text
    assert rooms[child]["name"] == "Weir room" and rooms[child]["topic"] == "made on weir"
