"""Membership with a real Synapse 1.163 on loopback, TLS both ways: Synapse's users join our
rooms (Synapse runs make_join/send_join against us) and messages flow both ways; a Synapse
user's invite of ours shows in our /sync with its stripped state."""

import time
from urllib.parse import quote

import pytest
import requests

from tests.support.federation import tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.31.104.2"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-members"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


class SynapseUser:
    def __init__(self, synapse, localpart: str):
        self.synapse = synapse
        login = synapse.register(localpart)
        self.user_id = login["user_id"]
        self.headers = {"Authorization": f"Bearer {login['access_token']}"}

    def call(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(
            method, self.synapse.client_url + V3 + path, headers=self.headers, timeout=90, **kw
        )


def wait_for_message(sync_once, room_id: str, body: str, within: float) -> None:
    """Long-polls /sync (through `sync_once(since, timeout_ms)`) until a message with
    `body` shows in the room's timeline, for at most `within` seconds."""
    deadline = time.monotonic() + within
    since = None
    while time.monotonic() < deadline:
        data = sync_once(since, int(max(0.0, deadline - time.monotonic()) * 1000))
        room = data.get("rooms", {}).get("join", {}).get(room_id, {})
        if any(
            e.get("content", {}).get("body") == body
            for e in room.get("timeline", {}).get("events", [])
        ):
            return
        since = data["next_batch"]
    raise AssertionError(f"{body!r} not seen in {room_id} within {within} s")


def weir_sync(client):
    def once(since, timeout_ms):
        params = {"timeout": timeout_ms, **({"since": since} if since else {})}
        r = client.get(f"{V3}/sync", params=params, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    return once


def synapse_sync(user: SynapseUser):
    def once(since, timeout_ms):
        params = {"timeout": timeout_ms, **({"since": since} if since else {})}
        r = user.call("GET", "/sync", params=params)
        assert r.status_code == 200, r.text
        return r.json()

    return once


# 1: IDs carried by events, state resolution v1; 3: IDs with `/`; None: our default, v12.
@pytest.mark.parametrize("version", ["1", "3", "4", "9", "10", None])
def test_a_synapse_user_joins_our_room_and_messages_flow_both_ways(weir, synapse, version):
    alice = MatrixClient(weir.client_url)
    alice.register(f"alice{version}")
    chosen = {"room_version": version} if version else {}
    r = alice.post(
        f"{V3}/createRoom", json={"preset": "public_chat", "name": "Weir side", **chosen}
    )
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    r = alice.get(f"{V3}/rooms/{quote(room_id, safe='')}/state/m.room.create/")
    assert r.json()["room_version"] == (version or "12")
    bob = SynapseUser(synapse, f"member_bob{version}")
    # Synapse's make_join and send_join against us.
    r = bob.call(
        "POST", f"/join/{quote(room_id, safe='')}", params={"server_name": WEIR_NAME}, json={}
    )
    assert r.status_code == 200, (r.text, synapse.log_tail())
    r = bob.call("GET", f"/rooms/{quote(room_id, safe='')}/state/m.room.name/")
    assert r.json() == {"name": "Weir side"}
    r = alice.get(f"{V3}/rooms/{quote(room_id, safe='')}/state/m.room.member/{bob.user_id}")
    assert r.json()["membership"] == "join"
    # Synapse -> us (its /send), then us -> Synapse (our sender).
    r = bob.call(
        "PUT",
        f"/rooms/{quote(room_id, safe='')}/send/m.room.message/s1",
        json={"msgtype": "m.text", "body": "from synapse"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(weir_sync(alice), room_id, "from synapse", within=10)
    r = alice.put(
        f"{V3}/rooms/{quote(room_id, safe='')}/send/m.room.message/w1",
        json={"msgtype": "m.text", "body": "from weir"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(synapse_sync(bob), room_id, "from weir", within=10)


def _invited(carol, room_id: str) -> dict:
    """Waits for the invite to `room_id` in carol's /sync, for at most 10 s."""
    deadline = time.monotonic() + 10
    since = None
    while time.monotonic() < deadline:
        params = {"timeout": 5000, **({"since": since} if since else {})}
        data = carol.get(f"{V3}/sync", params=params, timeout=30).json()
        invite = data["rooms"]["invite"].get(room_id)
        if invite is not None:
            return invite
        since = data["next_batch"]
    raise AssertionError("the invite never showed in /sync")


# 1 and 3: the event formats before v4 (the rest: test_room_versions_synapse.py); None:
# Synapse's default (v12).
@pytest.mark.parametrize("version", ["1", "3", "10", None])
def test_synapse_invites_and_our_user_joins_then_messages_flow(weir, synapse, version):
    erin = MatrixClient(weir.client_url)
    erin_id = erin.register(f"erin{version or 'default'}")["user_id"]
    frank = SynapseUser(synapse, f"member_frank{version or 'default'}")
    settings = {"name": "Invited", "invite": [erin_id]}
    r = frank.call(
        "POST", "/createRoom", json={**settings, **({"room_version": version} if version else {})}
    )
    assert r.status_code == 200, (r.text, synapse.log_tail())
    room_id = r.json()["room_id"]
    _invited(erin, room_id)
    # No via: the inviting server is asked.
    r = erin.post(f"{V3}/join/{quote(room_id, safe='')}", json={})
    assert r.status_code == 200, r.text
    assert r.json()["room_id"] == room_id
    r = frank.call(
        "PUT",
        f"/rooms/{quote(room_id, safe='')}/send/m.room.message/t1",
        json={"msgtype": "m.text", "body": "hello erin"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(weir_sync(erin), room_id, "hello erin", within=10)
    r = erin.put(
        f"{V3}/rooms/{quote(room_id, safe='')}/send/m.room.message/t2",
        json={"msgtype": "m.text", "body": "hello frank"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(synapse_sync(frank), room_id, "hello frank", within=10)
    # Leave: Synapse sees it.
    r = erin.post(f"{V3}/rooms/{quote(room_id, safe='')}/leave", json={})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = frank.call("GET", f"/rooms/{quote(room_id, safe='')}/state/m.room.member/{erin_id}")
        if r.status_code == 200 and r.json().get("membership") == "leave":
            break
        time.sleep(0.2)
    else:
        raise AssertionError("Synapse never saw our leave")


def test_an_invite_rejected_here_is_seen_by_synapse(weir, synapse):
    gina = MatrixClient(weir.client_url)
    gina_id = gina.register("gina")["user_id"]
    hal = SynapseUser(synapse, "member_hal")
    r = hal.call("POST", "/createRoom", json={"room_version": "10", "invite": [gina_id]})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    room_id = r.json()["room_id"]
    _invited(gina, room_id)
    # Rejected through the inviting server: make_leave/send_leave.
    r = gina.post(f"{V3}/rooms/{quote(room_id, safe='')}/leave", json={})
    assert r.status_code == 200, r.text
    r = hal.call("GET", f"/rooms/{quote(room_id, safe='')}/state/m.room.member/{gina_id}")
    assert r.status_code == 200 and r.json()["membership"] == "leave", r.text
    data = gina.get(f"{V3}/sync", timeout=30).json()
    assert room_id not in data["rooms"]["invite"]


def test_a_synapse_users_invite_shows_in_our_sync(weir, synapse):
    carol = MatrixClient(weir.client_url)
    carol.register("carol")
    dave = SynapseUser(synapse, "member_dave")
    r = dave.call(
        "POST",
        "/createRoom",
        json={"room_version": "10", "name": "Synapse side", "invite": [f"@carol:{WEIR_NAME}"]},
    )
    assert r.status_code == 200, (r.text, synapse.log_tail())
    room_id = r.json()["room_id"]
    deadline = time.monotonic() + 10
    since = None
    while time.monotonic() < deadline:
        params = {"timeout": 5000, **({"since": since} if since else {})}
        data = carol.get(f"{V3}/sync", params=params, timeout=30).json()
        invite = data["rooms"]["invite"].get(room_id)
        if invite is not None:
            break
        since = data["next_batch"]
    else:
        raise AssertionError("the invite never showed in /sync")
    events = invite["invite_state"]["events"]
    by_type = {e["type"]: e for e in events}
    assert by_type["m.room.name"]["content"] == {"name": "Synapse side"}
    assert events[-1]["type"] == "m.room.member"
    assert events[-1]["state_key"] == f"@carol:{WEIR_NAME}"
    assert events[-1]["sender"] == dave.user_id
    assert events[-1]["content"]["membership"] == "invite"
