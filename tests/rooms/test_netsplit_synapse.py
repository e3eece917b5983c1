"""A netsplit with a real Synapse 1.163: our server is down while Synapse's room gets 120
messages and 20 state changes among them (name, topic, power levels, joins). Once we are
back, the room is whole here: /messages has all 120 in order, our current state is
Synapse's, and nothing was refused. (Synapse sends us its queue in order here, 50 events
a transaction, so the 140 come in at least three; a catch-up that sends only the newest
event is tests/rooms/test_gaps.py's 300-event gap.)"""

import re
import time
from urllib.parse import quote

import pytest

from tests.rooms.test_membership_synapse import SynapseUser
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.40.17.1"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"
MESSAGES = 120
WITHIN = 120.0


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-netsplit"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def state_of(call, room: str) -> dict:
    r = call("GET", f"/rooms/{room}/state")
    assert r.status_code == 200, r.text
    return {(e["type"], e["state_key"]): e["event_id"] for e in r.json()}


def all_messages(call, room: str) -> list[str]:
    """Every message body, oldest first, paging /messages backwards."""
    bodies, token = [], None
    for _ in range(100):
        params = {"dir": "b", "limit": 100, **({"from": token} if token else {})}
        r = call("GET", f"/rooms/{room}/messages", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        bodies += [e["content"]["body"] for e in body["chunk"] if e["type"] == "m.room.message"]
        token = body.get("end")
        if not token or not body["chunk"]:
            break
    return bodies[::-1]


def test_a_room_that_went_on_while_we_were_down_is_whole_when_we_are_back(weir, synapse):
    sam = SynapseUser(synapse, "split_sam")
    r = sam.call("POST", "/createRoom", json={"preset": "public_chat", "name": "split"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    room = quote(room_id, safe="")
    carol = MatrixClient(weir.client_url)
    carol_id = carol.register("carol")["user_id"]
    r = carol.post(f"{V3}/join/{room}", params={"server_name": synapse.server_name}, json={})
    assert r.status_code == 200, r.text

    weir.stop()
    joiners = [SynapseUser(synapse, f"split_j{i}") for i in range(5)]
    for n in range(MESSAGES):
        r = sam.call(
            "PUT",
            f"/rooms/{room}/send/m.room.message/s{n}",
            json={"msgtype": "m.text", "body": f"m{n}"},
        )
        assert r.status_code == 200, r.text
        if n % 6 == 5:  # 20 state changes among the messages
            i = n // 6
            kind = i % 4
            if kind == 0:
                r = sam.call(
                    "PUT", f"/rooms/{room}/state/m.room.name/", json={"name": f"split {i}"}
                )
            elif kind == 1:
                r = sam.call("PUT", f"/rooms/{room}/state/m.room.topic/", json={"topic": f"t{i}"})
            elif kind == 2:
                levels = sam.call("GET", f"/rooms/{room}/state/m.room.power_levels/").json()
                levels.setdefault("events", {})["m.room.topic"] = 50 + i
                r = sam.call("PUT", f"/rooms/{room}/state/m.room.power_levels/", json=levels)
            else:
                r = joiners[i // 4].call("POST", f"/join/{room}", json={})
            assert r.status_code == 200, r.text
    # Synapse learns that we are down. Its transaction to us is meanwhile still retrying, a
    # minute apart at most: our first one back wakes it.
    synapse.back_off_from(WEIR_NAME, carol_id)
    with open(weir.stderr_path, "rb") as f:
        before_restart = f.seek(0, 2)
    weir.start()
    carol = MatrixClient(weir.client_url)
    carol.login("carol")

    # We speak first: Synapse's backoff for us ends, and its retrying transaction goes out
    # now, then the rest of its queue.
    r = carol.put(
        f"{V3}/rooms/{room}/send/m.room.message/back",
        json={"msgtype": "m.text", "body": "back"},
    )
    assert r.status_code == 200, r.text

    def at_weir(method, path, **kw):
        return carol.request(method, V3 + path, timeout=60, **kw)

    deadline = time.monotonic() + WITHIN
    theirs = state_of(sam.call, room)
    since = carol.get(f"{V3}/sync", params={"timeout": 0}, timeout=60).json()["next_batch"]
    while state_of(at_weir, room) != theirs:
        assert time.monotonic() < deadline, "our state never became Synapse's"
        r = carol.get(f"{V3}/sync", params={"since": since, "timeout": 5000}, timeout=60)
        since = r.json()["next_batch"]
    bodies = all_messages(at_weir, room)
    assert [b for b in bodies if b != "back"] == [f"m{n}" for n in range(MESSAGES)]
    with open(weir.stderr_path, "rb") as f:
        log = f.read().decode(errors="replace")
        f.seek(before_restart)
        since_restart = f.read().decode(errors="replace")
    # The queue itself came, 50 a transaction, not only its newest event.
    assert len(re.findall(r"PUT /_matrix/federation/v1/send/\S+ 200 ", since_restart)) >= 3
    # Nothing Synapse sent was refused, whole transactions or single PDUs.
    assert not re.search(r"/_matrix/federation/v1/send/\S+ 4\d\d ", log)
    assert " refused: " not in log
