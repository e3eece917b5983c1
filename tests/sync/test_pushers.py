"""Pushers and the push sender on the real server (SQLite and PostgreSQL), delivering to
push gateways on loopback over real HTTP (tests/peers/push_gateway.py): pushers set,
listed and deleted, and the refusals; a message's notify with its fields, and with
`event_id_only` only the IDs and counts; a tarpit gateway holding at most
`push.max_in_flight` connections while another user's live gateway is served at once; a
restart between a message and its push delivering it once; a loopback or private gateway
never connected to by default; `rejected` removing the pusher; a failing gateway caught up;
a deactivation removing the user's pushers."""

import itertools
import sqlite3

import gevent
import psycopg
import pytest

from tests.peers.push_gateway import PushGateway
from tests.peers.tarpit import Tarpit
from tests.rooms.conftest import V3, create_room, whoami
from tests.support.metrics import metric
from tests.support.server import MatrixClient, WeirProcess, base_settings
from tests.support.spec import assert_matches_spec

GATEWAY_IP = "127.40.70.1"  # allowed by the server's push.ip_range_allowlist
TARPIT_IP = "127.40.70.2"
MAX_IN_FLIGHT = 4
DEADLINE = 30  # long: a tarpit's connections are still held when the live gateway answers
_txns = itertools.count()


def push_settings(directory, engine: str, request) -> dict:
    settings = base_settings(str(directory / "data"))
    if engine == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    settings["push"] = {
        "max_in_flight": MAX_IN_FLIGHT,
        "deadline": DEADLINE,
        "ip_range_allowlist": ["127.40.70.0/24"],
    }
    return settings


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("weir-push")
    settings = push_settings(directory, request.param, request)
    proc = WeirProcess(str(directory), settings).start()
    proc.database_url = settings.get("database", {}).get(
        "url", f"sqlite:///{directory}/data/homeserver.db"
    )
    yield proc
    proc.stop()


@pytest.fixture
def gateway():
    with PushGateway(GATEWAY_IP) as gateway:
        yield gateway


def set_pusher(client, url: str, status: int = 200, **fields) -> dict:
    body = {
        "kind": "http",
        "app_id": "org.weir.test",
        "pushkey": "key-" + client.user_id,
        "app_display_name": "Weir tests",
        "device_display_name": "A test phone",
        "lang": "en",
        "data": {"url": url},
        **fields,
    }
    r = client.post(f"{V3}/pushers/set", json=body)
    assert r.status_code == status, r.text
    return r.json()


def listed(client) -> list[dict]:
    r = client.get(f"{V3}/pushers")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", "/_matrix/client/v3/pushers")
    return r.json()["pushers"]


def room_with(alice, *others, **body) -> str:
    room = create_room(alice, invite=[o.user_id for o in others], **body)
    for other in others:
        r = other.post(f"{V3}/join/{room}", json={})
        assert r.status_code == 200, r.text
    return room


def message(client, room: str, text: str, **content) -> str:
    r = client.put(
        f"{V3}/rooms/{room}/send/m.room.message/p{next(_txns)}",
        json={"msgtype": "m.text", "body": text, **content},
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def unread_total(client) -> int:
    """The user's unread notifications over their joined rooms, as /sync counts them."""
    r = client.get(f"{V3}/sync", params={"timeout": 0})
    assert r.status_code == 200, r.text
    joined = r.json()["rooms"]["join"].values()
    return sum(room["unread_notifications"]["notification_count"] for room in joined)


def stored_pushkeys(server, user_id: str) -> list[str]:
    """The user's pushers as the database the server writes holds them."""
    sql = "SELECT pushkey FROM pushers WHERE user_id = {} ORDER BY pushkey"
    url = server.database_url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            rows = conn.execute(sql.format("?"), (user_id,)).fetchall()
        finally:
            conn.close()
    else:
        with psycopg.connect(url) as pg:
            rows = pg.execute(sql.format("%s"), (user_id,)).fetchall()
    return [r[0] for r in rows]


def wait_metric(server, name: str, at_least: float, timeout: float = 10) -> None:
    """The server offers no event to wait on across the process boundary: /metrics is
    read again until the counter gets there."""
    with gevent.Timeout(timeout, AssertionError(f"{name} never reached {at_least}")):
        while metric(server.client_url, name) < at_least:
            gevent.sleep(0.02)


def test_a_pusher_is_set_listed_updated_and_deleted(user, gateway):
    bob = user("bob")
    assert listed(bob) == []
    set_pusher(bob, gateway.url, profile_tag="tag", data={"url": gateway.url, "x": 1})
    [pusher] = listed(bob)
    assert pusher == {
        "pushkey": "key-" + bob.user_id,
        "kind": "http",
        "app_id": "org.weir.test",
        "app_display_name": "Weir tests",
        "device_display_name": "A test phone",
        "lang": "en",
        "profile_tag": "tag",
        "data": {"url": gateway.url, "x": 1},
    }
    set_pusher(bob, gateway.url, lang="fr", data={"url": gateway.url, "format": "event_id_only"})
    [pusher] = listed(bob)
    assert pusher["lang"] == "fr" and pusher["data"]["format"] == "event_id_only"
    set_pusher(bob, gateway.url, kind=None)
    assert listed(bob) == []


def test_append_false_takes_the_pushkey_from_other_users(user, gateway):
    bob, carol = user("bob"), user("carol")
    set_pusher(bob, gateway.url, pushkey="shared")
    set_pusher(carol, gateway.url, pushkey="shared", append=True)
    assert len(listed(bob)) == 1 and len(listed(carol)) == 1
    set_pusher(carol, gateway.url, pushkey="shared")  # append false: bob's goes
    assert listed(bob) == [] and len(listed(carol)) == 1


def test_bad_pushers_are_refused(user):
    bob = user("bob")
    good = "https://push.example.org/_matrix/push/v1/notify"

    def refused(errcode: str, **fields) -> None:
        assert set_pusher(bob, good, status=400, **fields)["errcode"] == errcode

    refused("M_INVALID_PARAM", data={"url": "https://push.example.org/notify"})
    refused("M_INVALID_PARAM", data={"url": "ftp://push.example.org/_matrix/push/v1/notify"})
    refused("M_MISSING_PARAM", data={"format": "event_id_only"})
    refused("M_INVALID_PARAM", kind="email", app_id="m.email", pushkey="bob@example.org")
    refused("M_INVALID_PARAM", kind="carrier-pigeon")
    refused("M_INVALID_PARAM", app_id="a" * 65)
    refused("M_INVALID_PARAM", pushkey="k" * 513)
    refused("M_MISSING_PARAM", lang=None)
    r = bob.post(f"{V3}/pushers/set", json={"kind": "http", "app_id": "x"})
    assert r.status_code == 400 and r.json()["errcode"] == "M_MISSING_PARAM", r.text
    assert listed(bob) == []
    assert MatrixClient(bob.base_url).get(f"{V3}/pushers").status_code == 401


def test_a_message_is_pushed_with_its_fields(server, user, gateway):
    alice, bob = user("alice"), user("bob")
    room = room_with(alice, bob, name="Garden", room_alias_name=f"garden{next(_txns)}")
    # Her member event in the room carries the name a notification shows.
    r = alice.put(f"{V3}/profile/{alice.user_id}/displayname", json={"displayname": "Alice A"})
    assert r.status_code == 200, r.text
    set_pusher(bob, gateway.url, data={"url": gateway.url, "custom": "kept"})
    first = message(alice, room, "hello bob")
    notified = gateway.wait_for(lambda n: n["event_id"] == first)
    assert notified["room_id"] == room
    assert notified["type"] == "m.room.message"
    assert notified["sender"] == alice.user_id
    assert notified["sender_display_name"] == "Alice A"
    assert notified["room_name"] == "Garden"
    assert notified["room_alias"].startswith("#garden")
    assert notified["content"] == {"msgtype": "m.text", "body": "hello bob"}
    assert notified["prio"] == "low"
    assert notified["counts"] == {"unread": unread_total(bob), "missed_calls": 0}
    [device] = notified["devices"]
    assert device["app_id"] == "org.weir.test" and device["pushkey"] == "key-" + bob.user_id
    assert device["data"] == {"custom": "kept"}  # the url is ours, never the gateway's
    assert isinstance(device["pushkey_ts"], int) and device["pushkey_ts"] > 1_600_000_000
    assert device["tweaks"] == {"sound": "default"}

    mention = message(alice, room, "look", **{"m.mentions": {"user_ids": [bob.user_id]}})
    notified = gateway.wait_for(lambda n: n["event_id"] == mention)
    assert notified["prio"] == "high"
    assert notified["counts"]["unread"] == unread_total(bob)
    assert notified["devices"][0]["tweaks"] == {"sound": "default", "highlight": True}
    assert gateway.count(first) == 1
    assert len(gateway.arrived) == 2
    # Bob's own message notifies no one of his: alice has no pusher, bob is its sender.
    own = message(bob, room, "from bob")
    message(alice, room, "after bob's")
    assert gateway.wait_until(lambda: len(gateway.notifications) == 3)
    assert own not in [n["event_id"] for n in gateway.arrived]


def test_event_id_only_sends_the_ids_and_counts(user, gateway):
    alice, bob = user("alice"), user("bob")
    room = room_with(alice, bob, name="Secret garden")
    set_pusher(bob, gateway.url, data={"url": gateway.url, "format": "event_id_only"})
    sent = message(alice, room, "nothing of this leaves")
    notified = gateway.wait_for(lambda n: n["event_id"] == sent)
    assert set(notified) == {"event_id", "room_id", "counts", "prio", "devices"}
    assert notified["room_id"] == room and notified["counts"]["unread"] == unread_total(bob)
    assert notified["devices"][0]["data"] == {"format": "event_id_only"}


def test_a_rejected_pushkey_removes_the_pusher(server, user, gateway):
    alice, bob = user("alice"), user("bob")
    room = room_with(alice, bob)
    set_pusher(bob, gateway.url)
    gateway.mode = "rejecting"
    before = metric(server.client_url, "weir_push_notifies_rejected_total")
    sent = message(alice, room, "to a dead app")
    gateway.wait_for(lambda n: n["event_id"] == sent)
    wait_metric(server, "weir_push_notifies_rejected_total", before + 1)  # counted once gone
    assert listed(bob) == []
    gateway.mode = "ok"
    # Later messages go nowhere: the next pusher's notify comes, bob's never.
    carol = user("carol")
    other = room_with(alice, carol)
    set_pusher(carol, gateway.url)
    message(alice, room, "bob has no pusher now")
    after = message(alice, other, "carol does")
    gateway.wait_for(lambda n: n["event_id"] == after)
    assert [n["event_id"] for n in gateway.arrived].count(sent) == 1
    assert len(gateway.arrived) == 2


def test_a_failing_gateway_backs_off_and_catches_up(user, gateway):
    alice, bob = user("alice"), user("bob")
    room = room_with(alice, bob)
    set_pusher(bob, gateway.url)
    gateway.mode = "failing"
    first = message(alice, room, "while it fails 1")
    assert gateway.wait_until(lambda: len(gateway.arrived) >= 2)  # tried, backed off, tried
    second = message(alice, room, "while it fails 2")
    gateway.mode = "ok"
    gateway.wait_for(lambda n: n["event_id"] == second)
    assert [n["event_id"] for n in gateway.notifications] == [first, second]


def test_a_loopback_or_private_gateway_is_never_connected_to_by_default(server, user):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    room = room_with(alice, bob, carol)
    with PushGateway("127.0.0.1") as loopback:
        before = metric(server.client_url, "weir_push_notifies_failure_total")
        set_pusher(bob, loopback.url)
        set_pusher(carol, "http://10.0.0.1:8080/_matrix/push/v1/notify")
        message(alice, room, "to denied gateways")
        wait_metric(server, "weir_push_notifies_failure_total", before + 2)
        server.wait_for_log("push to org.weir.test failed: .*denied address 10.0.0.1")
        server.wait_for_log(r"push to org.weir.test failed: .*denied address 127.0.0.1")
        assert loopback.connections == 0 and loopback.arrived == []
    for client in (bob, carol):
        set_pusher(client, "http://x/_matrix/push/v1/notify", kind=None)


def test_a_tarpit_holds_at_most_max_in_flight_and_delays_no_live_gateway(server, user, gateway):
    alice, bob, carol = user("alice"), user("bob"), user("carol")
    live_room = room_with(alice, bob)
    tarpit_room = room_with(alice, carol)
    set_pusher(bob, gateway.url)
    warm = message(alice, live_room, "bob's gateway answers: it is live")
    gateway.wait_for(lambda n: n["event_id"] == warm)
    with Tarpit(TARPIT_IP) as tarpit:
        url = f"http://{TARPIT_IP}:{tarpit.port}/_matrix/push/v1/notify"
        keys = [f"tarpit-{i}" for i in range(3 * MAX_IN_FLIGHT)]
        for key in keys:
            set_pusher(carol, url, pushkey=key, append=True)
        message(alice, tarpit_room, "to a gateway that never answers")
        # The unproven lane's share: three quarters of the pool.
        assert tarpit.wait_accepted(MAX_IN_FLIGHT - 1, timeout=10)
        live = message(alice, live_room, "bob is not kept waiting")
        gateway.wait_for(lambda n: n["event_id"] == live)
        # Answered while every tarpit connection is still held: nothing waited for them.
        assert tarpit.current == tarpit.accepted == MAX_IN_FLIGHT - 1
        assert tarpit.max_concurrent <= MAX_IN_FLIGHT
        for key in keys:
            set_pusher(carol, url, pushkey=key, kind=None)
    assert listed(carol) == []


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_restart_between_a_message_and_its_push_delivers_it_once(
    request, tmp_path, gateway, engine
):
    settings = push_settings(tmp_path, engine, request)
    weir = WeirProcess(str(tmp_path), settings).start()
    try:
        alice, bob = MatrixClient(weir.client_url), MatrixClient(weir.client_url)
        alice.register("restart_alice")
        bob.register("restart_bob")
        alice.user_id, bob.user_id = whoami(alice), whoami(bob)
        room = room_with(alice, bob)
        set_pusher(bob, gateway.url)
        gateway.mode = "holding"  # the notify arrives, is never answered
        held = message(alice, room, "pushed across a restart")
        assert gateway.wait_until(lambda: any(n["event_id"] == held for n in gateway.arrived))
        weir.stop()
        gateway.mode = "failing"  # down while the server is too
        gateway.release()
        weir.start()
        # Resumed at once from its position: the gateway fails, and the sender backs off.
        assert gateway.wait_until(lambda: len(gateway.arrived) >= 2)
        weir.stop()
        gateway.mode = "ok"
        weir.start()
        for client in (alice, bob):
            client.base_url = weir.client_url
        gateway.wait_for(lambda n: n["event_id"] == held)
        after = message(alice, room, "and the next one")
        gateway.wait_for(lambda n: n["event_id"] == after)
        # The gateway records before the server reads its answer: both positions written.
        wait_metric(weir, "weir_push_notifies_success_total", 2)
        weir.stop()
        weir.start()  # positions kept: nothing is sent again
        alice.base_url = weir.client_url
        last = message(alice, room, "the last one")
        gateway.wait_for(lambda n: n["event_id"] == last)
        assert [n["event_id"] for n in gateway.notifications] == [held, after, last]
    finally:
        weir.stop()


def test_deactivation_removes_the_users_pushers(server, user, gateway):
    bob = user("bob")
    before = metric(server.client_url, "weir_pushers")
    set_pusher(bob, gateway.url)
    set_pusher(bob, gateway.url, pushkey="second")
    assert metric(server.client_url, "weir_pushers") == before + 2
    assert stored_pushkeys(server, bob.user_id) == ["key-" + bob.user_id, "second"]
    auth = {"type": "m.login.password", "user": bob.user_id, "password": "correct horse battery"}
    r = bob.post(f"{V3}/account/deactivate", json={"auth": auth})
    assert r.status_code == 200, r.text
    assert metric(server.client_url, "weir_pushers") == before
    assert stored_pushkeys(server, bob.user_id) == []
    assert bob.get(f"{V3}/pushers").status_code == 401
