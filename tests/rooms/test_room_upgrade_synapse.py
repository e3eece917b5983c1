"""Room upgrades with a real Synapse 1.163 on loopback, TLS both ways: a Synapse user in our
room sees the tombstone our upgrade sends (the federation sender takes it), loses their
voice in the old room, and joins the replacement through us, where messages flow both ways."""

import os
import time
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

_BASE = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
WEIR_IP = f"{_BASE}.23"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-upgrade"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def _in_sync(bob: SynapseUser, room_id: str, since: str, event_type: str) -> dict:
    """Long-polls bob's /sync on Synapse, for at most 20 s, until the room's timeline holds
    an event of `event_type`."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        timeout = int(max(0.0, deadline - time.monotonic()) * 1000)
        r = bob.call("GET", "/sync", params={"since": since, "timeout": timeout})
        assert r.status_code == 200, r.text
        body = r.json()
        room = body.get("rooms", {}).get("join", {}).get(room_id, {})
        for event in room.get("timeline", {}).get("events", []):
            if event["type"] == event_type:
                return event
        since = body["next_batch"]
    raise AssertionError(f"Synapse's /sync never showed {event_type} in {room_id}")


# 10 -> 11: the tombstone is built before the new room, whose create event names it;
# 12 -> 12: the new room's ID is its create event's, so the tombstone comes after.
@pytest.mark.parametrize("versions", [("10", "11"), ("12", "12")])
def test_a_synapse_member_follows_our_upgrade(weir, synapse, versions):
    old_version, new_version = versions
    alice = MatrixClient(weir.client_url)
    alice_id = alice.register(f"alice_up{old_version}")["user_id"]
    r = alice.post(
        f"{V3}/createRoom",
        json={"preset": "public_chat", "name": "Moving", "room_version": old_version},
    )
    assert r.status_code == 200, r.text
    old = r.json()["room_id"]
    bob = SynapseUser(synapse, f"upgrade_bob{old_version}")
    r = bob.call("POST", f"/join/{quote(old, safe='')}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    since = bob.call("GET", "/sync").json()["next_batch"]

    r = alice.post(f"{V3}/rooms/{quote(old, safe='')}/upgrade", json={"new_version": new_version})
    assert r.status_code == 200, r.text
    new = r.json()["replacement_room"]

    tombstone = _in_sync(bob, old, since, "m.room.tombstone")
    assert tombstone["content"]["replacement_room"] == new
    assert tombstone["sender"] == alice_id
    # The old room's raised levels reach Synapse too, which then refuses bob's message.
    levels = _in_sync(bob, old, since, "m.room.power_levels")
    assert levels["content"]["events_default"] == levels["content"]["invite"] == 50
    r = bob.call(
        "PUT",
        f"/rooms/{quote(old, safe='')}/send/m.room.message/late",
        json={"msgtype": "m.text", "body": "anyone?"},
    )
    assert r.status_code == 403, r.text

    # The replacement, joined through us (Synapse's make_join and send_join).
    r = bob.call("POST", f"/join/{quote(new, safe='')}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    r = bob.call("GET", f"/rooms/{quote(new, safe='')}/state/m.room.create/")
    assert r.status_code == 200, r.text
    predecessor = r.json()["predecessor"]
    assert predecessor["room_id"] == old
    if new_version != "12":
        assert predecessor["event_id"] == tombstone["event_id"]
    r = bob.call("GET", f"/rooms/{quote(new, safe='')}/state/m.room.name/")
    assert r.json() == {"name": "Moving"}

    r = bob.call(
        "PUT",
        f"/rooms/{quote(new, safe='')}/send/m.room.message/s1",
        json={"msgtype": "m.text", "body": "moved in"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(weir_sync(alice), new, "moved in", within=20)
    r = alice.put(
        f"{V3}/rooms/{quote(new, safe='')}/send/m.room.message/w1",
        json={"msgtype": "m.text", "body": "welcome"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(synapse_sync(bob), new, "welcome", within=20)
