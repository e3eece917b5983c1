"""Rooms of versions 4 to 9 that a real Synapse 1.163 holds, TLS both ways: our user joins
each, messages cross both ways, our redaction reaches Synapse, and our user leaves
(homeserver/rooms/versions.py). Versions 10 to 12 are the other Synapse tests' rooms."""

from urllib.parse import quote

import pytest

from tests.rooms.test_membership_synapse import (
    SynapseUser,
    synapse_sync,
    wait_for_message,
    weir_sync,
)
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.40.16.1"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-room-versions"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


@pytest.fixture(scope="module")
def alice(weir):
    user = MatrixClient(weir.client_url)
    user.register("versionsalice")
    return user


@pytest.fixture(scope="module")
def bob(synapse):
    return SynapseUser(synapse, "versionsbob")


def _room(room_id: str, path: str) -> str:
    return f"/rooms/{quote(room_id, safe='')}{path}"


@pytest.mark.parametrize("version", ["4", "5", "6", "7", "8", "9"])
def test_our_user_joins_a_synapse_room_of_each_older_version(weir, alice, bob, synapse, version):
    r = bob.call(
        "POST",
        "/createRoom",
        json={"preset": "public_chat", "room_version": version, "name": f"v{version}"},
    )
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]

    r = alice.post(f"{V3}/join/{quote(room_id)}", params={"via": synapse.server_name}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    assert alice.get(V3 + _room(room_id, "/state/m.room.name")).json() == {"name": f"v{version}"}
    create = alice.get(V3 + _room(room_id, "/state/m.room.create")).json()
    assert create["room_version"] == version

    r = bob.call(
        "PUT", _room(room_id, "/send/m.room.message/b1"), json={"msgtype": "m.text", "body": "b"}
    )
    assert r.status_code == 200, r.text
    wait_for_message(weir_sync(alice), room_id, "b", within=10)
    r = alice.put(
        V3 + _room(room_id, "/send/m.room.message/a1"), json={"msgtype": "m.text", "body": "a"}
    )
    assert r.status_code == 200, r.text
    sent = r.json()["event_id"]
    wait_for_message(synapse_sync(bob), room_id, "a", within=10)

    # Our redaction, by this version's algorithm, is accepted by Synapse.
    r = alice.put(V3 + _room(room_id, f"/redact/{quote(sent, safe='')}/r1"), json={})
    assert r.status_code == 200, r.text
    redaction = r.json()["event_id"]
    _wait_for_event(bob, room_id, redaction)
    assert bob.call("GET", _room(room_id, f"/event/{quote(sent, safe='')}")).json()["content"] == {}

    r = alice.post(V3 + _room(room_id, "/leave"), json={})
    assert r.status_code == 200, r.text
    member = f"/state/m.room.member/{quote('@versionsalice:' + WEIR_NAME)}"
    _wait_for_state(bob, room_id, member, {"membership": "leave"})


def _wait_for_event(bob: SynapseUser, room_id: str, event_id: str) -> None:
    since = None
    for _ in range(20):
        params = {"timeout": 1000, **({"since": since} if since else {})}
        body = bob.call("GET", "/sync", params=params).json()
        room = body.get("rooms", {}).get("join", {}).get(room_id, {})
        if any(e["event_id"] == event_id for e in room.get("timeline", {}).get("events", [])):
            return
        since = body["next_batch"]
    raise AssertionError(f"{event_id} never reached Synapse")


def _wait_for_state(bob: SynapseUser, room_id: str, path: str, expected: dict) -> None:
    since = None
    for _ in range(20):
        if bob.call("GET", _room(room_id, path)).json().get("membership") == expected["membership"]:
            return
        params = {"timeout": 1000, **({"since": since} if since else {})}
        since = bob.call("GET", "/sync", params=params).json()["next_batch"]
    raise AssertionError(f"{path} of {room_id} never became {expected} on Synapse")
