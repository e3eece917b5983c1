"""Jump to date with a real Synapse 1.163, TLS both ways: one of our users joins a Synapse
room after its first messages, and timestamp_to_event finds those messages, which we never
stored, by asking Synapse (rooms/jump_to_date.py); Synapse asks us the same of our room."""

import os
from urllib.parse import quote

import pytest

from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

_BASE = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
WEIR_IP = f"{_BASE}.19"
WEIR_NAME = f"{WEIR_IP}:8448"
V1, V3 = "/_matrix/client/v1", "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-jump"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def _say(client, room_id: str, body: str) -> str:
    r = client.put(
        f"{V3}/rooms/{quote(room_id, safe='')}/send/m.room.message/{quote(body)}",
        json={"msgtype": "m.text", "body": body},
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def _ts(client, room_id: str, event_id: str) -> int:
    r = client.get(f"{V3}/rooms/{quote(room_id, safe='')}/event/{quote(event_id, safe='')}")
    assert r.status_code == 200, r.text
    return r.json()["origin_server_ts"]


def _jump(client, room_id: str, ts: int, direction: str):
    return client.get(
        f"{V1}/rooms/{quote(room_id, safe='')}/timestamp_to_event",
        params={"ts": ts, "dir": direction},
    )


def test_a_late_joiner_jumps_into_history_it_never_stored(weir, synapse):
    bob = MatrixClient(synapse.client_url, synapse.register("jumpbob")["access_token"])
    alice = MatrixClient(weir.client_url)
    alice.register("jumpalice")
    r = bob.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    old = [_say(bob, room_id, f"old {n}") for n in range(3)]
    times = [_ts(bob, room_id, e) for e in old]
    r = alice.post(f"{V3}/join/{quote(room_id)}", params={"server_name": synapse.server_name})
    assert r.status_code == 200, r.text

    # Going back: nothing of ours is that old (the join's state is outliers): Synapse answers.
    r = _jump(alice, room_id, times[1], "b")
    assert r.status_code == 200, r.text
    assert r.json() == {"event_id": old[1], "origin_server_ts": times[1]}
    # Going forward: our first timeline event is our join, after a gap; Synapse's is closer.
    r = _jump(alice, room_id, times[1], "f")
    assert r.status_code == 200, r.text
    assert r.json()["origin_server_ts"] == times[1] and r.json()["event_id"] in old[1:]


def test_synapse_asks_us_of_our_room(weir, synapse):
    alice = MatrixClient(weir.client_url)
    alice.register("jumpalice2")
    carol = MatrixClient(synapse.client_url, synapse.register("jumpcarol")["access_token"])
    r = alice.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    early = [_say(alice, room_id, f"early {n}") for n in range(3)]
    times = [_ts(alice, room_id, e) for e in early]
    r = carol.post(f"{V3}/join/{quote(room_id)}", params={"server_name": WEIR_NAME})
    assert r.status_code == 200, r.text

    # Synapse stored none of these before its join: its answer comes from our endpoint.
    r = _jump(carol, room_id, times[1], "b")
    assert r.status_code == 200, r.text
    assert r.json() == {"event_id": early[1], "origin_server_ts": times[1]}
