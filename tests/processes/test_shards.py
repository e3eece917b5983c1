"""Federation worker shards as real processes: one listener, key budgets split across
shards and measured at the peers, supervision (kill -9, SIGTERM, main's death) and bad IPC
frames."""

import os
import signal
import socket
from collections import Counter

import gevent
import psutil
import pytest
import requests

from homeserver.processes.ipc import HEADER, FrameConnection, FrameType, IpcError
from tests.peers.origins import FakeOrigin, OriginKeyServer, send_transaction
from tests.peers.tarpit import Tarpit
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient
from tests.support.shards import (
    access_lines,
    shard_holding_connection,
    shard_processes,
    sharded_settings,
    start_sharded,
)

WEIR_IP = "127.61.0.1"
KEYS_IP = "127.61.0.2"
TARPIT_IP = "127.61.0.3"
SLOW_KEYS_IP = "127.61.0.4"
KEYS = "/_matrix/key/v2/server"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("origins.test", test_ca, dns, host=KEYS_IP) as server:
        yield server


@pytest.fixture(scope="module")
def slow_keys(test_ca, dns):
    with OriginKeyServer("slow.test", test_ca, dns, host=SLOW_KEYS_IP) as server:
        yield server


@pytest.fixture(scope="module")
def tarpit():
    with Tarpit(TARPIT_IP, 0) as pit:
        yield pit


def tarpit_origins(dns, tarpit, prefix, n):
    """``n`` origins whose key server is the tarpit: their keys never arrive."""
    origins = []
    for i in range(n):
        dns.add_a(f"{prefix}{i}.tarpit.test", TARPIT_IP)
        origins.append(FakeOrigin(f"{prefix}{i}.tarpit.test:{tarpit.port}"))
    return origins


def registered(weir, name):
    client = MatrixClient(weir.client_url)
    client.register(name)
    return client


def send(weir, test_ca, origin, txn_id, pdus=(), **kw):
    return send_transaction(
        weir.federation_url, origin, "weir.test", txn_id, list(pdus), test_ca, **kw
    )


def send_all(weir, test_ca, origins, txn_id="t"):
    """Every origin sends one transaction at once, each on its own connection."""
    jobs = [gevent.spawn(send, weir, test_ca, origin, txn_id) for origin in origins]
    gevent.joinall(jobs, raise_error=True)
    return [job.value for job in jobs]


@pytest.fixture(scope="module")
def sharded(test_ca, dns, tmp_path_factory):
    """Two shards; four key fetches in flight in all (two per shard, four for main). A
    fetch at the tarpit gives up after remote_timeout, 2 s: the staged checks wait out two
    rounds of them."""
    directory = str(tmp_path_factory.mktemp("sharded"))
    weir = start_sharded(
        directory,
        sharded_settings(
            test_ca,
            dns,
            directory,
            WEIR_IP,
            shards=2,
            remote_timeout=2,
            key_resolution_max_in_flight=4,
        ),
    )
    yield weir
    weir.stop()


# -- serving -----------------------------------------------------------------------------------


def test_shards_serve_federation_and_main_serves_clients(sharded, test_ca, keys):
    assert sorted(shard_processes(sharded)) == [1, 2]
    r = requests.get(sharded.fed_url("/_matrix/federation/v1/version"), verify=test_ca.ca_path)
    assert r.status_code == 200 and r.json()["server"]["name"] == "Weir"
    origin = keys.add_origin("serving")
    assert send(sharded, test_ca, origin, "t-empty").json() == {"pdus": {}}
    # Served by a shard (its log lines say which); the client API by main.
    assert access_lines(sharded, "/send/t-empty")[0][0] in ("shard 1", "shard 2")
    registered(sharded, "alice")
    assert access_lines(sharded, "/register")[-1][0] == "main"
    # Main does not serve federation on the client listener.
    r = requests.get(sharded.url("/_matrix/federation/v1/version"))
    assert (r.status_code, r.json()["errcode"]) == (404, "M_UNRECOGNIZED")
    assert metric(sharded.client_url, "weir_federation_shards_alive") == 2


# -- budgets -----------------------------------------------------------------------------------


def test_key_fetches_at_a_tarpit_stay_within_the_budget(test_ca, dns, tarpit, tmp_path):
    """64 origins whose keys sit on a tarpit send at once. Two shards together never have
    more than key_resolution_max_in_flight (16) fetches open at the tarpit; every request
    beyond them gets 429 at once, and the admitted ones time out (401). (Other numbers of
    shards and their shares: test_shard_budget.py.)"""
    shards = 2
    directory = str(tmp_path / "w")
    weir = start_sharded(
        directory,
        sharded_settings(
            test_ca,
            dns,
            directory,
            WEIR_IP,
            shards=shards,
            key_resolution_max_in_flight=16,
            key_resolution_per_ip_rate={"max_requests": 10000, "per_seconds": 60},
        ),
    )
    try:
        accepted_before = tarpit.accepted
        tarpit.max_concurrent = tarpit.current
        responses = send_all(weir, test_ca, tarpit_origins(dns, tarpit, f"s{shards}-", 64))
        statuses = Counter(r.status_code for r in responses)
        fetches = tarpit.accepted - accepted_before
        print(
            f"{shards} shard(s): {dict(statuses)}, {fetches} fetches, "
            f"at most {tarpit.max_concurrent} at once at the tarpit"
        )
        assert tarpit.max_concurrent <= 16
        assert set(statuses) == {429, 401}
        assert statuses[429] >= 64 - 16 and statuses[401] == fetches
        refused = [r for r in responses if r.status_code == 429]
        assert all(
            r.json()["errcode"] == "M_LIMIT_EXCEEDED" and int(r.headers["Retry-After"]) >= 1
            for r in refused
        )
        assert fetches > 8  # more than one shard's share: both shards were fetching
        assert tarpit.wait_current(0, timeout=10)
    finally:
        weir.stop()


def test_the_per_ip_rate_is_split_across_shards(test_ca, dns, keys, tmp_path):
    """Two shards and 30 fetches a minute per source IP: 60 new origins from one address
    get at most 30 key fetches at the key server (15 per shard), the rest 429. (Each of
    more shards gets its share rounded down: test_shard_budget.py.)"""
    directory = str(tmp_path / "w")
    weir = start_sharded(
        directory,
        sharded_settings(
            test_ca, dns, directory, WEIR_IP, shards=2, key_resolution_max_in_flight=64
        ),
    )
    try:
        origins = [keys.add_origin(f"rate{i}") for i in range(60)]
        before = keys.fetches()
        responses = send_all(weir, test_ca, origins)
        fetches = keys.fetches() - before
        statuses = Counter(r.status_code for r in responses)
        by_shard = Counter(
            shard
            for shard, status in access_lines(weir, "/send/t", at_least=len(responses))
            if status == "200"
        )
        print(f"{fetches} fetches for 60 origins; {dict(statuses)}; served by {dict(by_shard)}")
        assert fetches <= 30
        assert statuses[200] == fetches and statuses[429] == 60 - fetches
        assert all(n <= 15 for n in by_shard.values())  # each shard's share of 30
        assert fetches > 15  # both shards fetched: the split was exercised
    finally:
        weir.stop()


# -- main's own budget, and bad frames on its socket -------------------------------------------


def ipc_path(weir):
    return os.path.join(weir.directory, "data", "ipc", "shards.sock")


def rogue_shard(weir) -> FrameConnection:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(ipc_path(weir))
    return FrameConnection(sock, {}, "main").start()


def test_main_checks_relayed_pdus_under_its_own_budget(sharded, test_ca, dns, tarpit, keys):
    """A relay whose PDUs name six servers with unfetched keys: main fetches at most its
    own four at once (at the tarpit), stages the transaction for the rest and answers at
    once (rooms/staging.py); its worker tries again, never past the four, and the PDUs,
    whose keys never come, are not applied."""
    origin = keys.add_origin("relayer")
    room, join_id = room_joined_by(sharded, test_ca, registered(sharded, "relay-alice"), origin)
    pdus = [
        room.join_pdu(server, "eve", prev=join_id)[1]
        for server in tarpit_origins(dns, tarpit, "main-", 6)
    ]
    accepted_before = tarpit.accepted
    tarpit.max_concurrent = tarpit.current
    shard = rogue_shard(sharded)
    try:
        reply = shard.request(
            FrameType.RELAY,
            {
                "origin": origin.name,
                "txn_id": "t-rogue",
                "pdus": pdus,
                "results": {},
                "source_ip": "203.0.113.7",
            },
            30,
        )
    finally:
        shard.close()
    assert reply == {"answer": {"pdus": {}}}
    assert tarpit.wait_accepted(accepted_before + 4, timeout=10)
    wait_for_metric(sharded.client_url, "weir_inbound_staged", 0, timeout=60)
    assert tarpit.max_concurrent <= 4
    assert tarpit.wait_current(0, timeout=10)
    # Nothing was applied.
    assert join_id == room.timeline()[-1]["event_id"]


def test_a_shard_whose_share_refuses_a_check_relays_and_the_sender_gets_200(
    sharded, test_ca, dns, tarpit, keys
):
    """A transaction whose PDUs name six servers with unfetched keys, more than the shard's
    share of the key budget (two): the shard relays them unchecked, main stages them, and
    the sender is answered 200 at once, not 429 (Synapse would stop sending for minutes)."""
    origin = keys.add_origin("overshare")
    room, join_id = room_joined_by(sharded, test_ca, registered(sharded, "share-alice"), origin)
    pdus = [
        room.join_pdu(server, "eve", prev=join_id)[1]
        for server in tarpit_origins(dns, tarpit, "share-", 6)
    ]
    r = send(sharded, test_ca, origin, "t-overshare", pdus, timeout=30)
    assert (r.status_code, r.json()) == (200, {"pdus": {}}), r.text
    wait_for_metric(sharded.client_url, "weir_inbound_staged", 0, timeout=60)
    assert tarpit.wait_current(0, timeout=10)
    assert join_id == room.timeline()[-1]["event_id"]  # keys never came: nothing applied


def test_bad_frames_to_main_are_refused_and_main_carries_on(sharded, test_ca, keys):
    shard = rogue_shard(sharded)
    try:
        shard.send_raw(HEADER.pack(2**31, FrameType.RELAY, 1) + b"x" * 1024)  # over the cap
        shard.close()  # ...and gone mid-frame
        shard = rogue_shard(sharded)
        shard.send_raw(HEADER.pack(5, FrameType.RELAY, 2) + b"nope!")
        with pytest.raises(IpcError, match="malformed relay"):
            shard.request(FrameType.RELAY, {"origin": 5}, 10)
        with pytest.raises(IpcError, match="unknown frame type"):
            shard.request(0x42, {}, 10)
        with pytest.raises(IpcError, match="no shard"):
            shard.request(FrameType.HELLO, {"shard": 7, "pid": 1}, 10)  # not a shard of ours
    finally:
        shard.close()
    sharded.wait_for_log("dropping a frame of 2147483648 bytes")
    sharded.wait_for_log("dropping a frame whose body is not a JSON object")
    # The real shards still relay to main.
    room_joined_by(
        sharded, test_ca, registered(sharded, "frames-alice"), keys.add_origin("after-bad-frames")
    )
    assert metric(sharded.client_url, "weir_federation_shards_alive") == 2


# -- supervision -------------------------------------------------------------------------------


def test_kill_9_of_a_shard_mid_transaction(test_ca, dns, keys, slow_keys, tmp_path):
    """Four senders keep sending transactions (retrying each until it is answered) while
    a shard is killed with one of them in flight, held at a key server. The shard is
    restarted, every retry succeeds, and every PDU is stored exactly once."""
    directory = str(tmp_path / "w")
    weir = start_sharded(
        directory, sharded_settings(test_ca, dns, directory, WEIR_IP, shards=2, remote_timeout=10)
    )
    try:
        origin = keys.add_origin("kill9")
        room, join_id = room_joined_by(weir, test_ca, registered(weir, "alice"), origin)

        sent: list[str] = []
        answered = Counter()
        failures = Counter()

        def deliver(txn_id, pdus):
            for _ in range(200):
                try:
                    r = send(weir, test_ca, origin, txn_id, pdus, timeout=30)
                except requests.ConnectionError:
                    failures[txn_id] += 1
                    gevent.sleep(0.05)  # the sender's backoff
                    continue
                if r.status_code == 200:
                    answered[txn_id] += 1
                    return r.json()
                failures[txn_id] += 1
                gevent.sleep(0.05)
            raise AssertionError(f"{txn_id} never answered")

        def lane(n):
            prev = join_id
            for i in range(8):
                ids, pdus = room.messages(
                    origin, "bob", [f"lane {n} msg {i}a", f"lane {n} msg {i}b"], prev=prev
                )
                sent.extend(ids)
                assert deliver(f"t-lane{n}-{i}", pdus) == {"pdus": {i: {} for i in ids}}
                prev = ids[-1]

        # The held transaction: dan of slow.test joins; his keys are held at the key server.
        dan_server = slow_keys.add_origin("dan")
        held_id, held = room.join_pdu(dan_server, "dan", prev=join_id)
        slow_keys.hold()
        hits = slow_keys.hits(KEYS)
        held_job = gevent.spawn(deliver, "t-held", [held])
        assert slow_keys.wait_hits(KEYS, hits + 1)
        victim = shard_holding_connection(weir, slow_keys.requests[-1].client[1])
        assert victim in (1, 2)
        lanes = [gevent.spawn(lane, n) for n in range(4)]
        while sum(answered.values()) < 6:  # the lanes are under way
            gevent.sleep(0.05)
        pid = shard_processes(weir)[victim].pid
        os.kill(pid, signal.SIGKILL)
        weir.wait_for_log(rf"federation shard {victim} \(pid {pid}\) exited with signal 9")
        slow_keys.release()

        assert held_job.get(timeout=60) == {"pdus": {held_id: {}}}
        gevent.joinall(lanes, raise_error=True, timeout=120)
        assert failures["t-held"] >= 1  # it was in flight when the shard died
        wait_for_metric(weir.client_url, "weir_federation_shards_alive", 2, timeout=30)
        assert metric(weir.client_url, "weir_federation_shard_restarts_total") == 1
        assert shard_processes(weir)[victim].pid != pid

        stored = Counter(e["event_id"] for e in room.timeline())
        assert len(sent) == 4 * 8 * 2
        assert all(stored[event_id] == 1 for event_id in [*sent, held_id])
        # Transactions sent after the restart are served too, by both shards in time.
        for i in range(6):
            ids, pdus = room.messages(origin, "bob", [f"after {i}"], prev=sent[-1])
            assert deliver(f"t-after-{i}", pdus) == {"pdus": {ids[0]: {}}}
    finally:
        slow_keys.release()
        weir.stop()


def test_shards_exit_when_main_dies_and_sigterm_to_main_stops_every_shard(test_ca, dns, tmp_path):
    """Main killed (-9): its shards exit on their own. A new main on the same data_dir
    (the stale IPC socket is replaced) starts its shards, and SIGTERM to it stops them
    all, drained, before main. One process tree serves both: each start costs seconds."""
    directory = str(tmp_path / "w")
    weir = start_sharded(directory, sharded_settings(test_ca, dns, directory, WEIR_IP, shards=2))
    shards = list(shard_processes(weir).values())
    weir.proc.kill()  # SIGKILL: main has no say in it
    assert weir.stop() == -signal.SIGKILL
    gone, alive = psutil.wait_procs(shards, timeout=15)
    assert not alive

    logged = os.path.getsize(weir.stderr_path)  # the new main's lines come after
    weir.start()
    shards = list(shard_processes(weir).values())
    assert sorted(shard_processes(weir)) == [1, 2]
    assert weir.stop() == 0
    gone, alive = psutil.wait_procs(shards, timeout=10)
    assert not alive
    with open(weir.stderr_path, errors="replace") as f:
        f.seek(logged)
        log = f.read()
    # They drained and exited on their own, before main.
    assert "[shard 1] homeserver.processes.lifecycle: stopped" in log
    assert "[shard 2] homeserver.processes.lifecycle: stopped" in log
    assert "did not stop" not in log and "federation shards stopped" in log


def test_a_shard_that_cannot_be_started_is_tried_again(test_ca, dns, tmp_path):
    """Supervision outlives a failed start: main at its file-descriptor limit cannot spawn
    the shard that died (no pipe for the new process); once descriptors are free again the
    next try after the backoff brings the shard back."""
    directory = str(tmp_path / "w")
    weir = start_sharded(directory, sharded_settings(test_ca, dns, directory, WEIR_IP, shards=1))
    main = psutil.Process(weir.proc.pid)
    limits = main.rlimit(psutil.RLIMIT_NOFILE)
    try:
        pid = shard_processes(weir)[1].pid
        # Below what is open: the descriptors the shard's death frees do not make room.
        main.rlimit(psutil.RLIMIT_NOFILE, (main.num_fds() - 4, limits[1]))
        os.kill(pid, signal.SIGKILL)
        weir.wait_for_log(r"federation shard 1 could not be started: .*Too many open files")
        main.rlimit(psutil.RLIMIT_NOFILE, limits)
        weir.wait_for_log(rf"federation shard 1 \(pid (?!{pid}\))\d+\) is serving", timeout=30)
        wait_for_metric(weir.client_url, "weir_federation_shards_alive", 1, timeout=30)
    finally:
        main.rlimit(psutil.RLIMIT_NOFILE, limits)
        weir.stop()
