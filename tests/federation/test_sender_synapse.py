"""The sender with a real Synapse 1.163, TLS both ways: messages our user sends while Synapse
is stopped reach it, in order, once it is back, with no new message to prompt them; and the
same across a `kill -9` of Weir between the sends and the restart.

This module runs a Synapse of its own (it stops and restarts it), on a neighbour of
WEIR_TEST_SYNAPSE_IP so that it never collides with the session's shared one."""

import os
import signal
import time
from urllib.parse import quote

import pytest

from tests.rooms.test_membership_synapse import SynapseUser, synapse_sync
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient
from tests.support.synapse import SynapseServer, synapse_available

pytestmark = pytest.mark.synapse

V3 = "/_matrix/client/v3"
_BASE = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
SYNAPSE_IP = f"{_BASE}.3"
WEIR_IP = f"{_BASE}.4"
WEIR_NAME = f"{WEIR_IP}:8448"


@pytest.fixture(scope="module")
def synapse(test_ca, tmp_path_factory):
    if not synapse_available():
        pytest.skip("Synapse venv missing: run `make synapse`")
    server = SynapseServer(str(tmp_path_factory.mktemp("synapse-sender")), test_ca, ip=SYNAPSE_IP)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-sender"))
    proc = tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME).start()
    yield proc
    proc.stop()


def bodies_seen(user: SynapseUser, room_id: str) -> list[str]:
    """The room's messages as Synapse has them (its /messages), oldest first."""
    r = user.call(
        "GET", f"/rooms/{quote(room_id, safe='')}/messages", params={"dir": "b", "limit": 50}
    )
    assert r.status_code == 200, r.text
    chunk = r.json()["chunk"]
    return [e["content"].get("body") for e in reversed(chunk) if e["type"] == "m.room.message"]


def wait_for_bodies(user: SynapseUser, room_id: str, want: list[str], within: float) -> list[str]:
    """Waits until Synapse has `want` in the room, in that order; a long-polled /sync is the
    wake-up, /messages the record."""
    deadline = time.monotonic() + within
    sync = synapse_sync(user)
    since = sync(None, 0)["next_batch"]
    while True:
        seen = bodies_seen(user, room_id)
        if [b for b in seen if b in want] == want:
            return seen
        left = deadline - time.monotonic()
        assert left > 0, f"Synapse has {seen}, wanted {want}"
        since = sync(since, int(min(left, 10) * 1000))["next_batch"]


def shared_room(weir, synapse, name: str):
    alice = MatrixClient(weir.client_url)
    alice.register(f"alice-{name}")
    r = alice.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": "10"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    bob = SynapseUser(synapse, f"bob-{name}")
    r = bob.call("POST", f"/join/{quote(room_id, safe='')}", params={"server_name": WEIR_NAME})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    return alice, bob, room_id


def say(alice, room_id: str, texts: list[str]) -> None:
    for text in texts:
        r = alice.put(
            f"{V3}/rooms/{quote(room_id, safe='')}/send/m.room.message/{text}",
            json={"msgtype": "m.text", "body": text},
        )
        assert r.status_code == 200, r.text


# Synapse takes a while to start, and the sender's backoff (10 s, 20 s, 40 s) runs meanwhile.
@pytest.mark.timeout(360)
@pytest.mark.parametrize("weir_stop", [None, "kill -9"])
def test_messages_sent_while_synapse_is_down_arrive_in_order(weir, synapse, weir_stop):
    tag = "k" if weir_stop else "r"
    alice, bob, room_id = shared_room(weir, synapse, tag)
    say(alice, room_id, [f"{tag}-warm"])
    wait_for_bodies(bob, room_id, [f"{tag}-warm"], within=10)
    want = [f"{tag}-1", f"{tag}-2", f"{tag}-3"]
    synapse.stop()
    say(alice, room_id, want)
    if weir_stop:
        weir.proc.send_signal(signal.SIGKILL)
        weir.proc.wait(10)
        weir._stderr.close()
    synapse.start()
    if weir_stop:
        weir.start()  # resumes the outbox at once
    # Nothing new is sent: the sender's retry (after its backoff) or its restart delivers.
    seen = wait_for_bodies(bob, room_id, want, within=150)
    assert seen == [f"{tag}-warm", *want]
