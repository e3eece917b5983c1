"""EDUs queued on an instance that does not hold the destination's lease
(homeserver/federation/sender.py, `_pass_to_holder`): two senders in process, as two
instances, on one real SQLite outbox and its lease rows; the network is a stand-in that
answers at once (test_instances.py runs the same across real processes on PostgreSQL)."""

import gevent
import pytest

from budget import OutboundDeadline
from homeserver.federation.sender import FederationSender
from homeserver.storage.database import open_database
from homeserver.storage.leases import QueueLeases
from homeserver.storage.migrations import migrate
from homeserver.storage.outbox import DESTINATIONS, OutboxStore

REMOTE = "remote.test"
LEASE_SECONDS = 60.0  # far past every wait below: nothing here waits for it to lapse


class Network:
    remote_timeout = 10.0

    def __init__(self):
        self.bodies: list[dict] = []

    def deadline(self, seconds=None, what=""):
        return OutboundDeadline(seconds or self.remote_timeout, what=what)

    def put_json(self, destination, path, body, deadline=None):
        self.bodies.append(body)
        return {"pdus": {}}


@pytest.fixture
def db(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/outbox.db")
    migrate(db)
    yield db
    db.close()


def sender(db, owner: str, network: Network) -> FederationSender:
    leases = QueueLeases(db, DESTINATIONS, owner, LEASE_SECONDS)
    return FederationSender("weir.test", OutboxStore(db), network, 4, leases=leases)


def receipt(event_id: str) -> dict:
    return {"!room:weir.test": {"m.read": {"@bob:weir.test": {"event_ids": [event_id]}}}}


def handed_over(store: OutboxStore, event_id: str) -> bool:
    return any(event_id in str(edu) for _, edu in store.pending_edus(REMOTE, 100))


def test_each_receipt_is_handed_to_the_lease_holder_at_once_not_when_its_lease_lapses(db):
    network = Network()
    holder, other = sender(db, "a", network), sender(db, "b", network)
    store = OutboxStore(db)
    holder.start()
    other.start()
    try:
        holder.send_edu([REMOTE], "m.typing", {"room_id": "!room:weir.test"})
        with gevent.Timeout(5):
            while not network.bodies:
                gevent.sleep(0.01)
        # b finds the lease a's, hands its receipt over, and waits for the lease to lapse.
        other.send_edu([REMOTE], "m.receipt", receipt("$first"))
        with gevent.Timeout(5):
            while not handed_over(store, "$first"):
                gevent.sleep(0.01)
        # A receipt after that is handed over too, not kept until the lease lapses (60 s).
        other.send_edu([REMOTE], "m.receipt", receipt("$second"))
        with gevent.Timeout(5, AssertionError("the receipt waited for the lease")):
            while not handed_over(store, "$second"):
                gevent.sleep(0.01)
        # Only the holder sent: b's receipts wait in the outbox for it.
        assert len(network.bodies) == 1
        assert other.in_flight() == 0
    finally:
        holder.stop()
        other.stop()
