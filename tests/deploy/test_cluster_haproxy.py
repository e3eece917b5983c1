"""Three Weir instances of one server on one PostgreSQL, behind the real HAProxy with
deploy/haproxy.cfg, as deploy/docker-compose.yml runs them (tests/support/cluster.py): one
stack for the module.

- Clients: each device's token hashes to one instance, so three devices spread over the
  three; a message sent through one wakes a sync parked on another within a second.
- E2EE with matrix-js-sdk, its three devices on three instances, decrypting both ways.
- Federation with the suite's Synapse through the balancer's federation frontend (Weir's
  server name is that frontend's address): joins and messages both ways.
- kill -9 of one instance under load (last: it leaves the stack one short).
"""

import json
import os
import signal
import time
from urllib.parse import quote

import gevent
import psycopg
import pytest
import requests

from tests.e2ee.test_js_sdk import node, run_node  # noqa: F401 - the node fixture
from tests.federation.test_sender_synapse import wait_for_bodies
from tests.processes.test_instances import send, timeline
from tests.rooms.test_membership_synapse import SynapseUser, wait_for_message
from tests.support.cluster import PASSWORD, Cluster, wait_until
from tests.support.federation import federation_settings
from tests.support.metrics import metric
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

V3 = "/_matrix/client/v3"
# The balancer's address: Weir's server name is its federation frontend's, so that Synapse
# reaches the instances through it, never directly.
LB_IP = "127.70.0.1"
WEIR_NAME = f"{LB_IP}:8448"
# A destination's lease lasts cluster.queue_lease, or remote_timeout + 2 s if longer
# (storage/leases.py): small here, so that a takeover is quick.
REMOTE_TIMEOUT = 2
LEASE_SECONDS = 5
# No timeline gaps: every event a sync answers is in its timeline.
FILTER = json.dumps({"room": {"timeline": {"limit": 1000}}})


@pytest.fixture(scope="module")
def cluster(haproxy_bin, test_ca, pg_cluster, synapse, tmp_path_factory):
    settings = {
        "server_name": WEIR_NAME,
        "federation": federation_settings(test_ca, remote_timeout=REMOTE_TIMEOUT),
        "cluster": {"queue_lease": LEASE_SECONDS},
    }
    stack = Cluster(
        str(tmp_path_factory.mktemp("cluster")),
        test_ca,
        pg_cluster.new_database(),
        settings=settings,
        host=LB_IP,
        federation_port=8448,
        binary=haproxy_bin,
    ).start()
    yield stack
    stack.stop()


def sync(client, since: str | None = None, timeout_ms: int = 0) -> dict:
    params = {"timeout": timeout_ms, "filter": FILTER, **({"since": since} if since else {})}
    r = client.get(f"{V3}/sync", params=params, timeout=90)
    assert r.status_code == 200, r.text
    return r.json()


def timeline_ids(answer: dict, room_id: str) -> list[str]:
    return [e["event_id"] for e in timeline(answer, room_id)]


def waiters(cluster: Cluster, name: str) -> float:
    return metric(cluster.instance(name).client_url, "weir_sync_waiters")


def client_requests(cluster: Cluster) -> dict[str, int]:
    """Client requests each instance was sent, long-polls (the `sync` backend) included."""
    served = [cluster.lb.requests_served(backend) for backend in ("client", "sync")]
    return {name: sum(counts[name] for counts in served) for name in cluster.names}


def create_room(client, **body) -> str:
    r = client.post(f"{V3}/createRoom", json={"preset": "public_chat", **body})
    assert r.status_code == 200, r.text
    return r.json()["room_id"]


def join(client, room_id: str) -> None:
    r = client.post(f"{V3}/join/{quote(room_id, safe='')}", json={})
    assert r.status_code == 200, r.text


# -- clients -------------------------------------------------------------------------------


def test_a_message_through_one_instance_wakes_a_sync_parked_on_another_within_a_second(cluster):
    for user in ("wake-alice", "wake-bob"):
        cluster.register(user)
    alice = cluster.login_on("wake-alice", "weir-1")
    bob = cluster.login_on("wake-bob", "weir-2")
    room_id = create_room(alice)
    join(bob, room_id)
    since = sync(bob)["next_batch"]
    parked = gevent.spawn(sync, bob, since, 30_000)
    wait_until(lambda: waiters(cluster, "weir-2") == 1, 15, "bob's sync parked on weir-2")
    assert waiters(cluster, "weir-1") == 0
    started = time.monotonic()
    event_id = send(alice, room_id, "wake-up")
    answer = parked.get(timeout=30)
    woken_after = time.monotonic() - started
    assert timeline_ids(answer, room_id) == [event_id]
    print(f"\nsent through weir-1, woke bob's sync on weir-2 {woken_after * 1000:.0f} ms later")
    assert woken_after < 1.0


def test_e2ee_through_matrix_js_sdk_with_each_device_on_its_own_instance(
    cluster,
    test_ca,
    node,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    """instances.mjs behind the balancer: alice's device on weir-1, bob's on weir-2, bob's
    later device on weir-3. The invite, the joins, the room keys (to-device) and the device
    list changes each cross instances, and every message is decrypted on the other side."""
    for user in ("js-alice", "js-bob"):
        cluster.register(user)
    placed = {
        "alice": cluster.login_on("js-alice", "weir-1"),
        "bob": cluster.login_on("js-bob", "weir-2"),
        "bob2": cluster.login_on("js-bob", "weir-3"),
    }
    sessions = {}
    for who, client in placed.items():
        me = client.get(f"{V3}/account/whoami").json()
        sessions[who] = {**me, "access_token": client.token}
    messages = {"from_alice": "hello from 1", "from_bob": "hello from 2", "later": "to 3"}
    scenario = {
        "alice": {"user": "js-alice", "password": PASSWORD},
        "bob": {"user": "js-bob", "password": PASSWORD},
        "other_url": cluster.lb.client_url,
        "messages": messages,
        "sessions": sessions,
    }
    before = client_requests(cluster)
    result = run_node(
        node,
        "instances.mjs",
        cluster.lb.client_url,
        json.dumps(scenario),
        tmp_path=tmp_path,
        env={"NODE_EXTRA_CA_CERTS": test_ca.ca_path},
    )
    devices, sent, received = result["devices"], result["sent"], result["received"]
    assert devices == {who: sessions[who]["device_id"] for who in placed}
    assert received[devices["bob"]][sent["fromAlice"]] == messages["from_alice"]
    assert received[devices["alice"]][sent["fromBob"]] == messages["from_bob"]
    assert received[devices["bob2"]][sent["later"]] == messages["later"]
    assert received[devices["bob"]][sent["later"]] == messages["later"]
    # The SDK's requests went to all three, and each instance woke syncs for the others'.
    after = client_requests(cluster)
    spread = {name: after[name] - before[name] for name in after}
    print(f"\nmatrix-js-sdk requests per instance: {spread}")
    assert all(count > 0 for count in spread.values()), spread
    for proc in cluster.instances:
        assert metric(proc.client_url, "weir_cluster_wakes_total") > 0
    # The SDK's last syncs are still parked (HAProxy holds a request whose client went away
    # until Weir answers it): account data answers them, rather than their 30 s timeout.
    for who in ("alice", "bob"):
        me = sessions[who]["user_id"]
        r = placed[who].put(f"{V3}/user/{quote(me)}/account_data/org.weir.done", json={})
        assert r.status_code == 200, r.text
    wait_until(lambda: not any(waiters(cluster, n) for n in cluster.names), 10, "syncs parked")


# -- federation with Synapse, through the balancer ------------------------------------------


def wait_for_synapse(user: SynapseUser, room_id: str, want: list[str], within: float) -> list:
    """Waits until Synapse's /messages has every body of `want`, in that order."""
    return wait_for_bodies(user, room_id, want, within, limit=1000)


@pytest.fixture(scope="module")
def federated_room(cluster, synapse):
    """A room of ours that a Synapse user joined through the balancer (make_join and
    send_join reach whichever instance HAProxy picks)."""
    cluster.register("fed-alice")
    alice = cluster.login_on("fed-alice", "weir-1")
    room_id = create_room(alice, room_version="10", name="Across the balancer")
    bob = SynapseUser(synapse, "cluster_fed_bob")
    before = sum(cluster.lb.requests_served("federation").values())
    r = bob.call(
        "POST", f"/join/{quote(room_id, safe='')}", params={"server_name": WEIR_NAME}, json={}
    )
    assert r.status_code == 200, (r.text, synapse.log_tail())
    # Synapse came through the federation frontend (keys, make_join, send_join).
    assert sum(cluster.lb.requests_served("federation").values()) - before >= 3
    return alice, bob, room_id


def test_a_synapse_user_joins_through_the_balancer_and_messages_flow_both_ways(
    cluster, federated_room
):
    alice, bob, room_id = federated_room
    r = bob.call("GET", f"/rooms/{quote(room_id, safe='')}/state/m.room.name/")
    assert r.json() == {"name": "Across the balancer"}
    # Synapse -> the balancer -> an instance; seen by a sync through another instance.
    carol_on_3 = "fed-carol"
    cluster.register(carol_on_3)
    carol = cluster.login_on(carol_on_3, "weir-3")
    join(carol, room_id)
    r = bob.call(
        "PUT",
        f"/rooms/{quote(room_id, safe='')}/send/m.room.message/s1",
        json={"msgtype": "m.text", "body": "from synapse"},
    )
    assert r.status_code == 200, r.text
    for client in (alice, carol):
        wait_for_message(
            lambda since, ms, c=client: sync(c, since, ms), room_id, "from synapse", within=20
        )
    # Each instance's user -> Synapse, whichever instance holds the destination's lease.
    send(alice, room_id, "from weir-1")
    send(carol, room_id, "from weir-3")
    wait_for_synapse(bob, room_id, ["from weir-1", "from weir-3"], within=LEASE_SECONDS + 20)


def test_our_user_joins_a_synapse_room_and_messages_flow_both_ways(cluster, synapse):
    cluster.register("fed-erin")
    erin = cluster.login_on("fed-erin", "weir-2")
    erin_id = erin.get(f"{V3}/account/whoami").json()["user_id"]
    frank = SynapseUser(synapse, "cluster_fed_frank")
    r = frank.call("POST", "/createRoom", json={"room_version": "10", "invite": [erin_id]})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    room_id = r.json()["room_id"]
    # The invite reached an instance through the balancer; erin's sync shows it.
    deadline = time.monotonic() + 20
    since = None
    while room_id not in (answer := sync(erin, since, 5_000))["rooms"]["invite"]:
        assert time.monotonic() < deadline, "the invite never showed in /sync"
        since = answer["next_batch"]
    r = erin.post(f"{V3}/join/{quote(room_id, safe='')}", json={})  # the invite's server
    assert r.status_code == 200, r.text
    r = frank.call(
        "PUT",
        f"/rooms/{quote(room_id, safe='')}/send/m.room.message/t1",
        json={"msgtype": "m.text", "body": "hello erin"},
    )
    assert r.status_code == 200, r.text
    wait_for_message(lambda s, ms: sync(erin, s, ms), room_id, "hello erin", within=20)
    send(erin, room_id, "hello frank")
    wait_for_synapse(frank, room_id, ["hello frank"], within=LEASE_SECONDS + 20)


# -- kill -9 under load ----------------------------------------------------------------------

LOAD_BEFORE = 5  # messages each sender has had acknowledged when the instance is killed
LOAD_AFTER = 5  # and after it


class Sender:
    """Numbered messages through the balancer, one at a time. A failed request is sent
    again with the same transaction ID, as a client does, until it is answered 200: only
    then is the message acknowledged."""

    def __init__(self, client, room_id: str, prefix: str):
        self.client, self.room_id, self.prefix = client, room_id, prefix
        self.acked: list[tuple[str, str, float]] = []  # (body, event ID, when)
        self.failures: list[str] = []
        self.start = ""  # a sync token from before the load
        self.acked_last = ""  # the event ID of the last message acknowledged

    def run(self, enough) -> None:
        while not enough(self):
            body = f"{self.prefix}-{len(self.acked)}"
            self.acked.append((body, self.send(self.room_id, body), time.monotonic()))

    def send(self, room_id: str, body: str) -> str:
        self.acked_last = self._send(room_id, body)
        return self.acked_last

    def _send(self, room_id: str, body: str) -> str:
        path = f"{V3}/rooms/{quote(room_id, safe='')}/send/m.room.message/{body}"
        for _ in range(20):
            try:
                r = self.client.put(path, json={"msgtype": "m.text", "body": body}, timeout=30)
            except requests.RequestException as e:
                self.failures.append(type(e).__name__)
                continue
            if r.status_code == 200:
                return r.json()["event_id"]
            self.failures.append(str(r.status_code))  # HAProxy's 502: the instance died
        raise AssertionError(f"{body} never acknowledged: {self.failures}")


class Watcher:
    """A client's sync loop through the balancer: a failed request is made again from the
    same token, as a client does."""

    def __init__(self, client, room_id: str, timeout_ms: int):
        self.client, self.room_id, self.timeout_ms = client, room_id, timeout_ms
        self.since = sync(client)["next_batch"]
        self.seen: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        params = {"timeout": self.timeout_ms, "filter": FILTER}
        while True:
            try:
                r = self.client.get(f"{V3}/sync", params={**params, "since": self.since})
            except requests.RequestException as e:
                self.errors.append(type(e).__name__)
                continue
            if r.status_code != 200:
                self.errors.append(str(r.status_code))
                continue
            answer = r.json()
            self.seen += timeline_ids(answer, self.room_id)
            self.since = answer["next_batch"]


def lease(url: str, destination: str) -> tuple[str, int]:
    """(owner, until, in ms) of `destination`'s lease."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT lease_owner, lease_until_ms FROM federation_destinations"
            " WHERE destination = %s",
            (destination,),
        ).fetchone()
    assert row is not None, destination
    return row[0], row[1]


def load_and_watchers(cluster: Cluster, room_id: str):
    """A sender on each instance; on each, a client syncing in the busy room and one in a
    quiet room (its own device each), where one message comes only after the kill, sent
    by `talker`. The watchers' syncs are parked once this returns."""
    # Nothing else parked: the counts below are these watchers'. (A sync whose client went
    # away stays parked until its timeout: HAProxy waits for Weir's answer.)
    wait_until(lambda: not any(waiters(cluster, n) for n in cluster.names), 35, "syncs parked")
    for user in ("kill-busy", "kill-quiet", "kill-talker"):
        cluster.register(user)
    talker = Sender(cluster.client(), "", "talker")
    talker.client.login("kill-talker", PASSWORD)
    quiet_room = create_room(talker.client)
    senders, busy, quiet = [], [], []
    for name in cluster.names:
        user = f"kill-load-{name}"
        cluster.register(user)
        senders.append(Sender(cluster.login_on(user, name), room_id, user))
        join(senders[-1].client, room_id)
        busy.append(cluster.login_on("kill-busy", name))
        quiet.append(cluster.login_on("kill-quiet", name))
    join(busy[0], room_id)
    join(quiet[0], quiet_room)
    for sender in senders:
        sender.start = sync(sender.client)["next_batch"]
    watchers = {
        "busy": [Watcher(client, room_id, 30_000) for client in busy],
        "quiet": [Watcher(client, quiet_room, 60_000) for client in quiet],
    }
    running = [gevent.spawn(w.run) for group in watchers.values() for w in group]
    for name in cluster.names:
        wait_until(lambda n=name: waiters(cluster, n) == 2, 15, f"two syncs parked on {name}")
    return senders, watchers, running, (talker, quiet_room)


def test_kill_9_of_an_instance_under_load_loses_nothing(cluster, federated_room, synapse):
    """The instance holding Synapse's lease is killed while a sender on each instance sends
    into a room Synapse is in. Every acknowledged message is in the room once, in the
    order each sender had it acknowledged, on the survivors and on Synapse; a survivor
    takes the destination over within the lease; the syncs parked on the dead instance go
    on through another and miss nothing."""
    _, bob, room_id = federated_room
    senders, watchers, running, (talker, quiet_room) = load_and_watchers(cluster, room_id)
    killed: list[float] = []  # when, on the wall clock (ms): the lease is kept on it

    def enough(sender: Sender) -> bool:
        return bool(killed) and sum(t > killed[0] for *_, t in sender.acked) >= LOAD_AFTER

    load = [gevent.spawn(sender.run, enough) for sender in senders]
    try:
        wait_until(
            lambda: all(len(s.acked) >= LOAD_BEFORE for s in senders), 60, "the load got going"
        )
        victim, _ = lease(cluster.database_url, synapse.server_name)
        sent_before = transactions_sent(cluster)
        os.kill(cluster.instance(victim).proc.pid, signal.SIGKILL)
        killed += [time.monotonic(), time.time() * 1000]
        takeover = gevent.spawn(taken_over, cluster.database_url, synapse.server_name, victim)
        cluster.instance(victim).proc.wait(10)
        # As the dead instance left it (it may have renewed it since the read above).
        holder, held_until = lease(cluster.database_url, synapse.server_name)
        assert holder == victim
        talker.send(quiet_room, "after-the-kill")
        gevent.joinall(load, timeout=120, raise_error=True)
        acked = {body: event_id for s in senders for body, event_id, _ in s.acked}
        order = history(cluster, senders, acked)
        for group, want in (("busy", set(order)), ("quiet", {talker.acked_last})):
            wait_until(
                lambda g=group, w=want: all(w <= set(x.seen) for x in watchers[g]),
                30,
                f"a {group} watcher missed a message",
            )
        owner, owned_until = takeover.get(timeout=LEASE_SECONDS + 15)
    finally:
        gevent.killall([*running, *load])
    # Every watcher got each message once, in order: the dead instance's too.
    for watcher in watchers["busy"]:
        assert [e for e in watcher.seen if e in set(order)] == order
    cut = watchers["quiet"][cluster.names.index(victim)].errors
    assert cut, "the sync parked on the dead instance was not cut by the kill"
    # Synapse has every message, once each, in the room's order, sent by the new owner.
    by_id = {event_id: body for body, event_id in acked.items()}
    want = [by_id[event_id] for event_id in order]
    seen = wait_for_synapse(bob, room_id, want, within=LEASE_SECONDS + 30)
    assert [b for b in seen if b in acked] == want
    assert transactions_sent(cluster)[owner] > sent_before[owner]
    # Its first transaction began then (the lease runs from it): within the dead one's lease.
    took_over = (owned_until - LEASE_SECONDS * 1000 - killed[1]) / 1000
    print(
        f"\nkilled {victim}, its lease ending {(held_until - killed[1]) / 1000:.1f} s later;"
        f" {len(acked)} acknowledged, failed tries {[s.failures for s in senders]};"
        f" {owner} took the destination over {took_over:.1f} s after the kill"
        f" (lease {LEASE_SECONDS} s); the sync parked on {victim}: {cut}"
    )
    assert held_until > killed[1]  # the dead instance held it at its death
    assert took_over <= (held_until - killed[1]) / 1000 + 1.0


def taken_over(url: str, destination: str, victim: str) -> tuple[str, int]:
    """The lease of `destination` as first seen held by another than `victim`."""
    while (held := lease(url, destination))[0] == victim:
        gevent.sleep(0.02)  # a database row: nothing to wait on but reading it again
    return held


def transactions_sent(cluster: Cluster) -> dict[str, float]:
    """Transactions each live instance had answered 200 by other servers."""
    return {
        name: metric(proc.client_url, "weir_federation_transactions_total", outcome="success")
        for name, proc in zip(cluster.names, cluster.instances)
        if proc.proc.poll() is None
    }


def history(cluster: Cluster, senders: list[Sender], acked: dict[str, str]) -> list[str]:
    """The acknowledged messages' event IDs in the room's order, as /messages and a sync on
    a survivor give them, checked: each once, each sender's in the order acknowledged."""
    survivor = next(p for p in cluster.instances if p.proc.poll() is None)
    reader = senders[cluster.instances.index(survivor)].client
    r = reader.get(
        f"{V3}/rooms/{quote(senders[0].room_id, safe='')}/messages",
        params={"dir": "b", "limit": 1000},
    )
    assert r.status_code == 200, r.text
    chunk = list(reversed(r.json()["chunk"]))
    bodies = [e["content"].get("body") for e in chunk if e["content"].get("body") in acked]
    assert sorted(bodies) == sorted(acked)  # none lost, none twice
    order = [acked[body] for body in bodies]  # the event IDs the senders were given
    for sender in senders:
        mine = [body for body, _, _ in sender.acked]
        assert [b for b in bodies if b in mine] == mine
    # A sync from before the load, on a survivor itself (not through the balancer).
    direct = MatrixClient(survivor.client_url, reader.token)
    synced = timeline_ids(sync(direct, sender_of(senders, reader).start), senders[0].room_id)
    assert [e for e in synced if e in set(order)] == order
    return order


def sender_of(senders: list[Sender], client) -> Sender:
    return next(s for s in senders if s.client is client)
