"""A knock through a fake resident server that refuses it afterwards: the kick of our user,
sent to us in a transaction for a room we are not in, ends the knock we kept, and /sync
moves the room from rooms.knock to rooms.leave. A kick that names no knock of ours among
its auth events changes nothing."""

import json
import time
from urllib.parse import quote

import pytest
import requests

from tests.peers.door import KnockDoorPeer
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

WEIR_IP = "127.31.114.3"
WEIR_NAME = f"{WEIR_IP}:8448"
DOOR_IP = "127.31.114.4"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def door(test_ca):
    peer = KnockDoorPeer(test_ca, host=DOOR_IP).start()
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def weir(test_ca, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-knock-refused"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def _send(weir, door, test_ca, txn_id: str, pdus: list[dict]):
    uri = f"/_matrix/federation/v1/send/{txn_id}"
    body = {"origin": door.server_name, "origin_server_ts": int(time.time() * 1000), "pdus": pdus}
    headers = {
        "Authorization": door.sign_request(WEIR_NAME, "PUT", uri, body),
        "Content-Type": "application/json",
    }
    r = requests.put(
        weir.federation_url + uri,
        data=json.dumps(body),
        headers=headers,
        verify=test_ca.ca_path,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["pdus"]


def _sections(client, since=None) -> tuple[dict, str]:
    params = {"timeout": 0, **({"since": since} if since else {})}
    data = client.get(f"{V3}/sync", params=params, timeout=30).json()
    return data["rooms"], data["next_batch"]


def test_the_rooms_server_refuses_a_knock_with_a_kick(weir, door, test_ca):
    ola = MatrixClient(weir.client_url)
    ola_id = ola.register("ola")["user_id"]
    r = ola.post(
        f"{V3}/knock/{quote(door.room_id, safe='')}",
        params={"via": door.server_name},
        json={"reason": "hello"},
    )
    assert r.status_code == 200, r.text
    rooms, since = _sections(ola)
    events = rooms["knock"][door.room_id]["knock_state"]["events"]
    by_type = {e["type"]: e for e in events}
    assert by_type["m.room.name"]["content"] == {"name": "Door"}
    assert by_type["m.room.join_rules"]["sender"] == door.creator
    assert events[-1]["content"] == {"membership": "knock", "reason": "hello"}

    # A kick that does not answer our knock (its auth events do not name it) is dropped.
    stray = door.refusal(ola_id, answering=door.events[0][0])
    answers = _send(weir, door, test_ca, "stray", [stray])
    assert list(answers.values())[0].get("error"), answers
    rooms, _ = _sections(ola)
    assert door.room_id in rooms["knock"]

    kick = door.refusal(ola_id)
    answers = _send(weir, door, test_ca, "kick", [kick])
    assert list(answers.values()) == [{}], answers
    rooms, _ = _sections(ola, since)
    (leave,) = rooms["leave"][door.room_id]["timeline"]["events"]
    assert (leave["sender"], leave["state_key"]) == (door.creator, ola_id)
    assert leave["content"] == {"membership": "leave"}
    rooms, _ = _sections(ola)
    assert door.room_id not in rooms["knock"]
