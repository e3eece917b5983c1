"""Waiting syncs and the connection under them: keep-alive, hang-ups, shutdown, restarts."""

import signal
import socket
import time
from urllib.parse import quote

import gevent
import pytest
import requests

from tests.rooms.conftest import V3, create_room, send
from tests.support.server import MatrixClient
from tests.sync.conftest import event_ids, metric, sync, timeline

KEEPALIVE = 0.5  # seconds: far shorter than the syncs below wait


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        gevent.sleep(0.02)


def main_pool_greenlets(weir) -> float:
    text = requests.get(weir.url("/metrics"), timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith('weir_pool_greenlets{pool="main"}'))
    return float(line.split()[1])


@pytest.fixture(scope="module")
def weir(tmp_path_factory):
    from tests.support.server import WeirProcess, base_settings, merge

    directory = tmp_path_factory.mktemp("waiting")
    settings = merge(
        base_settings(str(directory / "data")),
        {"server": {"http": {"keepalive_timeout": KEEPALIVE}}},
    )
    proc = WeirProcess(str(directory), settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def test_a_sync_outlives_the_keepalive_timeout_and_times_out_with_the_same_token(weir, alice):
    since = sync(alice)["next_batch"]
    session = MatrixClient(weir.client_url, alice.token)
    r = session.get(f"{V3}/sync", params={"since": since, "timeout": 1500})
    assert r.status_code == 200
    body = r.json()
    assert body["next_batch"] == since
    assert body["rooms"] == {"join": {}, "invite": {}, "knock": {}, "leave": {}}
    assert body["account_data"] == {"events": []}
    # The connection is still good for the next request.
    assert session.get(f"{V3}/account/whoami").status_code == 200


def test_a_client_that_hangs_up_frees_its_registration_and_greenlet(weir, alice):
    since = sync(alice)["next_batch"]
    assert metric(weir, "weir_sync_waiters") == 0
    host, port = weir.client_url.rsplit("/", 1)[1].rsplit(":", 1)
    conn = socket.create_connection((host, int(port)))
    conn.sendall(
        f"GET {V3}/sync?since={quote(since)}&timeout=120000 HTTP/1.1\r\n"
        f"Host: {host}\r\nAuthorization: Bearer {alice.token}\r\n\r\n".encode()
    )
    wait_until(lambda: metric(weir, "weir_sync_waiters") == 1)
    conn.close()
    wait_until(lambda: metric(weir, "weir_sync_waiters") == 0)
    # Its connection's greenlet is gone too: idle keep-alive connections close after
    # KEEPALIVE, and then only the scrape itself is left in the pool.
    wait_until(lambda: main_pool_greenlets(weir) == 1)


def test_every_waiting_sync_is_woken_for_its_own_user_only(weir, alice):
    bob = MatrixClient(weir.client_url)
    bob.register("bob")
    room_id = create_room(alice)
    bob_room = create_room(bob)
    since = sync(alice)["next_batch"]
    bob_since = sync(bob)["next_batch"]
    alice_wait = gevent.spawn(sync, alice, since, timeout=60_000)
    bob_wait = gevent.spawn(sync, bob, bob_since, timeout=60_000)
    wait_until(lambda: metric(weir, "weir_sync_waiters") == 2)
    sent = send(alice, room_id, "only alice's")
    assert event_ids(timeline(alice_wait.get(timeout=30), room_id)) == [sent]
    assert metric(weir, "weir_sync_waiters") == 1  # bob's sync still waits
    send(bob, bob_room, "now bob's")
    assert bob_room in bob_wait.get(timeout=30)["rooms"]["join"]


def test_shutdown_answers_waiting_syncs_at_once(start_weir):
    weir = start_weir()
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    since = sync(alice)["next_batch"]
    waiting = gevent.spawn(alice.get, f"{V3}/sync", params={"since": since, "timeout": 120_000})
    wait_until(lambda: metric(weir, "weir_sync_waiters") == 1)
    weir.proc.send_signal(signal.SIGTERM)
    r = waiting.get(timeout=30)
    assert r.status_code == 200 and r.json()["next_batch"] == since
    assert weir.proc.wait(timeout=30) == 0


def test_tokens_stay_valid_across_a_restart(start_weir):
    first = start_weir(name="restart")
    alice = MatrixClient(first.client_url)
    alice.register("alice")
    room_id = create_room(alice)
    before = sync(alice)["next_batch"]
    sent_before = send(alice, room_id, "before the restart")
    first.stop()

    second = start_weir(name="restart")
    alice.base_url = second.client_url
    body = sync(alice, before)  # a token from the old process, typing epoch and all
    assert event_ids(timeline(body, room_id)) == [sent_before]
    sent_after = send(alice, room_id, "after the restart")
    assert event_ids(timeline(sync(alice, body["next_batch"]), room_id)) == [sent_after]
    history = alice.get(
        f"{V3}/rooms/{room_id}/messages", params={"dir": "b", "from": before, "limit": 1}
    ).json()
    assert history["chunk"][0]["type"] != "m.room.message"  # from before the first message
