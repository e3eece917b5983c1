"""An appservice's and a pusher's queue have one sending instance at a time, as real
processes on the suite's PostgreSQL (homeserver/storage/leases.py): two instances store
messages at once and each reaches the fake appservice in one transaction, and the push
gateway once; receipts through either reach the appservice; then the holder is killed
(-9) in the middle of a call, and the other instance takes the queue over once the lease
lapses, resending the unanswered transaction under its txnId (the notification of the
same event), and losing nothing.

The calls' deadline is 2 s and `cluster.queue_lease` 1 s, so a lease lasts 4 s."""

import signal
from urllib.parse import quote

import gevent
import psycopg
import pytest

from tests.appservice.conftest import V3, create_room, registration_yaml, send, user
from tests.appservice.test_faults import bodies
from tests.peers.appservice import FakeAppservice
from tests.peers.push_gateway import PushGateway
from tests.support.server import WeirProcess, merge
from tests.sync.test_pushers import set_pusher

AS_IP, GATEWAY_IP = "127.73.0.1", "127.73.0.2"
DEADLINE = 2.0  # appservice.deadline and push.deadline; a lease lasts this + 2 s
MESSAGES = 5  # through each instance at once


@pytest.fixture
def start_pair(pg_cluster, start_weir, tmp_path):
    """start(settings) -> (a, b, database url): two instances of one server."""

    def start(settings: dict) -> tuple[WeirProcess, WeirProcess, str]:
        url = pg_cluster.new_database()
        shared = merge(
            {
                "database": {"url": url},
                "data_dir": str(tmp_path / "shared-data"),
                "cluster": {"instances": 2, "queue_lease": 1},
            },
            settings,
        )
        a = start_weir(merge(shared, {"instance_name": "a"}), name="a")
        b = start_weir(merge(shared, {"instance_name": "b"}), name="b")
        return a, b, url

    return start


def lease_owner(url: str, table: str, column: str, value: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            f"SELECT lease_owner FROM {table} WHERE {column} = %s", (value,)
        ).fetchone()
    return row[0]


def kill(proc: WeirProcess) -> None:
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait()


def at_once(*writes) -> None:
    """Runs each (client, room, texts) writer in a greenlet of its own, all at once."""
    writers = [
        gevent.spawn(lambda c=c, r=r, ts=ts: [send(c, r, t) for t in ts]) for c, r, ts in writes
    ]
    gevent.joinall(writers, raise_error=True)


def joined(room: str, *clients) -> None:
    for client in clients:
        r = client.post(f"{V3}/join/{quote(room)}", json={})
        assert r.status_code == 200, r.text


# --- appservices ---------------------------------------------------------------------------


def txn_id(request) -> str:
    return request.path.partition("?")[0].rsplit("/", 1)[1]


def receipt_users(bridge: FakeAppservice) -> set[str]:
    return {
        user_id
        for t in bridge.transactions()
        for edu in t.body.get("ephemeral", [])
        if edu["type"] == "m.receipt"
        for receipt in edu["content"].values()
        for user_id in receipt.get("m.read", {})
    }


def assert_each_in_one_transaction(bridge: FakeAppservice, expected: set[str]) -> None:
    """Every message in one transaction ID, answered once; an ID sent again (a retry)
    carried the same events."""
    events_of: dict[str, list] = {}
    ids_of: dict[str, set[str]] = {}
    for t in bridge.transactions(answered=False):
        events = t.body["events"]
        assert events_of.setdefault(txn_id(t), events) == events, "one txnId, other content"
        for body in bodies([t]):
            ids_of.setdefault(body, set()).add(txn_id(t))
    assert expected <= set(ids_of)
    assert all(len(ids_of[body]) == 1 for body in expected), ids_of
    answered = [txn_id(t) for t in bridge.transactions()]
    assert len(answered) == len(set(answered)), answered
    assert bridge.max_in_flight == 1


def test_one_instance_sends_to_an_appservice_and_another_takes_it_over(start_pair, tmp_path):
    with FakeAppservice(AS_IP) as bridge:
        registration = tmp_path / "bridge.yaml"
        # Every room is the appservice's: every message goes to it.
        registration.write_text(registration_yaml("bridge", bridge.url, rooms=".*"))
        a, b, url = start_pair(
            {"app_service_config_files": [str(registration)], "appservice": {"deadline": DEADLINE}}
        )
        alice, carol = user(a, "alice"), user(b, "carol")
        room = create_room(alice, preset="public_chat")
        joined(room, carol)
        expected = {f"{who}-{i}" for who in ("alice", "carol") for i in range(MESSAGES)}
        at_once(
            (alice, room, [f"alice-{i}" for i in range(MESSAGES)]),
            (carol, room, [f"carol-{i}" for i in range(MESSAGES)]),
        )
        assert bridge.wait_for(lambda: expected <= set(bodies(bridge.transactions())), 60)
        assert_each_in_one_transaction(bridge, expected)
        # Receipts through either instance reach it from the holder: the other hands its
        # receipt over through the database, rather than waiting to hold the appservice.
        read = send(alice, room, "read-me")
        assert bridge.wait_for(lambda: "read-me" in bodies(bridge.transactions()))
        holder = lease_owner(url, "appservice_state", "appservice_id", "bridge")
        for client in (alice, carol):
            r = client.post(f"{V3}/rooms/{quote(room)}/receipt/m.read/{quote(read)}", json={})
            assert r.status_code == 200, r.text
        users = {alice.user_id, carol.user_id}
        assert bridge.wait_for(lambda: users <= receipt_users(bridge), 30)
        assert lease_owner(url, "appservice_state", "appservice_id", "bridge") == holder

        # The holder's call hangs; it dies with the transaction unanswered.
        bridge.hanging = True
        send(alice, room, "held")
        assert bridge.wait_for(lambda: "held" in bodies(bridge.transactions(answered=False)))
        held_id = next(txn_id(t) for t in bridge.received if "held" in bodies([t]))
        holder = lease_owner(url, "appservice_state", "appservice_id", "bridge")
        dead, survivor, through = (a, "b", carol) if holder == "a" else (b, "a", alice)
        kill(dead)
        bridge.hanging = False
        send(through, room, "after")
        # The lease lapses 4 s after the holder's last claim; the rest is a loaded machine.
        assert bridge.wait_for(lambda: "after" in bodies(bridge.transactions()), 30)
        resent = [txn_id(t) for t in bridge.transactions() if "held" in bodies([t])]
        assert resent == [held_id]  # the same transaction, answered once
        assert_each_in_one_transaction(bridge, expected | {"held", "after"})
        assert lease_owner(url, "appservice_state", "appservice_id", "bridge") == survivor


# --- pushers -------------------------------------------------------------------------------


def test_one_instance_notifies_for_a_pusher_and_another_takes_it_over(start_pair):
    with PushGateway(GATEWAY_IP) as gateway:
        a, b, url = start_pair(
            {"push": {"deadline": DEADLINE, "ip_range_allowlist": ["127.73.0.0/24"]}}
        )
        alice, carol, bob = user(a, "alice"), user(b, "carol"), user(b, "bob")
        set_pusher(bob, gateway.url)  # through b: a learns of it from the database
        room = create_room(alice, preset="public_chat")
        joined(room, carol, bob)
        at_once(
            (alice, room, [f"alice-{i}" for i in range(MESSAGES)]),
            (carol, room, [f"carol-{i}" for i in range(MESSAGES)]),
        )

        def notified() -> set[str]:
            return {n["event_id"] for n in gateway.notifications}

        assert gateway.wait_until(lambda: len(notified()) == 2 * MESSAGES, 60)
        firsts = notified()
        assert len(gateway.notifications) == len(gateway.arrived) == 2 * MESSAGES

        # The holder's notify is held; it dies before the gateway answers.
        gateway.mode = "holding"
        held = send(alice, room, "held")
        assert gateway.wait_until(lambda: any(n["event_id"] == held for n in gateway.arrived))
        holder = lease_owner(url, "pushers", "user_id", bob.user_id)
        dead, survivor, through = (a, "b", carol) if holder == "a" else (b, "a", alice)
        kill(dead)
        gateway.mode = "ok"
        gateway.release()  # the held notify is answered 503, to nobody
        after = send(through, room, "after")
        assert gateway.wait_until(lambda: {held, after} <= notified(), 30)
        # Sent again by the survivor, answered once; nothing else twice.
        assert sorted(n["event_id"] for n in gateway.notifications) == sorted(
            firsts | {held, after}
        )
        assert lease_owner(url, "pushers", "user_id", bob.user_id) == survivor
