"""What two Weir instances on one PostgreSQL keep in memory, kept true across them, as real
processes: typing through one reaches a sync on the other and goes to another server once,
from the destination's lease holder; a logout through one refuses the token on the other
as soon as the other has heard of it (its NOTIFY), not after the cache's 30 s; and each
instance runs with its share of the key and event-resolution budgets."""

import json
import os

import gevent
import pytest

from tests.peers.origins import OriginKeyServer
from tests.peers.receiver import TransactionSink
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

SYNC = "/_matrix/client/v3/sync"
WEIR_IP, PEER_IP = "127.72.0.1", "127.72.0.2"
FILTER = json.dumps({"room": {"timeline": {"limit": 100}}})
# The destination's lease outlives every wait below (remote_timeout + 10 s): an EDU queued
# by the instance that does not hold it would not go out within them.
REMOTE_TIMEOUT = 30


@pytest.fixture(scope="module")
def peer_keys(test_ca, dns):
    with OriginKeyServer("memory.test", test_ca, dns, host=PEER_IP) as server:
        yield server


@pytest.fixture(scope="module")
def pair(pg_cluster, test_ca, dns, peer_keys, tmp_path_factory):
    """Instances "a" and "b" of one server, with federation listeners, each with its share
    of key_resolution_max_in_flight = 5 and event_resolution_max_in_flight = 7."""
    url = pg_cluster.new_database()
    root = tmp_path_factory.mktemp("memory")
    fed = federation_settings(test_ca, dns, remote_timeout=REMOTE_TIMEOUT)
    fed.update(tls_listener_settings(test_ca, "weir.test", WEIR_IP, port=0))
    shared = {
        "database": {"url": url},
        "cluster": {"instances": 2},
        "federation": fed,
        "security": {
            "federation": {"key_resolution_max_in_flight": 5, "event_resolution_max_in_flight": 7}
        },
    }
    procs = []
    try:
        for name in ("a", "b"):
            directory = os.path.join(str(root), name)
            os.makedirs(directory)
            # One data_dir: the signing key is the server's, not an instance's.
            settings = merge(base_settings(os.path.join(str(root), "shared-data"), url), shared)
            procs.append(WeirProcess(directory, merge(settings, {"instance_name": name})).start())
        yield procs[0], procs[1], url
    finally:
        for proc in procs:
            proc.stop()


def sync(proc: WeirProcess, token: str, since: str | None = None, timeout_ms: int = 0) -> dict:
    params = {"timeout": timeout_ms, "filter": FILTER}
    if since:
        params["since"] = since
    r = MatrixClient(proc.client_url, token).get(SYNC, params=params, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def typing_in(answer: dict, room_id: str) -> list[list[str]]:
    room = answer.get("rooms", {}).get("join", {}).get(room_id, {})
    events = room.get("ephemeral", {}).get("events", [])
    return [e["content"]["user_ids"] for e in events if e["type"] == "m.typing"]


def set_typing(c: MatrixClient, room_id: str, typing: bool) -> None:
    user_id = c.get("/_matrix/client/v3/account/whoami").json()["user_id"]
    r = c.put(
        f"/_matrix/client/v3/rooms/{room_id}/typing/{user_id}",
        json={"typing": typing, "timeout": 30_000} if typing else {"typing": False},
    )
    assert r.status_code == 200, r.text


def registered(proc: WeirProcess, name: str) -> MatrixClient:
    c = MatrixClient(proc.client_url)
    c.register(name)
    return c


def stream_position(url: str, stream: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT position FROM stream_positions WHERE stream_name = %s", (stream,)
        ).fetchone()
    return row[0]


def test_each_instance_runs_with_its_share_of_the_resolution_budgets(pair):
    a, b, _ = pair
    for proc in (a, b):  # 5 // 2 and 7 // 2
        assert metric(proc.client_url, "weir_budget_capacity", budget="key_resolution") == 2
        assert metric(proc.client_url, "weir_budget_capacity", budget="event_resolution") == 3


def test_typing_through_one_instance_reaches_a_sync_parked_on_the_other(pair):
    a, b, _ = pair
    alice, bob = registered(a, "typist"), registered(b, "watcher")
    r = alice.post("/_matrix/client/v3/createRoom", json={"invite": ["@watcher:weir.test"]})
    room_id = r.json()["room_id"]
    assert bob.post(f"/_matrix/client/v3/rooms/{room_id}/join", json={}).status_code == 200
    since = sync(b, bob.token)["next_batch"]
    parked = gevent.spawn(sync, b, bob.token, since, 30_000)
    wait_for_metric(b.client_url, "weir_sync_waiters", 1, timeout=15)
    set_typing(alice, room_id, True)
    answer = parked.get(timeout=30)
    assert typing_in(answer, room_id) == [["@typist:weir.test"]]
    # Typing positions are the cluster's: b's token on a shows nothing new, and a stop
    # through a reaches the sync that continues from it there.
    from_b = answer["next_batch"]
    assert typing_in(sync(a, bob.token, from_b), room_id) == []
    parked = gevent.spawn(sync, a, bob.token, from_b, 30_000)
    wait_for_metric(a.client_url, "weir_sync_waiters", 1, timeout=15)
    set_typing(alice, room_id, False)
    assert typing_in(parked.get(timeout=30), room_id) == [[]]


def test_typing_goes_to_another_server_once_from_the_lease_holder(pair, test_ca, peer_keys):
    """One instance holds the remote server's lease; bob types through the other, which
    must not queue the EDU (the lease stays held while its holder sends), so the holder,
    which hears of it, sends it."""
    a, b, url = pair
    sink = TransactionSink(peer_keys)
    sink.trust("weir.test", a.federation_url, test_ca)
    origin = peer_keys.add_origin("remote")
    alice = registered(a, "holder")
    room, _ = room_joined_by(a, test_ca, alice, origin)
    # alice's message makes one instance the destination's lease holder: whichever claims
    # it first (the other's events wake both, runtime/queues.py).
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/send/m.room.message/lease",
        json={"msgtype": "m.text", "body": "lease"},
    )
    assert r.status_code == 200, r.text
    bodies = lambda: [p["content"].get("body") for p in sink.pdus(origin.name)]  # noqa: E731
    assert sink.wait_until(lambda: "lease" in bodies() and holder(url, origin.name) is not None)
    holding = holder(url, origin.name)
    elsewhere = b if holding == "a" else a
    bob = registered(elsewhere, "elsewhere")
    assert bob.post(f"/_matrix/client/v3/rooms/{room.room_id}/join", json={}).status_code == 200

    def typing_edus() -> list[bool]:
        return [
            e["content"]["typing"]
            for e in sink.edus(origin.name)
            if e["edu_type"] == "m.typing" and e["content"]["user_id"] == "@elsewhere:weir.test"
        ]

    set_typing(bob, room.room_id, True)
    assert sink.wait_until(lambda: typing_edus() == [True], timeout=15), typing_edus()
    set_typing(bob, room.room_id, False)
    assert sink.wait_until(lambda: typing_edus() == [True, False], timeout=15), typing_edus()
    assert holder(url, origin.name) == holding
    assert sink.max_in_flight[origin.name] == 1
    # The other queued nothing it would send once the lease lapsed: no second copy, ever.
    assert metric(elsewhere.client_url, "weir_federation_sender_ephemeral_queue") == 0


def holder(url: str, destination: str) -> str | None:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT lease_owner FROM federation_destinations WHERE destination = %s",
            (destination,),
        ).fetchone()
    return row[0] if row else None


def test_a_logout_through_one_instance_refuses_the_token_on_the_other(pair):
    a, b, url = pair
    registered(a, "leaver")
    phone, laptop, desk = (MatrixClient(b.client_url) for _ in range(3))
    for c in (phone, laptop, desk):
        c.login("leaver")
        assert c.get("/_matrix/client/v3/account/whoami").status_code == 200  # cached on b

    def refused_on_b(c: MatrixClient) -> bool:
        r = c.get("/_matrix/client/v3/account/whoami")
        return r.status_code == 401 and r.json()["errcode"] == "M_UNKNOWN_TOKEN"

    def logged_out_through_a(path: str, c: MatrixClient) -> None:
        r = MatrixClient(a.client_url, c.token).post(path, json={})
        assert r.status_code == 200, r.text
        # b has applied the revocation once its position reaches the one just written:
        # the event to wait on, well inside the cache's 30 s.
        position = stream_position(url, "token_revocations")
        wait_for_metric(
            b.client_url, "weir_cluster_position", position, timeout=10, stream="token_revocations"
        )

    logged_out_through_a("/_matrix/client/v3/logout", phone)
    assert refused_on_b(phone)
    assert not refused_on_b(laptop)
    logged_out_through_a("/_matrix/client/v3/logout/all", laptop)
    assert refused_on_b(laptop) and refused_on_b(desk)
    # A deactivation through a: every token of the user, the devices' removal after it.
    desk.login("leaver")
    assert not refused_on_b(desk)
    auth = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": "leaver"},
        "password": "correct horse battery",
    }
    r = MatrixClient(a.client_url, desk.token).post(
        "/_matrix/client/v3/account/deactivate", json={"auth": auth}
    )
    assert r.status_code == 200, r.text
    applied_on_b(b, stream_position(url, "token_revocations"))
    assert refused_on_b(desk)


def applied_on_b(b: WeirProcess, position: int) -> None:
    """Waits until b has applied the token revocations up to `position` (more may follow)."""
    name, labels = "weir_cluster_position", {"stream": "token_revocations"}
    with gevent.Timeout(10, AssertionError(f"b never applied position {position}")):
        while metric(b.client_url, name, **labels) < position:
            gevent.sleep(0.02)
