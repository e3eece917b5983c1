"""The federation sender's lanes (homeserver/federation/sender.py), in process, on a fake
clock: a real SQLite outbox, and a stand-in for the federation client whose transactions to
dead servers never answer (the sender's network side is tested against real servers in
test_sender.py and test_sender_synapse.py). Late transactions giving their slot up are
tested on real TLS connections over loopback, with the real client."""

import time

import gevent
import pytest
from gevent.event import Event as Signal

from budget import OutboundDeadline
from homeserver.core.events import Event
from homeserver.federation.sender import LIVE, UNPROVEN, FederationSender
from homeserver.storage.database import open_database
from homeserver.storage.migrations import migrate
from homeserver.storage.outbox import OutboxStore
from homeserver.storage.rooms import NewRoom, RoomStore
from tests.peers.slow import HangingPeer
from tests.support.federation import FakeClock, make_client

ROOM = "!lanes:weir.test"


class Network:
    """Answers transactions at once for the servers that are up; for the others, holds
    them until the test ends (a tarpit)."""

    remote_timeout = 60.0

    def __init__(self, up: set[str]):
        self.up = up
        self.started: list[str] = []  # destinations, in the order their transactions began
        self.changed = Signal()
        self.never = Signal()

    def deadline(self, seconds=None, what=""):
        return OutboundDeadline(seconds or self.remote_timeout, what=what)

    def put_json(self, destination, path, body, deadline=None):
        self.started.append(destination)
        self.changed.set()
        self.changed = Signal()
        if destination not in self.up:
            with deadline:  # a tarpit: the deadline ends the wait, as it would a real call
                self.never.wait()
        return {"pdus": {}}

    def wait_started(self, destination: str, timeout: float = 5) -> int:
        """Where `destination` came in the order of transactions started."""
        with gevent.Timeout(timeout):
            while True:
                changed = self.changed  # taken before looking: no start slips between
                if destination in self.started:
                    return self.started.index(destination)
                changed.wait()


@pytest.fixture
def outbox(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/outbox.db")
    migrate(db)
    yield RoomStore(db), OutboxStore(db)
    db.close()


def queue_event(rooms: RoomStore, n: int, destinations: list[str]) -> None:
    pdu = {
        "room_id": ROOM,
        "type": "m.room.message",
        "sender": "@alice:weir.test",
        "content": {"body": f"message {n}"},
        "prev_events": [],
        "auth_events": [],
        "depth": n,
        "origin_server_ts": n,
    }
    new_room = NewRoom(ROOM, "10", "@alice:weir.test", 0) if n == 0 else None
    rooms.persist_events(
        [Event(f"$event{n}", pdu)], new_room=new_room, received=True, send_to=destinations
    )


def test_a_live_destination_is_served_at_once_behind_two_hundred_unproven(outbox):
    rooms, store = outbox
    dead = [f"dead{i}.test" for i in range(200)]
    network = Network(up={"live.test"})
    clock = FakeClock()
    sender = FederationSender("weir.test", store, network, 16, clock=clock)
    sender.start()
    try:
        queue_event(rooms, 0, ["live.test"])
        sender.wake(["live.test"])  # it answers: live
        network.wait_started("live.test")
        queue_event(rooms, 1, dead)
        sender.wake(dead)  # all two hundred are ready first
        queue_event(rooms, 2, ["live.test"])
        sender.wake(["live.test"])
        # Unproven destinations never take the live lane's quarter: the live one starts at
        # once, while all but that quarter are held by the dead.
        started = len(network.started)
        with gevent.Timeout(5):
            while "live.test" not in network.started[started:]:
                changed = network.changed
                if "live.test" not in network.started[started:]:
                    changed.wait()
        assert network.started[started:].index("live.test") <= sender.unproven_limit
        assert sender.in_flight_of(UNPROVEN) == sender.unproven_limit == 12
        assert sender.oldest_wait() >= 0
        # Its next message too, while the dead still hold their slots.
        queue_event(rooms, 3, ["live.test"])
        started = len(network.started)
        sender.wake(["live.test"])
        with gevent.Timeout(5):
            while network.started[started:].count("live.test") < 1:
                changed = network.changed
                if network.started[started:].count("live.test") < 1:
                    changed.wait()
        assert sender.lane_of(sender._destination("live.test")) == LIVE

        # Without an answer for longer than the window, it is unproven again.
        clock.advance(sender.live_window + 1)
        assert sender.lane_of(sender._destination("live.test")) == UNPROVEN
    finally:
        network.never.set()
        sender.stop()


def test_a_transaction_from_a_waiting_server_puts_its_backlog_next(outbox):
    rooms, store = outbox
    dead = [f"dead{i}.test" for i in range(40)]
    network = Network(up={"dead39.test"})  # the last in line is up after all
    sender = FederationSender(
        "weir.test", store, network, 8, unproven_timeout=1.0, clock=FakeClock()
    )
    dispatched: list[str] = []  # in the order slots were given, whatever the database does
    run = sender._run
    sender._run = lambda dest: (dispatched.append(dest.name), run(dest))  # type: ignore[method-assign]
    sender.start()
    try:
        queue_event(rooms, 0, [])
        queue_event(rooms, 1, dead)
        sender.wake(dead)
        network.wait_started(dead[sender.unproven_limit - 1])
        assert sender.in_flight_of(UNPROVEN) == sender.unproven_limit
        sender.on_inbound_transaction("dead39.test")
        # When the first unproven slot frees (1 s), it goes: ahead of the 33 others
        # that were waiting before it.
        network.wait_started("dead39.test")
        assert dispatched[sender.unproven_limit] == "dead39.test", dispatched
        # Answered: live from now on.
        with gevent.Timeout(5):
            while sender.lane_of(sender._destination("dead39.test")) != LIVE:
                gevent.sleep(0.01)
    finally:
        network.never.set()
        sender.stop()


def test_an_unproven_attempt_has_the_short_timeout_and_a_failed_server_is_revived(outbox):
    rooms, store = outbox
    network = Network(up=set())
    sender = FederationSender(
        "weir.test", store, network, 4, unproven_timeout=0.2, backoff_start=3600
    )
    sender.start()
    try:
        queue_event(rooms, 0, [])
        queue_event(rooms, 1, ["gone.test"])
        sender.wake(["gone.test"])
        network.wait_started("gone.test")
        with gevent.Timeout(5):  # 0.2 s, not the minute of remote_timeout
            while sender.stats.outcomes["failure"] < 1:
                gevent.sleep(0.05)
        assert sender.in_backoff() == 1
        network.up.add("gone.test")
        sender.on_inbound_transaction("gone.test")  # back: its backoff ends, and it is live
        assert sender.revivals == 1
        with gevent.Timeout(5):
            while store.depth():
                gevent.sleep(0.05)
        assert network.started.count("gone.test") == 2
    finally:
        network.never.set()
        sender.stop()


# --- late transactions give their slot to a live destination, on real sockets -----------


class Servers(HangingPeer):
    """One TLS server per port of 127.0.0.1, each its own destination: a port in `up`
    answers every transaction at once (keep-alive), any other takes the request and never
    answers. Counts connections as a tarpit does (`current`, `max_concurrent`)."""

    def __init__(self, ca, count: int):
        super().__init__(ca, ("127.0.0.1",), host="127.0.0.1")
        self.start()
        self.names = [self.name_of(self.port)]
        self.names += [self.name_of(self.listen("127.0.0.1")[1]) for _ in range(count - 1)]
        self.up = set(self.names)
        self.answered: dict[str, int] = {}  # transactions answered, per destination

    @staticmethod
    def name_of(port: int) -> str:
        return f"127.0.0.1:{port}"

    def serve(self, conn) -> None:
        name = self.name_of(conn.getsockname()[1])
        with self._tls.wrap_socket(conn, server_side=True) as tls:
            buffered = b""
            while True:
                head, buffered = self._read_request(tls, buffered)
                if head is None:
                    return
                if name not in self.up:
                    self.discard_until_eof(tls)  # a tarpit now: held until we hang up
                    return
                self.answered[name] = self.answered.get(name, 0) + 1
                self._notify()
                tls.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 11\r\n\r\n{"pdus":{}}'
                )

    @staticmethod
    def _read_request(tls, buffered: bytes) -> tuple[bytes | None, bytes]:
        """One request's head (its body read and dropped), and what came after it."""
        while b"\r\n\r\n" not in buffered:
            data = tls.recv(65536)
            if not data:
                return None, b""
            buffered += data
        head, _, rest = buffered.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            data = tls.recv(65536)
            if not data:
                return None, b""
            rest += data
        return head, rest[length:]

    def reset_peak(self) -> None:
        self.max_concurrent = self.current


class Outcomes:
    """The sender's transaction outcomes (its `on_outcome`), to wait on."""

    def __init__(self):
        self.seen: list[str] = []
        self.changed = Signal()

    def __call__(self, outcome: str) -> None:
        self.seen.append(outcome)
        self.changed.set()
        self.changed = Signal()

    def wait(self, outcome: str, count: int, timeout: float = 10) -> None:
        with gevent.Timeout(timeout, AssertionError(f"{count} {outcome}: {self.seen}")):
            while True:
                changed = self.changed  # taken before looking: none slips between
                if self.seen.count(outcome) >= count:
                    return
                changed.wait()


def all_answered(servers: Servers, names: list[str], at_least: int = 1) -> bool:
    return all(servers.answered.get(n, 0) >= at_least for n in names)


def make_live(sender, outcomes: Outcomes, rooms, servers: Servers, names: list[str]) -> None:
    """Each of `names` answers two transactions, the second on its kept connection: it is
    live, and its last answer took milliseconds. In groups, so that none waits on another's
    handshake (an answer time is how long the whole transaction took)."""
    queue_event(rooms, 0, [])
    for n in (1, 2):
        for i in range(0, len(names), 10):
            group = names[i : i + 10]
            queue_event(rooms, 10_000 * n + i, group)
            sender.wake(group)
            outcomes.wait("success", len(outcomes.seen) + len(group))
    assert all(sender.lane_of(sender._destination(n)) == LIVE for n in names)
    # Idle kept connections are not what the peak is about: from here, only calls count.
    sender.client.transport.close()
    assert servers.wait_current(0, timeout=10)


@pytest.mark.parametrize("max_in_flight", [200, 64])
def test_servers_dead_but_still_live_give_their_slots_to_a_live_one(outbox, test_ca, max_in_flight):
    rooms, store = outbox
    servers = Servers(test_ca, 201)
    dead, live = servers.names[:200], servers.names[200]
    client = make_client(test_ca)
    outcomes = Outcomes()
    sender = FederationSender(
        "weir.test",
        store,
        client,
        max_in_flight,
        late_after=0.3,
        clock=FakeClock(),
        on_outcome=outcomes,
    )
    sender.start()
    try:
        make_live(sender, outcomes, rooms, servers, servers.names)
        late_after = max(sender.late_after(sender._destination(n)) for n in dead)
        servers.up -= set(dead)  # they die, and they are still live
        servers.reset_peak()
        queue_event(rooms, 3, dead)
        sender.wake(dead)  # all two hundred are ready first
        queue_event(rooms, 4, [live])
        started = time.monotonic()
        sender.wake([live])
        assert servers.wait_until(lambda: all_answered(servers, [live], 3), timeout=30)
        took = time.monotonic() - started
        # Those ahead of it go a pool's worth at a time, each pool's worth after late_after.
        turns = (len(dead) - max_in_flight) // max_in_flight + 1
        print(f"live one sent after {took:.2f} s; late_after {late_after:.2f} s, {turns} turns")
        assert took <= turns * late_after + 1.0, (took, late_after, turns)
        assert sender.preempted >= len(dead) - max_in_flight
        assert servers.max_concurrent <= max_in_flight, servers.counters()
    finally:
        sender.stop()
        client.close()
        servers.stop()
    assert sender.in_flight() == 0
    assert sender._late_watch is None  # nothing of the sender outlives stop()
    # Nothing is lost: every dead server, preempted or not, is still owed its event.
    assert all(store.pending(name, 50) for name in dead)


def test_a_late_transaction_keeps_its_slot_when_no_live_one_waits(outbox, test_ca):
    rooms, store = outbox
    servers = Servers(test_ca, 2)
    dead, unproven = servers.names
    client = make_client(test_ca, remote_timeout=1.0)
    outcomes = Outcomes()
    sender = FederationSender(
        "weir.test", store, client, 1, late_after=0.05, clock=FakeClock(), on_outcome=outcomes
    )
    sender.start()
    try:
        make_live(sender, outcomes, rooms, servers, [dead])
        servers.up.discard(dead)
        queue_event(rooms, 3, [dead])
        started = time.monotonic()
        sender.wake([dead])
        queue_event(rooms, 4, [unproven])  # waits for the one slot, but is not live
        sender.wake([unproven])
        outcomes.wait("failure", 1)
        # It kept its slot until its own deadline, long past late.
        assert time.monotonic() - started >= 1.0
        assert sender.preempted == 0
        assert servers.wait_until(lambda: all_answered(servers, [unproven]), timeout=10)
    finally:
        sender.stop()
        client.close()
        servers.stop()
