"""Redactions with a real Synapse 1.163 in our room, both ways: ours reach Synapse through
the federation sender, Synapse's reach us through its /send, and each side then serves the
event redacted, with `unsigned.redacted_because`. Room versions 10 (`redacts` at the top
level) and 11 (in content)."""

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

WEIR_IP = "127.31.108.5"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-redactions"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def wait_redacted(get_event, event_id: str, within: float = 15) -> dict:
    """Polls `get_event(event_id)` (a client /event answer) until it shows the event
    redacted; returns it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        r = get_event(event_id)
        if r.status_code == 200 and "redacted_because" in r.json().get("unsigned", {}):
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"{event_id} never showed redacted: {r.status_code} {r.text}")


@pytest.mark.parametrize("version", ["10", "11"])
def test_a_redaction_from_either_side_shows_redacted_on_both(weir, synapse, version):
    alice = MatrixClient(weir.client_url)
    alice.register(f"alice{version}")
    r = alice.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": version})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    room = quote(room_id, safe="")
    bob = SynapseUser(synapse, f"redact_bob{version}")
    r = bob.call("POST", f"/join/{room}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())

    def on_weir(event_id):
        return alice.get(f"{V3}/rooms/{room}/event/{quote(event_id, safe='')}")

    def on_synapse(event_id):
        return bob.call("GET", f"/rooms/{room}/event/{quote(event_id, safe='')}")

    def weir_says(txn, body):
        r = alice.put(
            f"{V3}/rooms/{room}/send/m.room.message/{txn}", json={"msgtype": "m.text", "body": body}
        )
        assert r.status_code == 200, r.text
        return r.json()["event_id"]

    def synapse_says(txn, body):
        r = bob.call(
            "PUT",
            f"/rooms/{room}/send/m.room.message/{txn}",
            json={"msgtype": "m.text", "body": body},
        )
        assert r.status_code == 200, r.text
        return r.json()["event_id"]

    ours = weir_says("w1", "weir regrets this")
    theirs = synapse_says("s1", "synapse regrets this")
    moderated = synapse_says("s2", "the moderator removes this")
    wait_for_message(weir_sync(alice), room_id, "the moderator removes this", within=15)
    wait_for_message(synapse_sync(bob), room_id, "weir regrets this", within=15)

    # Ours, of our own event: Synapse applies it (same server as the event's sender).
    r = alice.put(f"{V3}/rooms/{room}/redact/{quote(ours, safe='')}/r1", json={"reason": "typo"})
    assert r.status_code == 200, r.text
    our_redaction = r.json()["event_id"]
    for get in (on_weir, on_synapse):
        event = wait_redacted(get, ours)
        assert event["content"] == {}
        assert event["unsigned"]["redacted_because"]["event_id"] == our_redaction
        assert event["unsigned"]["redacted_because"]["content"]["reason"] == "typo"

    # Synapse's, of its user's own event: we apply it when its /send arrives.
    r = bob.call("PUT", f"/rooms/{room}/redact/{quote(theirs, safe='')}/b1", json={})
    assert r.status_code == 200, r.text
    their_redaction = r.json()["event_id"]
    for get in (on_synapse, on_weir):
        event = wait_redacted(get, theirs)
        assert event["content"] == {}
        assert event["unsigned"]["redacted_because"]["event_id"] == their_redaction
        assert event["unsigned"]["redacted_because"]["redacts"] == theirs

    # Ours, of Synapse's user's event: alice has the redact level, and Synapse agrees.
    r = alice.put(f"{V3}/rooms/{room}/redact/{quote(moderated, safe='')}/r2", json={})
    assert r.status_code == 200, r.text
    for get in (on_weir, on_synapse):
        assert wait_redacted(get, moderated)["content"] == {}
