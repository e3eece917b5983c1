"""Our users joining rooms that a real Synapse 1.163 holds, TLS both ways: by alias and by
room ID with `via`, the room's state taken from Synapse's send_join answer, and Synapse's
messages reaching our /sync afterwards."""

from urllib.parse import quote

import gevent
import pytest

from tests.support.federation import tls_weir
from tests.support.metrics import in_flight
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.40.15.1"
WEIR_NAME = f"{WEIR_IP}:8448"
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-remote-join"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


@pytest.fixture(scope="module")
def bob(synapse):
    return MatrixClient(synapse.client_url, synapse.register("joinbob")["access_token"])


@pytest.fixture(scope="module")
def alice(weir):
    user = MatrixClient(weir.client_url)
    user.register("joinalice")
    return user


def _room(path: str, room_id: str) -> str:
    return f"{V3}/rooms/{quote(room_id, safe='')}{path}"


def _public_room(bob, **body) -> str:
    r = bob.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": "10", **body})
    assert r.status_code == 200, r.text
    return r.json()["room_id"]


def _wait_for_message(client, room_id: str, body: str, timeout: float = 10) -> dict:
    """Long-polls /sync until a message with `body` shows in the room's timeline."""
    since = None
    with gevent.Timeout(timeout, AssertionError(f"{body!r} never reached /sync")):
        while True:
            params = {"timeout": "5000", **({"since": since} if since else {})}
            r = client.get(f"{V3}/sync", params=params, timeout=30)
            assert r.status_code == 200, r.text
            since = r.json()["next_batch"]
            room = r.json().get("rooms", {}).get("join", {}).get(room_id, {})
            for event in room.get("timeline", {}).get("events", []):
                if event.get("content", {}).get("body") == body:
                    return event


def test_join_by_alias_takes_the_rooms_state_from_synapse(weir, alice, bob, synapse):
    room_id = _public_room(bob, name="Public Square", topic="all welcome", room_alias_name="public")
    alias = f"#public:{synapse.server_name}"

    r = alice.post(f"{V3}/join/{quote(alias)}", json={})
    assert r.status_code == 200, r.text
    assert r.json()["room_id"] == room_id
    assert room_id in alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]
    name = alice.get(_room("/state/m.room.name", room_id))
    assert (name.status_code, name.json()) == (200, {"name": "Public Square"})
    topic = alice.get(_room("/state/m.room.topic", room_id)).json()
    assert topic["topic"] == "all welcome"
    state = {(e["type"], e["state_key"]): e for e in alice.get(_room("/state", room_id)).json()}
    assert (
        state[("m.room.create", "")]["sender"] == bob.get(f"{V3}/account/whoami").json()["user_id"]
    )
    assert state[("m.room.member", "@joinalice:" + WEIR_NAME)]["content"]["membership"] == "join"

    # Synapse took our send_join: it lists us as a member.
    members = bob.get(_room("/joined_members", room_id)).json()["joined"]
    assert "@joinalice:" + WEIR_NAME in members

    # And what Synapse's users write reaches us.
    sent = bob.put(
        _room("/send/m.room.message/t1", room_id), json={"msgtype": "m.text", "body": "hi weir"}
    )
    assert sent.status_code == 200, sent.text
    seen = _wait_for_message(alice, room_id, "hi weir")
    assert seen["event_id"] == sent.json()["event_id"]


def test_join_by_room_id_with_via_then_leave(weir, alice, bob, synapse):
    room_id = _public_room(bob, name="By ID")

    no_via = alice.post(f"{V3}/join/{quote(room_id)}", json={})
    # The room ID names Synapse itself, so even without via it is found there.
    assert no_via.status_code == 200, no_via.text
    leave = alice.post(_room("/leave", room_id), json={})
    assert leave.status_code == 200, leave.text

    other = _public_room(bob, name="Via")
    r = alice.post(
        f"{V3}/join/{quote(other)}",
        params={"via": ["nowhere.invalid", synapse.server_name]},
        json={"reason": "hello"},
    )
    assert r.status_code == 200, r.text
    member = alice.get(_room("/state/m.room.member/" + quote("@joinalice:" + WEIR_NAME), other))
    assert member.json()["membership"] == "join" and member.json()["reason"] == "hello"
    assert alice.get(_room("/state/m.room.name", other)).json() == {"name": "Via"}


def test_unknown_remote_room_is_not_found(weir, alice, synapse):
    r = alice.post(f"{V3}/join/{quote('!nosuchroom:' + synapse.server_name)}", json={})
    assert r.status_code in (403, 404), r.text
    assert (
        "!nosuchroom:" + synapse.server_name
        not in alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]
    )


def test_we_invite_a_synapse_user_who_joins_and_messages_flow_both_ways(weir, alice, bob, synapse):
    created = alice.post(f"{V3}/createRoom", json={"preset": "private_chat", "name": "Ours"})
    assert created.status_code == 200, created.text
    room_id = created.json()["room_id"]
    bob_id = bob.get(f"{V3}/account/whoami").json()["user_id"]

    r = alice.post(_room("/invite", room_id), json={"user_id": bob_id})
    assert r.status_code == 200, r.text
    member = alice.get(_room("/state/m.room.member/" + quote(bob_id), room_id))
    assert member.json()["membership"] == "invite"
    # Synapse saw it: the invite is in its user's /sync, with the room's stripped state.
    with gevent.Timeout(10, AssertionError("the invite never reached Synapse's /sync")):
        while True:
            invites = bob.get(f"{V3}/sync", params={"timeout": "2000"}, timeout=30).json()
            invited = invites.get("rooms", {}).get("invite", {}).get(room_id)
            if invited:
                break
    stripped = {e["type"]: e for e in invited["invite_state"]["events"]}
    assert stripped["m.room.name"]["content"] == {"name": "Ours"}
    # Synapse's user accepts: Synapse runs make_join/send_join against us.
    r = bob.post(f"{V3}/join/{quote(room_id, safe='')}", json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    joined = alice.get(_room("/state/m.room.member/" + quote(bob_id), room_id))
    assert joined.json()["membership"] == "join"
    r = bob.put(_room("/send/m.room.message/b1", room_id), json={"msgtype": "m.text", "body": "hi"})
    assert r.status_code == 200, r.text
    _wait_for_message(alice, room_id, "hi")
    r = alice.put(
        _room("/send/m.room.message/a1", room_id), json={"msgtype": "m.text", "body": "yo"}
    )
    assert r.status_code == 200, r.text
    _wait_for_message(bob, room_id, "yo")


def test_create_room_invites_a_synapse_user_who_joins(weir, alice, bob, synapse):
    bob_id = bob.get(f"{V3}/account/whoami").json()["user_id"]
    # From here on (incremental: Synapse answers a repeated initial /sync from its cache).
    since = bob.get(f"{V3}/sync", params={"timeout": "0"}, timeout=30).json()["next_batch"]
    created = alice.post(
        f"{V3}/createRoom",
        json={"preset": "trusted_private_chat", "is_direct": True, "invite": [bob_id]},
    )
    assert created.status_code == 200, created.text
    room_id = created.json()["room_id"]
    member = alice.get(_room("/state/m.room.member/" + quote(bob_id), room_id)).json()
    assert member == {"membership": "invite", "is_direct": True}
    assert in_flight(weir.client_url, "client_outbound") == 0

    # Synapse countersigned it and shows it to its user, who joins through us.
    with gevent.Timeout(10, AssertionError("the invite never reached Synapse's /sync")):
        while True:
            params = {"timeout": "2000", "since": since}
            invites = bob.get(f"{V3}/sync", params=params, timeout=30).json()
            if room_id in invites.get("rooms", {}).get("invite", {}):
                break
            since = invites["next_batch"]
    r = bob.post(f"{V3}/join/{quote(room_id)}", json={})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    member = alice.get(_room("/state/m.room.member/" + quote(bob_id), room_id)).json()
    assert member["membership"] == "join"
