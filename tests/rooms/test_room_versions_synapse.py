"""Rooms of versions 1 to 9 that a real Synapse 1.163 holds, TLS both ways: our user joins
each, pages back to the messages from before the join, messages cross both ways, each
side's redaction reaches the other, and our user leaves (homeserver/rooms/versions.py).
Versions 10 to 12 are the other Synapse tests' rooms."""

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


@pytest.mark.parametrize("version", [str(v) for v in range(1, 10)])
def test_our_user_joins_a_synapse_room_of_each_older_version(weir, alice, bob, synapse, version):
    r = bob.call(
        "POST",
        "/createRoom",
        json={"preset": "public_chat", "room_version": version, "name": f"v{version}"},
    )
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    before = _send(bob, room_id, "before the join")

    r = alice.post(f"{V3}/join/{quote(room_id)}", params={"via": synapse.server_name}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    assert alice.get(V3 + _room(room_id, "/state/m.room.name")).json() == {"name": f"v{version}"}
    create = alice.get(V3 + _room(room_id, "/state/m.room.create")).json()
    assert create["room_version"] == version

    # Backfill: the message from before our join, paged back to.
    r = alice.get(V3 + _room(room_id, "/messages"), params={"dir": "b", "limit": 50})
    assert before in [e["event_id"] for e in r.json()["chunk"]], r.text

    theirs = _send(bob, room_id, "b")
    wait_for_message(weir_sync(alice), room_id, "b", within=10)
    sent = _ours_to_redact(alice, version, room_id)
    wait_for_message(synapse_sync(bob), room_id, "a", within=10)

    # Synapse's redaction reaches us.
    r = bob.call("PUT", _room(room_id, f"/redact/{quote(theirs, safe='')}/r0"), json={})
    assert r.status_code == 200, r.text
    _wait_redacted(alice, room_id, theirs)

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


def _send(bob: SynapseUser, room_id: str, body: str) -> str:
    r = bob.call(
        "PUT",
        _room(room_id, f"/send/m.room.message/{body.replace(' ', '')}"),
        json={"msgtype": "m.text", "body": body},
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def _ours_to_redact(alice, version: str, room_id: str) -> str:
    """Sends "a"; in v3, until its ID holds a `/` (about one ID in two), so that the paths
    naming it carry an escaped slash."""
    for attempt in range(40):
        r = alice.put(
            V3 + _room(room_id, f"/send/m.room.message/a{attempt}"),
            json={"msgtype": "m.text", "body": "a"},
        )
        assert r.status_code == 200, r.text
        event_id = r.json()["event_id"]
        if version != "3" or "/" in event_id:
            return event_id
    raise AssertionError("40 v3 event IDs without a /")


def _wait_redacted(alice, room_id: str, event_id: str) -> None:
    path = V3 + _room(room_id, f"/event/{quote(event_id, safe='')}")
    since = alice.get(f"{V3}/sync").json()["next_batch"]
    for _ in range(20):
        r = alice.get(path)
        assert r.status_code == 200, r.text
        if r.json()["content"] == {}:
            return
        since = alice.get(f"{V3}/sync", params={"since": since, "timeout": 1000}).json()[
            "next_batch"
        ]
    raise AssertionError(f"{event_id} was never redacted here")


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
