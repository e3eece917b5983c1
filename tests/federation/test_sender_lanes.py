"""The federation sender's lanes (homeserver/federation/sender.py), in process, on a fake
clock: a real SQLite outbox, and a stand-in for the federation client whose transactions to
dead servers never answer (the sender's network side is tested against real servers in
test_sender.py and test_sender_synapse.py)."""

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
from tests.support.federation import FakeClock

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
