"""Held PDUs (homeserver/rooms/held.py) against the real server: a PDU whose missing events
its origin cannot give (its /get_missing_events and /state_ids answer 500) is answered as
accepted, kept, and tried again; once the origin is fixed it is stored and seen, without
the origin sending anything again, also across a restart; past its age limit it is dropped
and counted."""

import os

import gevent
import pytest
from gevent.event import Event

from tests.peers.origins import OriginKeyServer, send_transaction
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.sync.conftest import sync, timeline

FED_V1 = "/_matrix/federation/v1"
# held_pdu_first_retry here: retries come fast, doubling (0.1, 0.3, 0.7, 1.5, 3.1 s after
# the hold), so that a fixed origin is retried within seconds.
FIRST_RETRY = 0.1
CAP = 50  # staged_per_origin_max_pdus: the least it may be


class FlakyOrigins(OriginKeyServer):
    """Serves its origins' keys, and their events once fixed: until then /get_missing_events
    and /state_ids answer 500, as a server in trouble does."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.events: dict[str, dict] = {}  # event ID -> PDU, given once fixed
        self.broken = True
        self.asked = Event()  # set on each /get_missing_events
        self.route("POST", f"{FED_V1}/get_missing_events/", self._missing, True)
        self.route("GET", f"{FED_V1}/state_ids/", self._broken, True)

    def _broken(self, req):
        return 500, {"errcode": "M_UNKNOWN", "error": "down"}

    def _missing(self, req):
        asked, self.asked = self.asked, Event()
        asked.set()
        if self.broken:
            return self._broken(req)
        body = req.json()
        found, frontier = [], [p for e in body["latest_events"] for p in self._prevs(e)]
        while frontier:
            event_id = frontier.pop()
            if event_id in body["earliest_events"] or event_id not in self.events:
                continue
            found.append(self.events[event_id])
            frontier += self._prevs(event_id)
        return 200, {"events": sorted(found, key=lambda p: p["depth"])}

    def _prevs(self, event_id):
        pdu = self.events.get(event_id)
        return list(pdu["prev_events"]) if pdu else []

    def missing_asks(self) -> int:
        return sum(1 for r in self.requests if r.path.startswith(f"{FED_V1}/get_missing_events/"))

    def wait_asked(self, times: int, timeout: float = 30) -> None:
        with gevent.Timeout(timeout):
            while self.missing_asks() < times:
                self.asked.wait()


@pytest.fixture(scope="module")
def origins(test_ca, dns):
    with FlakyOrigins("held.test", test_ca, dns, host="127.64.0.2") as server:
        yield server


def start_weir(test_ca, dns, directory, max_age=3600.0):
    fed = federation_settings(test_ca, dns, remote_timeout=10)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.64.0.1", port=0))
    limits = {
        "held_pdu_first_retry": FIRST_RETRY,
        "held_pdu_max_age": max_age,
        "staged_per_origin_max_pdus": CAP,
        "event_resolution_per_origin_rate": {"max_requests": 1000, "per_seconds": 60},
    }
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {"federation": fed, "security": {"federation": limits}},
    )
    return WeirProcess(directory, settings).start()


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    proc = start_weir(test_ca, dns, str(tmp_path_factory.mktemp("held")))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def send(weir, test_ca, origin, txn_id, pdus):
    return send_transaction(weir.federation_url, origin, "weir.test", txn_id, pdus, test_ca)


def netsplit(weir, test_ca, alice, origins, label):
    """A room bob of `label` joined, and his two messages after it, of which we are sent
    only the second while his server cannot give the first: (room, ids, the second)."""
    origin = origins.add_origin(label)
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", ["lost in the split", "after it"], prev=join_id)
    origins.events.update(zip(ids, pdus))
    origins.broken = True
    r = send(weir, test_ca, origin, f"split-{label}", [pdus[1]])
    # Accepted: no per-PDU error, which would make the sender drop it for good.
    assert (r.status_code, r.json()) == (200, {"pdus": {ids[1]: {}}}), r.text
    assert not set(ids) & {e["event_id"] for e in room.timeline()}
    return room, ids, origin


def test_a_pdu_whose_gap_cannot_be_filled_is_held_and_stored_once_the_origin_is_back(
    weir, test_ca, alice, origins
):
    retries = metric(weir.client_url, "weir_inbound_held_retries_total")
    room, ids, origin = netsplit(weir, test_ca, alice, origins, "o1")
    assert metric(weir.client_url, "weir_inbound_held") == 1
    asks = origins.missing_asks()
    origins.wait_asked(asks + 1)  # tried again, the origin still broken: still held
    assert metric(weir.client_url, "weir_inbound_held") == 1
    assert metric(weir.client_url, "weir_inbound_held_retries_total") > retries
    since = sync(alice)["next_batch"]
    waiting = gevent.spawn(sync, alice, since, timeout=60_000)
    origins.broken = False  # fixed; it sends nothing again
    wait_for_metric(weir.client_url, "weir_inbound_held", 0, timeout=30)
    stored = [e["event_id"] for e in room.timeline()]
    assert stored[-2:] == ids
    assert room.latest_event_id() == ids[1]  # the room's forward extremity
    # A waiting /sync is woken by what was held (by the first of the two stored).
    assert set(ids) & {e["event_id"] for e in timeline(waiting.get(timeout=30), room.room_id)}
    # Its sender's later events need no fetch at all.
    more_ids, more = room.messages(origin, "bob", ["next"], prev=ids[1])
    assert send(weir, test_ca, origin, "next", more).json() == {"pdus": {more_ids[0]: {}}}


def test_a_held_pdu_does_not_hold_up_its_origins_later_transactions(weir, test_ca, alice, origins):
    room, ids, origin = netsplit(weir, test_ca, alice, origins, "o2")
    other, join_id = room_joined_by(weir, test_ca, alice, origin, "carl")
    more_ids, more = other.messages(origin, "carl", ["elsewhere"], prev=join_id)
    assert send(weir, test_ca, origin, "elsewhere", more).json() == {"pdus": {more_ids[0]: {}}}
    assert more_ids[0] in [e["event_id"] for e in other.timeline()]
    origins.broken = False
    wait_for_metric(weir.client_url, "weir_inbound_held", 0, timeout=30)
    assert [e["event_id"] for e in room.timeline()][-2:] == ids


def test_a_later_event_built_on_a_held_one_fetches_it(weir, test_ca, alice, origins):
    """Once the origin is back, an event built on the held one fills its gap through the
    gap machinery, the held one with it, whether or not its retry came first."""
    room, ids, origin = netsplit(weir, test_ca, alice, origins, "o6")
    origins.wait_asked(origins.missing_asks() + 4)  # four retries: the next is 1.6 s off
    origins.broken = False
    later_ids, later = room.messages(origin, "bob", ["later"], prev=ids[1])
    origins.events.update(zip(later_ids, later))
    assert send(weir, test_ca, origin, "later", later).json() == {"pdus": {later_ids[0]: {}}}
    assert [e["event_id"] for e in room.timeline()][-3:] == [*ids, *later_ids]
    wait_for_metric(weir.client_url, "weir_inbound_held", 0, timeout=30)


def test_held_pdus_count_against_their_origins_cap(weir, test_ca, alice, origins):
    """CAP PDUs held fill the origin's cap: its next transaction that needs one more held
    is answered 429, as staged work past the cap is, and applied once the held are stored."""
    origin = origins.add_origin("o5")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", [f"m{i}" for i in range(CAP + 2)], prev=join_id)
    origins.events.update(zip(ids, pdus))
    origins.broken = True
    r = send(weir, test_ca, origin, "cap-1", pdus[1 : CAP + 1])  # the first is lost
    assert r.status_code == 200 and r.json() in ({"pdus": {i: {} for i in ids[1:-1]}}, {"pdus": {}})
    wait_for_metric(weir.client_url, "weir_inbound_held", CAP, timeout=60)
    r = send(weir, test_ca, origin, "cap-2", pdus[-1:])
    assert (r.status_code, r.json()["errcode"]) == (429, "M_LIMIT_EXCEEDED"), r.text
    origins.broken = False
    wait_for_metric(weir.client_url, "weir_inbound_held", 0, timeout=60)
    for _attempt in range(300):  # the sender's retries, as its backoff would send them
        r = send(weir, test_ca, origin, "cap-2", pdus[-1:])
        if r.status_code == 200 and r.json() != {"pdus": {}}:
            break
        gevent.sleep(0.1)
    assert r.json() == {"pdus": {ids[-1]: {}}}, r.text
    assert [e["event_id"] for e in room.timeline()][-len(ids) :] == ids


def test_a_held_pdu_survives_a_restart(weir, test_ca, alice, origins):
    room, ids, _ = netsplit(weir, test_ca, alice, origins, "o3")
    assert metric(weir.client_url, "weir_inbound_held") == 1
    weir.stop()
    origins.broken = False  # back while we were down
    weir.start()
    alice.base_url = weir.client_url
    wait_for_metric(weir.client_url, "weir_inbound_held", 0, timeout=30)
    assert [e["event_id"] for e in room.timeline()][-2:] == ids


def test_a_held_pdu_is_given_up_past_its_age_and_counted(test_ca, dns, origins, tmp_path):
    weir = start_weir(test_ca, dns, str(tmp_path), max_age=2.0)
    try:
        alice = MatrixClient(weir.client_url)
        alice.register("alice")
        room, ids, _ = netsplit(weir, test_ca, alice, origins, "o4")
        assert metric(weir.client_url, "weir_inbound_held") == 1
        wait_for_metric(weir.client_url, "weir_inbound_held_given_up_total", 1, timeout=30)
        assert metric(weir.client_url, "weir_inbound_held") == 0
        assert metric(weir.client_url, "weir_inbound_held_retries_total") >= 1
        origins.broken = False  # too late: nothing asks it any more
        assert not set(ids) & {e["event_id"] for e in room.timeline()}
    finally:
        weir.stop()
