"""Our users knocking on rooms a real Synapse 1.163 holds, TLS both ways: make_knock and
send_knock through the via servers (or the room's alias), the knock in our /sync's
rooms.knock with the room's stripped state and in Synapse's room state, Synapse's invite
letting it in and our user then joining; a knock rescinded through make_leave/send_leave; a
room that takes no knocks refused with 403."""

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
from tests.support.metrics import in_flight
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.31.114.2"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-knocks"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def _room(path: str, room_id: str) -> str:
    return f"/rooms/{quote(room_id, safe='')}{path}"


def _knock_room(owner: SynapseUser, version: str | None, **body) -> str:
    """A private room on Synapse whose join rule is knock; version None: Synapse's default."""
    r = owner.call(
        "POST",
        "/createRoom",
        json={
            "preset": "private_chat",
            "initial_state": [
                {"type": "m.room.join_rules", "state_key": "", "content": {"join_rule": "knock"}}
            ],
            **({"room_version": version} if version else {}),
            **body,
        },
    )
    assert r.status_code == 200, (r.text, owner.synapse.log_tail())
    return r.json()["room_id"]


def _synced(client, section: str, room_id: str, since: str | None = None) -> tuple[dict, str]:
    """Long-polls /sync until `room_id` shows in rooms[section]; (its entry, next_batch)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        params = {"timeout": 5000, **({"since": since} if since else {})}
        r = client.get(f"{V3}/sync", params=params, timeout=30)
        assert r.status_code == 200, r.text
        data = r.json()
        since = data["next_batch"]
        entry = data["rooms"][section].get(room_id)
        if entry is not None:
            return entry, since
    raise AssertionError(f"{room_id} never showed in rooms.{section}")


def _synapse_membership(owner: SynapseUser, room_id: str, user_id: str) -> dict:
    r = owner.call("GET", _room(f"/state/m.room.member/{quote(user_id)}", room_id))
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("version", ["10", None])  # None: Synapse's default (v12)
def test_knock_seen_by_synapse_let_in_by_invite_then_messages_flow(weir, synapse, version):
    name = f"kim{version or 'default'}"
    kim = MatrixClient(weir.client_url)
    kim_id = kim.register(name)["user_id"]
    owner = SynapseUser(synapse, f"door_{name}")
    room_id = _knock_room(owner, version, name="Knock here", topic="ask first")

    r = kim.post(
        f"{V3}/knock/{quote(room_id, safe='')}",
        params={"via": synapse.server_name},
        json={"reason": "let me in"},
    )
    assert r.status_code == 200, (r.text, synapse.log_tail())
    assert r.json() == {"room_id": room_id}
    assert in_flight(weir.client_url, "client_outbound") == 0

    # Our /sync: the room under knock, with the stripped state Synapse's send_knock gave.
    knocked, since = _synced(kim, "knock", room_id)
    events = knocked["knock_state"]["events"]
    by_type = {e["type"]: e for e in events}
    assert by_type["m.room.name"]["content"] == {"name": "Knock here"}
    assert by_type["m.room.join_rules"]["content"] == {"join_rule": "knock"}
    assert events[-1]["type"] == "m.room.member" and events[-1]["state_key"] == kim_id
    assert events[-1]["content"] == {"membership": "knock", "reason": "let me in"}
    # Synapse took it into the room.
    assert _synapse_membership(owner, room_id, kim_id) == {
        "membership": "knock",
        "reason": "let me in",
    }

    # Accepted: Synapse's user invites the knocker; the invite replaces the knock here.
    r = owner.call("POST", _room("/invite", room_id), json={"user_id": kim_id})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    _synced(kim, "invite", room_id, since)
    assert room_id not in kim.get(f"{V3}/sync", timeout=30).json()["rooms"]["knock"]
    # Joined without via: the inviting server is asked.
    r = kim.post(f"{V3}/join/{quote(room_id, safe='')}", json={})
    assert r.status_code == 200, r.text
    assert _synapse_membership(owner, room_id, kim_id)["membership"] == "join"

    r = owner.call(
        "PUT", _room("/send/m.room.message/k1", room_id), json={"msgtype": "m.text", "body": "hi"}
    )
    assert r.status_code == 200, r.text
    wait_for_message(weir_sync(kim), room_id, "hi", within=10)
    r = kim.put(
        f"{V3}{_room('/send/m.room.message/k2', room_id)}",
        json={"msgtype": "m.text", "body": "thanks"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(synapse_sync(owner), room_id, "thanks", within=10)
    assert room_id not in kim.get(f"{V3}/sync", timeout=30).json()["rooms"]["knock"]


def test_knock_by_alias_then_rescinded(weir, synapse):
    lee = MatrixClient(weir.client_url)
    lee_id = lee.register("lee")["user_id"]
    owner = SynapseUser(synapse, "door_lee")
    room_id = _knock_room(owner, "10", name="Porch", room_alias_name="porch")

    # No via: the alias's server answers the lookup and takes the knock.
    r = lee.post(f"{V3}/knock/{quote(f'#porch:{synapse.server_name}')}", json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    assert r.json() == {"room_id": room_id}
    _, since = _synced(lee, "knock", room_id)
    assert _synapse_membership(owner, room_id, lee_id)["membership"] == "knock"

    # Rescinded: make_leave/send_leave through a server of the room.
    r = lee.post(f"{V3}{_room('/leave', room_id)}", json={"reason": "never mind"})
    assert r.status_code == 200, r.text
    assert in_flight(weir.client_url, "client_outbound") == 0
    assert _synapse_membership(owner, room_id, lee_id) == {
        "membership": "leave",
        "reason": "never mind",
    }
    left, _ = _synced(lee, "leave", room_id, since)
    (leave,) = left["timeline"]["events"]
    assert (leave["type"], leave["state_key"], leave["sender"]) == ("m.room.member", lee_id, lee_id)
    assert leave["content"]["membership"] == "leave"
    data = lee.get(f"{V3}/sync", timeout=30).json()
    assert room_id not in data["rooms"]["knock"]

    # Nothing left to rescind; and a knock again is taken.
    r = lee.post(
        f"{V3}/knock/{quote(room_id, safe='')}", params={"via": synapse.server_name}, json={}
    )
    assert r.status_code == 200, r.text
    _synced(lee, "knock", room_id)


def test_a_room_that_takes_no_knocks_refuses_with_403(weir, synapse):
    max_ = MatrixClient(weir.client_url)
    max_id = max_.register("max")["user_id"]
    owner = SynapseUser(synapse, "door_max")
    r = owner.call("POST", "/createRoom", json={"preset": "private_chat", "room_version": "10"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]

    r = max_.post(
        f"{V3}/knock/{quote(room_id, safe='')}", params={"via": synapse.server_name}, json={}
    )
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN"), r.text
    assert in_flight(weir.client_url, "client_outbound") == 0
    data = max_.get(f"{V3}/sync", timeout=30).json()
    assert room_id not in data["rooms"]["knock"]
    r = owner.call("GET", _room(f"/state/m.room.member/{quote(max_id)}", room_id))
    assert r.status_code == 404, r.text


def test_an_invite_rescinded_on_synapse_ends_it_here(weir, synapse):
    """Synapse sends the rescinding leave to the invitee's server (the invite among its auth
    events): the invite we kept ends, and our /sync moves the room to rooms.leave."""
    ned = MatrixClient(weir.client_url)
    ned_id = ned.register("ned")["user_id"]
    owner = SynapseUser(synapse, "door_ned")
    r = owner.call("POST", "/createRoom", json={"room_version": "10", "invite": [ned_id]})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    room_id = r.json()["room_id"]
    _, since = _synced(ned, "invite", room_id)

    r = owner.call("POST", _room("/kick", room_id), json={"user_id": ned_id, "reason": "oops"})
    assert r.status_code == 200, r.text
    left, _ = _synced(ned, "leave", room_id, since)
    (leave,) = left["timeline"]["events"]
    assert (leave["sender"], leave["state_key"]) == (owner.user_id, ned_id)
    assert leave["content"] == {"membership": "leave", "reason": "oops"}
    data = ned.get(f"{V3}/sync", timeout=30).json()
    assert room_id not in data["rooms"]["invite"]
    # Nothing is left to reject: a leave now is refused locally, no call out.
    r = ned.post(f"{V3}{_room('/leave', room_id)}", json={})
    assert r.status_code in (403, 404), r.text
