"""A real bridge against the real server: mautrix's AppService (tests/appservice/
mautrix_bridge.py, a process of its own) registered through a YAML file, on SQLite and
PostgreSQL. It creates a puppet in its namespace and sends as it; it receives a room's
messages in transactions; its ping goes through us; a lookup of an alias in its namespace
asks it; and its namespace is closed to everyone else."""

from urllib.parse import quote

import pytest

from tests.appservice.conftest import (
    SERVER_NAME,
    V3,
    Bridge,
    as_client,
    create_room,
    free_port,
    registration_yaml,
    send,
    user,
)


@pytest.fixture
def bridged(start_with_appservices, database_url, tmp_path):
    port = free_port()
    weir = start_with_appservices(
        {"bridge": registration_yaml("bridge", f"http://127.0.0.1:{port}")}, database_url
    )
    bridge = Bridge(weir, "bridge", port, str(tmp_path))
    yield weir, bridge
    bridge.stop()


def test_a_mautrix_bridge_puppets_receives_pings_and_owns_its_namespace(bridged):
    weir, bridge = bridged
    alice = user(weir, "alice")
    room = create_room(alice, preset="public_chat")
    puppet = f"@bridge_bob:{SERVER_NAME}"

    # The puppet is registered by the bridge (m.login.application_service), joins and sends
    # as itself through the as_token and ?user_id=.
    sent = bridge.command("send_as", user=puppet, room=room, text="hello from the network")
    assert "error" not in sent, sent
    assert sent["whoami"] == puppet
    r = alice.get(f"{V3}/rooms/{quote(room)}/event/{quote(sent['event_id'])}")
    assert r.status_code == 200, r.text
    assert r.json()["sender"] == puppet
    assert r.json()["content"]["body"] == "hello from the network"

    # The room has a member in its namespace now: alice's messages reach the bridge, in
    # order, in transactions.
    first = send(alice, room, "one")
    second = send(alice, room, "two")
    assert bridge.wait_for_event(second)["content"]["body"] == "two"
    ids = [e["event_id"] for e in bridge.events]
    assert ids.index(first) < ids.index(second)
    assert bridge.wait_for_event(first)["sender"] == alice.user_id

    # Its ping goes through us to it and back.
    pong = bridge.command("ping", txn_id="ping-1")
    assert "error" not in pong, pong
    assert isinstance(pong["duration_ms"], int) and pong["duration_ms"] >= 0

    # An alias in its namespace that does not exist: the bridge is asked first.
    alias = f"#bridge_somewhere:{SERVER_NAME}"
    r = alice.get(f"{V3}/directory/room/{quote(alias, safe='')}")
    assert r.status_code == 404, r.text
    bridge.read_until(lambda line: line.get("query_alias") == alias)

    # Nobody else takes a name or an alias in its exclusive namespace.
    r = alice.post(
        f"{V3}/register", auth=False, json={"username": "bridge_mallory", "password": "x" * 12}
    )
    assert r.status_code == 400 and r.json()["errcode"] == "M_EXCLUSIVE", r.text
    r = alice.put(f"{V3}/directory/room/{quote(alias, safe='')}", json={"room_id": room})
    assert r.status_code == 400 and r.json()["errcode"] == "M_EXCLUSIVE", r.text
    r = alice.post(f"{V3}/createRoom", json={"room_alias_name": "bridge_somewhere"})
    assert r.status_code == 400 and r.json()["errcode"] == "M_EXCLUSIVE", r.text

    # Its token acts only within its namespace.
    bot = as_client(weir, "bridge")
    r = bot.get(f"{V3}/account/whoami", params={"user_id": alice.user_id})
    assert r.status_code == 403 and r.json()["errcode"] == "M_FORBIDDEN", r.text
