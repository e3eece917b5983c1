"""matrix-js-sdk with its Rust crypto across servers: a client on Weir and a client on a real
Synapse 1.163 (TLS federation both ways; each client on its own server's client API) share
encrypted rooms, one created on each server, and each decrypts the other's messages; a device
added later on either server decrypts what the other user sends next. And one simplified
sliding sync scenario run on each server, whose room lists and timelines are compared."""

import json
import os

import pytest
import requests

from tests.e2ee.conftest import PASSWORD, V3
from tests.e2ee.test_js_sdk import node, registered, run_node  # noqa: F401 - shared fixture
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

_base = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
WEIR_IP = f"{_base}.5"  # .2 and .4 are other modules' Weirs, .3 a second Synapse
WEIR_NAME = f"{WEIR_IP}:8448"
BACKWARDS = {"dir": "b", "limit": 50}


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-js-cross"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def test_messages_decrypt_both_ways_in_rooms_created_on_either_server(
    weir,
    synapse,
    node,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    alice = registered(weir, "alice")
    synapse.register("bobjs", PASSWORD)
    messages = {
        "weir_room": {"weir": "from weir, in weir's room", "synapse": "from synapse, in weir's"},
        "synapse_room": {"synapse": "from synapse, in its room", "weir": "from weir, in synapse's"},
        "later": {"to_weir2": "for weir's new device", "to_synapse2": "for synapse's new device"},
    }
    scenario = {
        "weir": alice,
        "synapse": {"user": "bobjs", "password": PASSWORD, "url": synapse.client_url},
        "messages": messages,
    }
    result = run_node(
        node, "cross_server.mjs", weir.client_url, json.dumps(scenario), tmp_path=tmp_path
    )

    for room in ("weir_room", "synapse_room"):
        got = result[room]
        assert got["encrypted_room"] == {"weir": True, "synapse": True}, room
        # Each side decrypted the other's message, by the event ID its sender was given.
        assert got["received"]["synapse"] == {
            "event_id": got["sent"]["weir"],
            "body": messages[room]["weir"],
        }
        assert got["received"]["weir"] == {
            "event_id": got["sent"]["synapse"],
            "body": messages[room]["synapse"],
        }

    # A device added later on either server is told of across the servers and can read what
    # the other user sends next, as can the user's first device.
    later = result["later_devices"]
    assert later["weir"]["device_id"] != result["devices"]["weir"][1]
    assert later["weir"]["body"] == later["weir"]["first"] == messages["later"]["to_weir2"]
    assert later["synapse"]["device_id"] != result["devices"]["synapse"][1]
    assert later["synapse"]["body"] == later["synapse"]["first"] == messages["later"]["to_synapse2"]

    # Both servers hold, and relayed to each other, ciphertext only.
    weir_user = MatrixClient(weir.client_url)
    weir_user.login(alice["user"], PASSWORD)
    sent = {room: list(result[room]["sent"].values()) for room in ("weir_room", "synapse_room")}
    sent["weir_room"] += [later[side]["event_id"] for side in ("weir", "synapse")]
    texts = [text for group in messages.values() for text in group.values()]
    for get in (weir_user.get, _synapse_get(synapse, "bobjs")):
        for room, event_ids in sent.items():
            r = get(f"{V3}/rooms/{result[room]['room_id']}/messages", params=BACKWARDS)
            assert r.status_code == 200, r.text
            by_id = {event["event_id"]: event for event in r.json()["chunk"]}
            for event_id in event_ids:
                assert by_id[event_id]["type"] == "m.room.encrypted"
                assert by_id[event_id]["content"]["algorithm"] == "m.megolm.v1.aes-sha2"
            assert not any(text in r.text for text in texts)


def _synapse_get(synapse, user: str):
    """GET on Synapse's client API as `user`, through a new login."""
    r = requests.post(
        synapse.client_url + V3 + "/login",
        json={
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user},
            "password": PASSWORD,
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    headers = {"Authorization": f"Bearer {r.json()['access_token']}"}
    return lambda path, params: requests.get(
        synapse.client_url + path, params=params, headers=headers, timeout=30
    )


ROOMS = 30
# One message in each room in this order (7 and 30 share no factor): the last ten are the
# list's ten, newest first.
ORDER = [7 * i % ROOMS for i in range(ROOMS)]
BUSY, MOVED, REACTED = ORDER[0], ORDER[5], ORDER[-5]  # last, 25th and 5th by recency


def test_a_sliding_sync_room_list_matches_synapses(
    weir,
    synapse,
    node,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    """One scenario (tests/e2ee/js/sliding_lists.mjs) through matrix-js-sdk's SlidingSync,
    run against Weir and against Synapse, each with a user of its own in 30 rooms: the list
    `[[0, 9]]` shows the ten most recent, named, with a count of 30; a message puts a room
    from outside it at the top within a second; a reaction (not activity that bumps, MSC4186
    `bump_stamp`) moves no room; a subscription brings the busy room's last 20 events. Both
    servers' results are the expected ones, so the same."""
    names = [f"room {i:02d}" for i in range(ROOMS)]
    scenario = {
        "names": names,
        "order": ORDER,
        "busy": BUSY,
        "busy_messages": 24,
        "moved": MOVED,
        "reacted": REACTED,
        "password": PASSWORD,
    }
    synapse.register("slider", PASSWORD)
    on_synapse = run_node(
        node,
        "sliding_lists.mjs",
        synapse.client_url,
        json.dumps({**scenario, "user": "slider"}),
        tmp_path=tmp_path,
    )
    on_weir = run_node(
        node,
        "sliding_lists.mjs",
        weir.client_url,
        json.dumps({**scenario, "user": registered(weir, "slider")["user"]}),
        tmp_path=tmp_path,
    )

    first = [{"index": i, "name": names[i]} for i in reversed(ORDER[-10:])]
    moved = [{"index": MOVED, "name": names[MOVED]}, *first[:9]]
    busy = [f"{names[BUSY]} busy {n}" for n in range(6, 25)] + [f"last in {names[BUSY]}"]
    for server, got in (("weir", on_weir), ("synapse", on_synapse)):
        assert got["first"]["list"] == first, server
        assert got["first"]["count"] == ROOMS, server
        assert got["first"]["timelines"] == got["first"]["expected_timelines"], server
        assert got["move"]["list"] == moved and got["move"]["count"] == ROOMS, server
        assert got["reaction"]["list"] == moved, server
        assert got["reaction"]["bump_stamp_sent"] is False, server  # unchanged: left out
        assert got["subscription"]["bodies"] == busy, server
        assert got["subscription"]["client_bodies"][-20:] == busy, server
        assert got["subscription"]["initial"] and got["subscription"]["limited"], server
        assert got["subscription"]["has_prev_batch"], server
    assert _seen(on_weir) == _seen(on_synapse)
    # The "within a second", from the send to the client's list: a generous bound on
    # a loaded machine (the figures: `pytest -s`).
    assert on_weir["move"]["ms"] < 1000, on_weir["move"]
    for server, got in (("weir", on_weir), ("synapse", on_synapse)):
        move = got["move"]
        print(f"{server}: to the top in {move['ms']:.1f} ms, its send {move['send_ms']:.1f}")


def _seen(got: dict) -> tuple:
    """What a person would see of the scenario: the lists, their counts, the timeline."""
    lists = (got["first"]["list"], got["move"]["list"], got["reaction"]["list"])
    return lists, got["first"]["count"], got["move"]["count"], got["subscription"]["bodies"]
