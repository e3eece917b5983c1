"""History and gaps with a real Synapse 1.163, TLS both ways.

- History: one of our users joins a Synapse room that already holds 50 messages, and pages
  back through all 50 (/messages backfills from Synapse, rooms/backfill.py).
- A gap: Synapse's user sends 5 messages while we are down, then a 6th once we are back;
  what Synapse sends lacks its predecessors, so we fetch them (rooms/gaps.py), and
  /messages shows all 6 in order.
"""

import os
from urllib.parse import quote

import gevent
import pytest

from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.31.111.2"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-history"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


@pytest.fixture(scope="module")
def bob(synapse):
    return MatrixClient(synapse.client_url, synapse.register("histbob")["access_token"])


@pytest.fixture(scope="module")
def alice(weir):
    user = MatrixClient(weir.client_url)
    user.register("histalice")
    return user


def _room(path: str, room_id: str) -> str:
    return f"{V3}/rooms/{quote(room_id, safe='')}{path}"


def _say(client, room_id: str, body: str) -> str:
    r = client.put(
        _room(f"/send/m.room.message/{quote(body)}", room_id),
        json={"msgtype": "m.text", "body": body},
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def _messages_back(client, room_id: str, limit: int = 10) -> list[dict]:
    """Every message /messages gives going back from now, a page at a time, oldest first."""
    found, token = [], None
    for _ in range(50):
        params = {"dir": "b", "limit": limit, **({"from": token} if token else {})}
        r = client.get(_room("/messages", room_id), params=params)
        assert r.status_code == 200, r.text
        found += r.json()["chunk"]
        token = r.json().get("end")
        if token is None:
            break
    return [e for e in reversed(found) if e["type"] == "m.room.message"]


def test_a_joiner_pages_back_through_history_from_before_it_joined(weir, alice, bob, synapse):
    r = bob.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    sent = [_say(bob, room_id, f"old {n}") for n in range(50)]

    r = alice.post(f"{V3}/join/{quote(room_id)}", params={"server_name": synapse.server_name})
    assert r.status_code == 200, r.text
    # The answer's state and auth chain are outliers: the join's sync shows our join alone
    # in its timeline, the room's state beside it, and /messages the latest messages first.
    me = f"@histalice:{WEIR_NAME}"
    joined = alice.get(f"{V3}/sync").json()["rooms"]["join"][room_id]
    timeline = joined["timeline"]["events"]
    assert [(e["type"], e.get("state_key")) for e in timeline] == [("m.room.member", me)]
    state = {(e["type"], e["state_key"]) for e in joined["state"]["events"]}
    assert {("m.room.create", ""), ("m.room.member", f"@histbob:{synapse.server_name}")} <= state
    r = alice.get(_room("/messages", room_id), params={"dir": "b", "limit": 10})
    first = r.json()["chunk"]
    assert first[0]["type"] == "m.room.member" and first[0]["state_key"] == me, first[0]
    assert [e["content"].get("body") for e in first[1:]] == [f"old {n}" for n in range(49, 40, -1)]
    messages = _messages_back(alice, room_id)
    assert [e["event_id"] for e in messages] == sent
    assert [e["content"]["body"] for e in messages] == [f"old {n}" for n in range(50)]
    # History is not news: a sync shows none of it in the timeline.
    timeline = alice.get(f"{V3}/sync").json()["rooms"]["join"][room_id]["timeline"]["events"]
    assert not {e["event_id"] for e in timeline} & set(sent)


def test_a_gap_is_filled_from_synapse(weir, alice, bob, synapse):
    r = bob.post(f"{V3}/createRoom", json={"preset": "public_chat"})
    room_id = r.json()["room_id"]
    r = alice.post(f"{V3}/join/{quote(room_id)}", params={"server_name": synapse.server_name})
    assert r.status_code == 200, r.text
    first = _say(bob, room_id, "before")
    _wait_for(alice, room_id, first)

    weir.stop()
    missed = [_say(bob, room_id, f"missed {n}") for n in range(5)]
    # A restart empties Synapse's queue for us: from its database it catches up with only the
    # newest event of the room, so its four predecessors are a gap we must fetch.
    synapse.stop()
    synapse.start()
    log_from = os.path.getsize(synapse.log_path)
    # Synapse, back, is already retrying to us: held as down, we wake it when we speak.
    synapse.back_off_from(WEIR_NAME, f"@histalice:{WEIR_NAME}")
    weir.start()
    alice.base_url = weir.client_url  # the client listener's port is picked anew
    # Our message wakes Synapse's sender for us (an inbound transaction ends its backoff).
    _say(alice, room_id, "back")
    last = _say(bob, room_id, "sixth")
    _wait_for(alice, room_id, last, timeout=60)
    messages = [e["event_id"] for e in _messages_back(alice, room_id)]
    wanted = [*missed, last]
    assert [e for e in messages if e in wanted] == wanted
    # Synapse's catch-up sends only the newest event of a room: the rest were asked for.
    with open(synapse.log_path, errors="replace") as f:
        f.seek(log_from)
        assert "/_matrix/federation/v1/get_missing_events/" in f.read()


def _wait_for(client, room_id: str, event_id: str, timeout: float = 20) -> None:
    """Long-polls /sync until `event_id` is in the room's timeline."""
    since = None
    with gevent.Timeout(timeout, AssertionError(f"{event_id} never reached /sync")):
        while True:
            params = {"timeout": "5000", **({"since": since} if since else {})}
            body = client.get(f"{V3}/sync", params=params, timeout=30).json()
            since = body["next_batch"]
            room = body.get("rooms", {}).get("join", {}).get(room_id, {})
            if event_id in {e["event_id"] for e in room.get("timeline", {}).get("events", [])}:
                return
