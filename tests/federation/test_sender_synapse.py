"""The sender with a real Synapse 1.163, TLS both ways: messages our user sends while Synapse
is stopped reach it, in order, once it is back, with no new message to prompt them; and the
same across a `kill -9` of Weir between the sends and the restart.

This module runs a Synapse of its own (it stops and restarts it), on a neighbour of
WEIR_TEST_SYNAPSE_IP so that it never collides with the session's shared one."""

import os
import signal
import socket
import time
from urllib.parse import quote

import gevent
import pytest

from tests.peers.honest import HonestPeer
from tests.peers.origins import KEYS_PATH, FakeOrigin, send_transaction
from tests.peers.receiver import TransactionSink
from tests.peers.tarpit import Tarpit
from tests.rooms.test_concurrent_joins import assert_every_member_and_resolved
from tests.rooms.test_membership_synapse import SynapseUser, synapse_sync
from tests.support.federation import tls_weir
from tests.support.metrics import metric
from tests.support.probe import LatencyProbe
from tests.support.remote_room import RemoteRoom
from tests.support.server import MatrixClient
from tests.support.synapse import SynapseServer, synapse_available

pytestmark = pytest.mark.synapse

V3 = "/_matrix/client/v3"
_BASE = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1").rsplit(".", 1)[0]
SYNAPSE_IP = f"{_BASE}.3"
WEIR_IP = f"{_BASE}.4"
WEIR_NAME = f"{WEIR_IP}:8448"
# The dead members' servers: IP literals, so that Synapse (which has no test DNS) reaches them.
# A hundred: more than max_in_flight (64), so that the cap is what holds them.
DEAD_IPS = [f"{_BASE}.{n}" for n in range(10, 110)]


@pytest.fixture(scope="module")
def synapse(test_ca, tmp_path_factory):
    if not synapse_available():
        pytest.skip("Synapse venv missing: run `make synapse`")
    server = SynapseServer(str(tmp_path_factory.mktemp("synapse-sender")), test_ca, ip=SYNAPSE_IP)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-sender"))
    # A hundred dead members join from one address: their keys are fetched at once.
    keys_rate = {"key_resolution_per_ip_rate": {"max_requests": 1000, "per_seconds": 60}}
    # A dead server's first transaction takes a slot for the whole remote_timeout: 10 s
    # keeps a round over a hundred of them short.
    proc = tls_weir(
        test_ca,
        directory,
        WEIR_IP,
        WEIR_NAME,
        security={"federation": keys_rate},
        federation={"remote_timeout": 10},
    ).start()
    proc.database_url = f"sqlite:///{directory}/data/homeserver.db"
    yield proc
    proc.stop()


def bodies_seen(user: SynapseUser, room_id: str, limit: int = 50) -> list[str]:
    """The room's messages as Synapse has them (its /messages: the last `limit` events),
    oldest first."""
    r = user.call(
        "GET", f"/rooms/{quote(room_id, safe='')}/messages", params={"dir": "b", "limit": limit}
    )
    assert r.status_code == 200, r.text
    chunk = r.json()["chunk"]
    return [e["content"].get("body") for e in reversed(chunk) if e["type"] == "m.room.message"]


def wait_for_bodies(
    user: SynapseUser, room_id: str, want: list[str], within: float, limit: int = 50
) -> list[str]:
    """Waits until Synapse has `want` in the room, in that order; a long-polled /sync is the
    wake-up, /messages (its last `limit` events) the record."""
    deadline = time.monotonic() + within
    sync = synapse_sync(user)
    since = sync(None, 0)["next_batch"]
    while True:
        seen = bodies_seen(user, room_id, limit)
        if [b for b in seen if b in want] == want:
            return seen
        left = deadline - time.monotonic()
        assert left > 0, f"Synapse has {seen}, wanted {want}"
        since = sync(since, int(min(left, 10) * 1000))["next_batch"]


def shared_room(weir, synapse, name: str):
    alice = MatrixClient(weir.client_url)
    alice.register(f"alice-{name}")
    r = alice.post(f"{V3}/createRoom", json={"preset": "public_chat", "room_version": "10"})
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    bob = SynapseUser(synapse, f"bob-{name}")
    r = bob.call("POST", f"/join/{quote(room_id, safe='')}", params={"server_name": WEIR_NAME})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    return alice, bob, room_id


def say(alice, room_id: str, texts: list[str]) -> None:
    for text in texts:
        r = alice.put(
            f"{V3}/rooms/{quote(room_id, safe='')}/send/m.room.message/{text}",
            json={"msgtype": "m.text", "body": text},
        )
        assert r.status_code == 200, r.text


# Synapse takes a while to start, and the sender's backoff (10 s, 20 s, 40 s) runs meanwhile.
@pytest.mark.timeout(360)
@pytest.mark.parametrize("weir_stop", [None, "kill -9"])
def test_messages_sent_while_synapse_is_down_arrive_in_order(weir, synapse, weir_stop):
    tag = "k" if weir_stop else "r"
    alice, bob, room_id = shared_room(weir, synapse, tag)
    say(alice, room_id, [f"{tag}-warm"])
    wait_for_bodies(bob, room_id, [f"{tag}-warm"], within=10)
    want = [f"{tag}-1", f"{tag}-2", f"{tag}-3"]
    synapse.stop()
    say(alice, room_id, want)
    if weir_stop:
        weir.proc.send_signal(signal.SIGKILL)
        weir.proc.wait(10)
        weir._stderr.close()
    synapse.start()
    if weir_stop:
        weir.start()  # resumes the outbox at once
    # Nothing new is sent: the sender's retry (after its backoff) or its restart delivers.
    seen = wait_for_bodies(bob, room_id, want, within=150)
    assert seen == [f"{tag}-warm", *want]


def wait_in_sync(user: SynapseUser, room_id: str, since: str, body: str, within: float) -> str:
    """Long-polls Synapse's /sync from `since` until `body` shows in the room's timeline;
    returns the next token. (Not /messages: Synapse would backfill from the dead servers.)"""
    deadline = time.monotonic() + within
    sync = synapse_sync(user)
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"{body!r} did not reach Synapse within {within} s"
        data = sync(since, int(left * 1000))
        since = data["next_batch"]
        timeline = data.get("rooms", {}).get("join", {}).get(room_id, {}).get("timeline", {})
        if any(e["content"].get("body") == body for e in timeline.get("events", [])):
            return since


def members_join(weir, synapse, test_ca, room, origins, tag: str) -> SynapseUser:
    """`@m` of each origin joins, 4 at a time, each in a transaction of its own: the 4 fork
    from the same tips, and the next 4 merge them, as servers do that see each other's
    joins a moment late. Then `bob-<tag>` of Synapse. Returns bob."""
    auth = room.auth_ids(
        ("m.room.create", ""), ("m.room.power_levels", ""), ("m.room.join_rules", "")
    )

    def join(i: int, origin, tips: list[str]) -> str:
        user = origin.user("m")
        join_id, pdu = room.pdu(
            origin,
            user,
            "m.room.member",
            {"membership": "join"},
            state_key=user,
            prev_events=tips,
            auth_events=auth,
        )
        room.members[user] = join_id
        r = send_transaction(weir.federation_url, origin, WEIR_NAME, f"{tag}{i}", [pdu], test_ca)
        assert r.json() == {"pdus": {join_id: {}}}, r.text
        return join_id

    tips = [room.latest_event_id()]
    for at in range(0, len(origins), 4):
        batch = origins[at : at + 4]
        jobs = [gevent.spawn(join, at + n, origin, tips) for n, origin in enumerate(batch)]
        tips = [job.get(timeout=60) for job in jobs]
    bob = SynapseUser(synapse, f"bob-{tag}")
    r = bob.call("POST", f"/join/{quote(room.room_id, safe='')}", params={"server_name": WEIR_NAME})
    assert r.status_code == 200, (r.text, synapse.log_tail())
    return bob


class DeadServersKeys(HonestPeer):
    """The dead members' servers while they were up: one TLS listener on every address that
    serves each one's key document (by Host header), then goes away for good."""

    def __init__(self, ca, port: int = 0):
        super().__init__("dead", ca, host="0.0.0.0", port=port, cert_names=tuple(DEAD_IPS))
        self.origins: dict[str, FakeOrigin] = {}
        self.route("GET", KEYS_PATH, self._key_document)

    def add(self, ip: str) -> FakeOrigin:
        origin = FakeOrigin(f"{ip}:{self.port}")
        self.origins[origin.name] = origin
        return origin

    def _key_document(self, req):
        origin = self.origins.get(req.host)
        if origin is None:
            return 404, {"errcode": "M_NOT_FOUND", "error": req.host}
        return 200, origin.key_document()


@pytest.mark.timeout(400)
def test_a_hundred_dead_members_do_not_delay_synapse(weir, synapse, test_ca):
    """A room's members are on Synapse and on 100 servers that turn into TLS tarpits. A
    message of ours reaches Synapse within 2 s while the tarpits hold the sender's
    connections, and they never hold more than max_in_flight (64) at once."""
    alice = MatrixClient(weir.client_url)
    alice.register("alice-dead")
    room = RemoteRoom.create(alice, room_version="10")
    with DeadServersKeys(test_ca) as keys:
        dead = [keys.add(ip) for ip in DEAD_IPS]
        # Synapse verifies the dead members' joins in the send_join answer: keys while up.
        bob = members_join(weir, synapse, test_ca, room, dead, "dead")
        port = keys.port
    since = synapse_sync(bob)(None, 0)["next_batch"]
    say(alice, room.room_id, ["dead-warm"])
    since = wait_in_sync(bob, room.room_id, since, "dead-warm", within=30)

    with Tarpit(DEAD_IPS[0], port) as tarpit:
        for ip in DEAD_IPS[1:]:
            tarpit.listen(ip, port)
        say(alice, room.room_id, ["prime"])  # the dead servers are retried: held now
        assert tarpit.wait_accepted(10, timeout=60)
        since = synapse_sync(bob)(since, 0)["next_batch"]
        started = time.monotonic()
        say(alice, room.room_id, ["while held"])
        wait_in_sync(bob, room.room_id, since, "while held", within=2)
        took = time.monotonic() - started
        assert tarpit.current > 0, tarpit.counters()
        assert tarpit.max_concurrent <= 64, tarpit.counters()
    print(f"reached Synapse in {took * 1000:.0f} ms; tarpits: {tarpit.counters()}")


class AnsweringServers(DeadServersKeys):
    """Servers that answer: their keys, and every transaction we send them (recorded, with
    our signature checked), by Host header. On 0.0.0.0, or on one address of its own."""

    def __init__(self, ca, port: int = 0, host: str = "0.0.0.0"):
        super().__init__(ca, port=port)
        self.host = host
        self.sink = TransactionSink(self)


@pytest.mark.timeout(400)
def test_servers_that_die_after_answering_delay_nobody_and_come_back_at_once(
    weir, synapse, test_ca
):
    """100 members' servers answer our transactions, then all turn into TLS tarpits. From
    the moment they die, while they are still live (their last transaction succeeded),
    every message reaches Synapse within 2 s: their late transactions give their slots up.
    The tarpits never hold more than max_in_flight connections, and /versions stays fast.
    Then 20 of them come back and each sends us a transaction: each has our latest
    message within 15 s of it (homeserver/federation/sender.py, lanes)."""
    alice = MatrixClient(weir.client_url)
    alice.register("alice-died")
    room = RemoteRoom.create(alice, room_version="10")
    servers = AnsweringServers(test_ca).start()
    port = servers.port
    try:
        servers.sink.trust(WEIR_NAME, weir.federation_url, test_ca)
        dead = [servers.add(ip) for ip in DEAD_IPS]
        bob = members_join(weir, synapse, test_ca, room, dead, "died")
        members = room.client.get(
            f"/_matrix/client/v3/rooms/{quote(room.room_id, safe='')}/members",
            params={"membership": "join"},
        )
        assert len(members.json()["chunk"]) == len(dead) + 2, members.text[:300]
        assert_every_member_and_resolved(weir, room, [o.user("m") for o in dead])
        since = synapse_sync(bob)(None, 0)["next_batch"]
        say(alice, room.room_id, ["died-warm"])  # every one of them answers it: live
        since = wait_in_sync(bob, room.room_id, since, "died-warm", within=30)
        assert servers.sink.wait_until(
            lambda: all(servers.sink.pdus(o.name) for o in dead), timeout=120
        )
    finally:
        servers.stop()

    # Synapse sends to the dead servers too (presence, receipts): count only our side.
    ours = ConnectionsSampled(weir.proc.pid, port)
    with Tarpit(DEAD_IPS[0], port) as tarpit:
        for ip in DEAD_IPS[1:]:
            tarpit.listen(ip, port)
        # Dead now, and live still: the first message goes to each of them with the whole
        # remote_timeout. Synapse must not wait for them: their late transactions yield.
        took = []
        with LatencyProbe(weir.client_url, "/_matrix/client/versions") as probe:
            for n in range(10):
                started = time.monotonic()
                say(alice, room.room_id, [f"died-{n}"])
                since = wait_in_sync(bob, room.room_id, since, f"died-{n}", within=2)
                took.append(time.monotonic() - started)
                gevent.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        print("reached Synapse in (ms):", [round(t * 1000) for t in took])
        ours.stop()
        assert 0 < ours.most <= 64, ours.peak_report()
    preempted = metric(weir.client_url, "weir_federation_sender_preempted_total")
    print(f"/versions: {len(probe.samples)} samples, p99 {probe.p99():.1f} ms")
    print(f"our connections to the tarpits: at most {ours.most}; preempted: {preempted}")
    assert probe.p99() <= 50, sorted(probe.samples)[-10:]

    # Twenty of them come back; the others stay dead.
    back = dead[:20]
    revived = [AnsweringServers(test_ca, port=port, host=ip).start() for ip in DEAD_IPS[:20]]
    try:
        with Tarpit(DEAD_IPS[20], port) as still_dead:
            for ip in DEAD_IPS[21:]:
                still_dead.listen(ip, port)
            for server, origin in zip(revived, back):
                server.origins[origin.name] = origin
                server.sink.trust(WEIR_NAME, weir.federation_url, test_ca)
            for i, (server, origin) in enumerate(zip(revived, back)):
                r = send_transaction(
                    weir.federation_url, origin, WEIR_NAME, f"back-{i}", [], test_ca, edus=[]
                )
                assert r.status_code == 200, r.text
                asked = time.monotonic()
                assert server.sink.wait_until(
                    lambda s=server, o=origin: "died-9" in bodies_of(s.sink.pdus(o.name)),
                    timeout=15,
                ), (i, bodies_of(server.sink.pdus(origin.name)))
                print(f"{origin.name} caught up in {time.monotonic() - asked:.1f} s")
    finally:
        for server in revived:
            server.stop()


class ConnectionsSampled:
    """The most TCP connections a process had open to one port, sampled from /proc every
    tenth of a second: what the tarpits held of ours, whoever else they held. The remote
    addresses at that peak are kept (`peak`), to tell whose they were.

    Sockets are counted by inode, once each: /proc/net/tcp is read a page at a time, and
    a socket can show twice in one read while others come and go (a 65 seen with 64
    sockets open: one connection listed twice)."""

    def __init__(self, pid: int, port: int):
        self.pid, self.port, self.most = pid, port, 0
        self.peak: list[str] = []
        self._sampler = gevent.spawn(self._sample)

    def now(self) -> list[str]:
        """The remote addresses of the process's established connections to the port."""
        inodes = set()
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        remotes = {}
        with open(f"/proc/{self.pid}/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                remote_ip, remote_port = fields[2].split(":")
                established = fields[3] == "01"  # not a pooled one the old server closed
                if int(remote_port, 16) == self.port and established and fields[9] in inodes:
                    ip = socket.inet_ntoa(bytes.fromhex(remote_ip)[::-1])  # little-endian
                    local_port = int(fields[1].split(":")[1], 16)
                    remotes[fields[9]] = f"{ip}:{self.port} from :{local_port}"
        return list(remotes.values())

    def _sample(self) -> None:
        while True:
            remotes = self.now()
            if len(remotes) > self.most:
                self.most, self.peak = len(remotes), sorted(remotes)
            gevent.sleep(0.1)

    def peak_report(self) -> str:
        others = [r for r in self.peak if r.split(":")[0] not in DEAD_IPS]
        return f"{self.most} at the peak, not the tarpits' {others}; all: {self.peak}"

    def stop(self) -> None:
        self._sampler.kill()


def bodies_of(pdus: list[dict]) -> list:
    return [p.get("content", {}).get("body") for p in pdus]
