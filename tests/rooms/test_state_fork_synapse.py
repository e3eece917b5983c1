"""State resolution across a real fork with Synapse 1.163, TLS both ways: our user and a
Synapse user, both at power 100, change the room name and the power levels while the other
server is stopped; once both are back and each side has sent one more event (so the DAG
merges), GET /state on Weir and on Synapse must hold the same resolved state.

This module runs a Synapse of its own (it stops and restarts it), on a neighbour of
WEIR_TEST_SYNAPSE_IP so that it never collides with the session's shared one."""

import os
import time
from urllib.parse import quote

import pytest

from tests.rooms.test_membership_synapse import SynapseUser, synapse_sync, weir_sync
from tests.support.federation import tls_weir
from tests.support.server import MatrixClient
from tests.support.synapse import SynapseServer, synapse_available

pytestmark = pytest.mark.synapse

V3 = "/_matrix/client/v3"
_BASE = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
SYNAPSE_IP = f"{_BASE}.7"
WEIR_IP = f"{_BASE}.8"
WEIR_NAME = f"{WEIR_IP}:8448"


@pytest.fixture(scope="module")
def synapse(test_ca, tmp_path_factory):
    if not synapse_available():
        pytest.skip("Synapse venv missing: run `make synapse`")
    server = SynapseServer(str(tmp_path_factory.mktemp("synapse-fork")), test_ca, ip=SYNAPSE_IP)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-fork"))
    proc = tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME).start()
    yield proc
    proc.stop()


def _quoted(room_id: str) -> str:
    return quote(room_id, safe="")


def weir_has(alice: MatrixClient, room_id: str, event_id: str) -> bool:
    r = alice.get(f"{V3}/rooms/{_quoted(room_id)}/event/{quote(event_id, safe='')}")
    return r.status_code == 200


def synapse_has(bob: SynapseUser, room_id: str, event_id: str) -> bool:
    r = bob.call("GET", f"/rooms/{_quoted(room_id)}/event/{quote(event_id, safe='')}")
    return r.status_code == 200


def wait_until(check, sync_once, within: float, what: str) -> None:
    """Re-checks `check()` each time the long-polled /sync (`sync_once`) wakes, for at most
    `within` seconds."""
    deadline = time.monotonic() + within
    since = sync_once(None, 0)["next_batch"]
    while not check():
        left = deadline - time.monotonic()
        assert left > 0, f"{what} did not happen within {within} s"
        since = sync_once(since, int(min(left, 5) * 1000))["next_batch"]


def state_map(events: list[dict]) -> dict[tuple[str, str], dict]:
    return {(e["type"], e["state_key"]): e["content"] for e in events}


def changed_levels(call, room_id: str, user_id: str, **levels) -> dict:
    """The room's power levels as `call`'s server has them, with `user_id` at 50 and
    `levels` set (the rest kept: v12 rooms hold a tombstone level above 100)."""
    r = call("GET", f"/rooms/{_quoted(room_id)}/state/m.room.power_levels/")
    assert r.status_code == 200, r.text
    content = r.json()
    content["users"] = {**content.get("users", {}), user_id: 50}
    return {**content, **levels}


def put_state(call, room_id: str, event_type: str, content: dict) -> str:
    r = call("PUT", f"/rooms/{_quoted(room_id)}/state/{event_type}/", json=content)
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("version", ["10", "12"])
def test_concurrent_name_and_power_changes_resolve_to_the_same_state_on_both(
    weir, synapse, version
):
    alice = MatrixClient(weir.client_url)
    alice_id = alice.register(f"fork-alice{version}")["user_id"]
    bob = SynapseUser(synapse, f"fork-bob{version}")
    users = {bob.user_id: 100} if version == "12" else {alice_id: 100, bob.user_id: 100}
    r = alice.post(
        f"{V3}/createRoom",
        json={
            "preset": "public_chat",
            "room_version": version,
            "name": "before the fork",
            "power_level_content_override": {"users": users},
        },
    )
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    r = bob.call("POST", f"/join/{_quoted(room_id)}", params={"server_name": WEIR_NAME}, json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())

    def weir_call(method, path, **kw):
        return alice.request(method, V3 + path, **kw)

    # Our side of the fork, while Synapse is down: queued in our outbox.
    synapse.stop()
    ours = [
        put_state(weir_call, room_id, "m.room.name", {"name": "named on weir"}),
        put_state(
            weir_call,
            room_id,
            "m.room.power_levels",
            changed_levels(weir_call, room_id, f"@w:{WEIR_NAME}", state_default=60),
        ),
    ]
    # Synapse's side, while we are down: queued in Synapse's.
    weir.stop()
    synapse.start()
    theirs = [
        put_state(bob.call, room_id, "m.room.name", {"name": "named on synapse"}),
        put_state(
            bob.call,
            room_id,
            "m.room.power_levels",
            changed_levels(bob.call, room_id, f"@s:{synapse.server_name}", events_default=10),
        ),
    ]
    # Synapse is already retrying to us: held as down, it sends as soon as we speak.
    synapse.back_off_from(WEIR_NAME, alice_id)
    weir.start()  # resumes its outbox at once; Synapse hears from us and sends its own
    alice.base_url = weir.client_url  # the client listener's port is picked anew
    wait_until(
        lambda: all(synapse_has(bob, room_id, e) for e in ours),
        synapse_sync(bob),
        150,
        "Synapse receiving our side",
    )
    wait_until(
        lambda: all(weir_has(alice, room_id, e) for e in theirs),
        weir_sync(alice),
        150,
        "Weir receiving Synapse's side",
    )
    # One more event from each side: each names both branches as prev_events.
    r = alice.put(
        f"{V3}/rooms/{_quoted(room_id)}/send/m.room.message/merge",
        json={"msgtype": "m.text", "body": "merge from weir"},
    )
    assert r.status_code == 200, r.text
    from_weir = r.json()["event_id"]
    r = bob.call(
        "PUT",
        f"/rooms/{_quoted(room_id)}/send/m.room.message/merge",
        json={"msgtype": "m.text", "body": "merge from synapse"},
    )
    assert r.status_code == 200, r.text
    from_synapse = r.json()["event_id"]
    wait_until(
        lambda: synapse_has(bob, room_id, from_weir), synapse_sync(bob), 60, "our merge event"
    )
    wait_until(
        lambda: weir_has(alice, room_id, from_synapse), weir_sync(alice), 60, "Synapse's merge"
    )

    r = alice.get(f"{V3}/rooms/{_quoted(room_id)}/state")
    assert r.status_code == 200, r.text
    on_weir = state_map(r.json())
    r = bob.call("GET", f"/rooms/{_quoted(room_id)}/state")
    assert r.status_code == 200, r.text
    on_synapse = state_map(r.json())
    assert on_weir == on_synapse
    # Our /sync's state at the end of the timeline is the same resolved state, not the
    # latest state event of each key by the order we stored them in.
    params = {"use_state_after": "true", "filter": '{"room":{"timeline":{"limit":1}}}'}
    r = alice.get(f"{V3}/sync", params=params)
    assert r.status_code == 200, r.text
    room = r.json()["rooms"]["join"][room_id]
    assert state_map(room["state_after"]["events"]) == on_weir
    # The resolution picked one side of each key; both sides agree on which.
    assert on_weir[("m.room.name", "")]["name"] in ("named on weir", "named on synapse")
    assert on_weir[("m.room.member", bob.user_id)]["membership"] == "join"
