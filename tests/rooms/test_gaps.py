"""Filling gaps and the event-resolution budget, against the real server (main, SQLite) and
fake origins whose federation API a real TLS peer serves.

- A PDU whose predecessors we never received: they are fetched with /get_missing_events
  and stored in order; or, when the origin gives none, the state at the gap is fetched with
  /state_ids and /event.
- Abuse: a hostile server's PDUs point at events it never gives (it holds the request): one
  origin's transactions go one at a time, answered within a second and staged up to its cap
  (past it, 429), at most `event_resolution_max_in_flight` fetches are held across its
  origins, the rest waiting their turn; meanwhile another origin's PDUs and local requests
  are served, and once released everything staged is applied.
"""

import os
from urllib.parse import unquote

import gevent
import pytest
from gevent.event import Event

from tests.e2ee.conftest import count_rows
from tests.peers.origins import OriginKeyServer, send_transaction
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.sync.conftest import sync

FED_V1 = "/_matrix/federation/v1"
IN_FLIGHT = 4
RATE = 1000
# [security.federation] staged_per_origin_max_pdus here (the least it may be).
STAGED_CAP = 50


@pytest.fixture(scope="module")
def origins(test_ca, dns):
    with OriginKeyServer("gaps.test", test_ca, dns, host="127.31.111.3") as server:
        server.events = {}  # event ID -> PDU, what its origins will give when asked
        server.route("POST", f"{FED_V1}/get_missing_events/", _missing_events(server), True)
        server.route("GET", f"{FED_V1}/state_ids/", _state_ids(server), True)
        server.route("GET", f"{FED_V1}/event/", _event(server), True)
        server.state_ids = {}  # event ID -> the /state_ids answer at it
        server.give_missing = True
        yield server


def _missing_events(server):
    def handle(req):
        body = req.json()
        if not server.give_missing:
            return 200, {"events": []}
        stop = set(body["earliest_events"]) | set(body["latest_events"])
        found, frontier = [], [p for e in body["latest_events"] for p in _prevs(server, e)]
        while frontier and len(found) < min(body["limit"], 20):  # Synapse's cap
            event_id = frontier.pop()
            if event_id in stop or event_id not in server.events:
                continue
            found.append(server.events[event_id])
            frontier += _prevs(server, event_id)
        return 200, {"events": sorted(found, key=lambda p: p["depth"])}

    return handle


def _prevs(server, event_id):
    pdu = server.events.get(event_id)
    return list(pdu["prev_events"]) if pdu else []


def _state_ids(server):
    def handle(req):
        event_id = unquote(req.query.split("event_id=", 1)[1])
        answer = server.state_ids.get(event_id)
        return (200, answer) if answer else (404, {"errcode": "M_NOT_FOUND", "error": "no"})

    return handle


def _event(server):
    def handle(req):
        pdu = server.events.get(unquote(req.path[len(f"{FED_V1}/event/") :]))
        if pdu is None:
            return 404, {"errcode": "M_NOT_FOUND", "error": "no"}
        return 200, {"origin": "x", "origin_server_ts": 0, "pdus": [pdu]}

    return handle


class HostileServer(OriginKeyServer):
    """Serves its origins' keys, and holds every /get_missing_events until released."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.held = 0
        self.max_held = 0
        self.asked = 0
        self.open = Event()
        self.changed = Event()
        self.route("POST", f"{FED_V1}/get_missing_events/", self._tarpit, True)

    def _tarpit(self, req):
        self.asked += 1
        self.held += 1
        self.max_held = max(self.max_held, self.held)
        self._notify()
        try:
            self.open.wait()
        finally:
            self.held -= 1
            self._notify()
        return 404, {"errcode": "M_NOT_FOUND", "error": "never"}

    def _notify(self):
        changed, self.changed = self.changed, Event()
        changed.set()

    def wait_held(self, count, timeout=30):
        with gevent.Timeout(timeout):
            while self.held != count:
                self.changed.wait()


@pytest.fixture(scope="module")
def hostile_server(test_ca, dns):
    with HostileServer("hostile.test", test_ca, dns, host="127.31.111.4") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("gaps"))
    fed = federation_settings(test_ca, dns, remote_timeout=30)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.31.111.2", port=0))
    limits = {
        "event_resolution_max_in_flight": IN_FLIGHT,
        "event_resolution_per_origin_rate": {"max_requests": RATE, "per_seconds": 3600},
        "staged_per_origin_max_pdus": STAGED_CAP,
    }
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {"federation": fed, "security": {"federation": limits}},
    )
    proc = WeirProcess(directory, settings).start()
    proc.database_url = f"sqlite:///{directory}/data/homeserver.db"
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def send(weir, test_ca, origin, txn_id, pdus):
    return send_transaction(weir.federation_url, origin, "weir.test", txn_id, pdus, test_ca)


def asked(server, path):
    return [r for r in server.requests if r.path.startswith(f"{FED_V1}/{path}/")]


def test_a_gap_of_five_is_fetched_and_read_in_order(weir, test_ca, alice, origins):
    origin = origins.add_origin("o1")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", [f"m{i}" for i in range(1, 7)], prev=join_id)
    origins.events.update(zip(ids, pdus))

    r = send(weir, test_ca, origin, "gap-6", [pdus[-1]])  # only the sixth
    assert r.status_code == 200, r.text
    assert r.json() == {"pdus": {ids[-1]: {}}}
    calls = asked(origins, "get_missing_events")
    assert len(calls) == 1
    assert calls[0].json()["latest_events"] == [ids[-1]]
    assert calls[0].json()["earliest_events"] == [join_id]

    timeline = room.timeline()
    assert [e["event_id"] for e in timeline[-7:]] == [join_id, *ids]
    assert [e["content"]["body"] for e in timeline[-6:]] == [f"m{i}" for i in range(1, 7)]
    # Backwards, as a client pages: the six, newest first.
    r = alice.get(
        f"/_matrix/client/v3/rooms/{room.room_id}/messages", params={"dir": "b", "limit": 6}
    )
    assert [e["event_id"] for e in r.json()["chunk"]] == ids[::-1]


def test_a_gap_of_three_hundred_is_fetched_whole_and_read_in_order(weir, test_ca, alice, origins):
    """A netsplit's worth: the origin sends its newest event alone, as a server catching us
    up does; the 299 before it are fetched 20 at a time, received oldest first, and
    /messages reads all 300 in order, with no state fetched."""
    origin = origins.add_origin("o300")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    texts = [f"n{i}" for i in range(300)]
    ids, pdus = room.messages(origin, "bob", texts, prev=join_id)
    origins.events.update(zip(ids, pdus))
    before = {path: len(asked(origins, path)) for path in ("get_missing_events", "state_ids")}
    r = send(weir, test_ca, origin, "gap-300", [pdus[-1]])
    # Applied within the second, or staged and applied after (rooms/staging.py).
    assert r.json() in ({"pdus": {ids[-1]: {}}}, {"pdus": {}}), r.text
    wait_for_metric(weir.client_url, "weir_inbound_staged", 0, timeout=60)
    assert send(weir, test_ca, origin, "gap-300", [pdus[-1]]).json() == {"pdus": {ids[-1]: {}}}
    assert len(asked(origins, "get_missing_events")) - before["get_missing_events"] == 15
    assert len(asked(origins, "state_ids")) == before["state_ids"]
    read, token = [], None
    while True:
        params = {"dir": "b", "limit": 100, **({"from": token} if token else {})}
        page = alice.get(f"/_matrix/client/v3/rooms/{room.room_id}/messages", params=params)
        chunk = page.json()["chunk"]
        read += [e["content"]["body"] for e in chunk if e["type"] == "m.room.message"]
        token = page.json().get("end")
        if not chunk or not token:
            break
    assert read[::-1] == texts


def test_without_missing_events_the_state_at_the_gap_is_fetched(weir, test_ca, alice, origins):
    origin = origins.add_origin("o2")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", ["lost", "found"], prev=join_id)
    origins.events.update(zip(ids, pdus))
    state = room.state_ids()
    origins.state_ids[ids[0]] = {"pdu_ids": list(state.values()), "auth_chain_ids": []}
    origins.give_missing = False
    try:
        r = send(weir, test_ca, origin, "gap-state", [pdus[1]])
    finally:
        origins.give_missing = True
    assert r.status_code == 200, r.text
    assert r.json() == {"pdus": {ids[1]: {}}}
    assert [unquote(c.query) for c in asked(origins, "state_ids")] == [f"event_id={ids[0]}"]
    assert [c.path.rsplit("/", 1)[1] for c in asked(origins, "event")] == [ids[0]]
    # The second is in the live timeline; the first, fetched as state, is history behind it.
    events = room.timeline()
    assert events[-1]["event_id"] == ids[1]
    assert events[0]["event_id"] == ids[0]
    # bob's next message builds on the second: received with no fetch at all.
    more_ids, more = room.messages(origin, "bob", ["next"], prev=ids[1])
    before = len(origins.requests)
    assert send(weir, test_ca, origin, "gap-next", more).json() == {"pdus": {more_ids[0]: {}}}
    assert len(origins.requests) == before


def test_state_fetched_at_a_gap_is_stored_as_outliers(weir, test_ca, alice, origins):
    """bob renames himself, then speaks twice; we get only the last message, and the origin
    gives no missing events. The state at the gap brings his new member event: stored as an
    outlier (no part of the timeline, never shown), yet the room's state after the gap."""
    origin = origins.add_origin("outliers")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    auth = room.auth_ids(("m.room.create", ""), ("m.room.power_levels", ""))
    rules = room.auth_ids(("m.room.join_rules", ""))
    renamed_id, renamed = room.pdu(
        origin,
        bob,
        "m.room.member",
        {"membership": "join", "displayname": "Robert"},
        state_key=bob,
        prev_events=[join_id],
        auth_events=[*auth, *rules, join_id],
    )
    ids, pdus = room.messages(
        origin, "bob", ["lost", "found"], prev=renamed_id, auth=[*auth, renamed_id]
    )
    origins.events.update(zip([renamed_id, *ids], [renamed, *pdus]))
    state = {**room.state_ids(), ("m.room.member", bob): renamed_id}
    origins.state_ids[ids[0]] = {"pdu_ids": list(state.values()), "auth_chain_ids": [join_id]}
    origins.give_missing = False
    try:
        r = send(weir, test_ca, origin, "gap-outlier", [pdus[1]])
    finally:
        origins.give_missing = True
    assert r.json() == {"pdus": {ids[1]: {}}}, r.text
    fetched = [c.path.rsplit("/", 1)[1] for c in asked(origins, "event")]
    assert sorted(fetched[-2:]) == sorted([ids[0], renamed_id])
    # The message at the gap is history behind the live one; the state fetched is neither.
    timeline = [e["event_id"] for e in room.timeline()]
    assert timeline[-1] == ids[1] and ids[0] in timeline and renamed_id not in timeline
    outlier = "SELECT COUNT(*) FROM events WHERE event_id = ? AND outlier = 1 AND soft_failed = 0"
    assert count_rows(weir, outlier, (renamed_id,)) == 1
    assert room.state_ids()[("m.room.member", bob)] == renamed_id


def test_a_hostile_server_gets_its_budget_and_no_more(
    weir, test_ca, alice, origins, hostile_server
):
    """One origin's transactions are applied one at a time: of 100 sent at once, one
    fetches, two wait their turn, the rest are refused at once. Across the server's other
    origins, at most IN_FLIGHT fetches are held in all; one past them is refused."""
    names = [hostile_server.add_origin(f"h{i}") for i in range(IN_FLIGHT + 1)]
    hostile = names[0]
    room, _ = room_joined_by(weir, test_ca, alice, hostile, "mallory")
    for other in names[1:]:
        join_id, join = room.join_pdu(other, "mallory")
        r = send(weir, test_ca, other, f"join-{other.name}", [join])
        assert r.json() == {"pdus": {join_id: {}}}, r.text

    def tarpit_pdu(n, origin=hostile):
        return origin.pdu(
            room.room_id,
            origin.user("mallory"),
            "m.room.message",
            {"msgtype": "m.text", "body": f"bait {n}"},
            prev_events=[f"$tarpit{n}"],
            auth_events=room.auth_for(origin.user("mallory")),
            depth=200 + n,
        )[1]

    # 100 PDUs, one transaction each, all at once, from one origin: applied one at a time,
    # each answered within a second and staged, until its staging cap; the rest 429.
    jobs = {
        n: gevent.spawn(send, weir, test_ca, hostile, f"bait-{n}", [tarpit_pdu(n)])
        for n in range(100)
    }
    hostile_server.wait_held(1)
    gevent.joinall(jobs.values(), timeout=60, raise_error=True)
    accepted = [n for n, job in jobs.items() if job.value.status_code == 200]
    refused = [jobs[n].value for n in jobs if n not in accepted]
    assert all(jobs[n].value.json() == {"pdus": {}} for n in accepted)
    assert {r.json()["errcode"] for r in refused} == {"M_LIMIT_EXCEEDED"}
    assert 1 <= len(accepted) <= STAGED_CAP and len(refused) >= 100 - STAGED_CAP
    assert metric(weir.client_url, "weir_inbound_staged") == len(accepted)
    assert hostile_server.held == hostile_server.max_held == 1  # one at a time
    # Its other origins, one transaction each: the budget holds IN_FLIGHT fetches in all;
    # the one past it waits its turn, answered (and staged) all the same.
    others = [
        gevent.spawn(send, weir, test_ca, o, "bait", [tarpit_pdu(500 + i, o)])
        for i, o in enumerate(names[1:])
    ]
    hostile_server.wait_held(IN_FLIGHT)
    gevent.joinall(others, timeout=60, raise_error=True)
    assert all((j.value.status_code, j.value.json()) == (200, {"pdus": {}}) for j in others)
    assert hostile_server.held == hostile_server.max_held == IN_FLIGHT

    # Meanwhile, with the tarpit still holding its fetches: another origin's PDUs in
    # another room are taken at once, and local requests answer.
    honest = origins.add_origin("o3")
    other, join_id = room_joined_by(weir, test_ca, alice, honest)
    ids, pdus = other.messages(honest, "bob", ["unaffected"], prev=join_id)
    assert send(weir, test_ca, honest, "honest-1", pdus).json() == {"pdus": {ids[0]: {}}}
    assert sync(alice)["next_batch"]
    assert alice.get("/_matrix/client/v3/joined_rooms").status_code == 200
    assert hostile_server.held == IN_FLIGHT

    # Let the tarpit go: everything staged is applied, its fetches failing. Each PDU is
    # held to be tried again later (rooms/held.py, not stored), within its origin's cap,
    # and the recorded answers accept it: an error would make a sender drop it for good.
    hostile_server.open.set()
    wait_for_metric(weir.client_url, "weir_inbound_staged", 0, timeout=60)
    for n in accepted:
        (answer,) = (
            send(weir, test_ca, hostile, f"bait-{n}", [tarpit_pdu(n)]).json()["pdus"].values()
        )
        assert answer == {}
    assert metric(weir.client_url, "weir_inbound_held") == len(accepted) + IN_FLIGHT
    assert hostile_server.asked == len(accepted) + IN_FLIGHT  # no retry yet: 30 s
