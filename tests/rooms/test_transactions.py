"""Inbound transactions (PUT /_matrix/federation/v1/send/{txnId}) against the real server:
served by main (shards = 0, SQLite) and by two worker shards relaying to main (PostgreSQL),
with fake origins whose keys a real TLS key server serves."""

import os
import time

import gevent
import pytest

from tests.peers.origins import FakeOrigin, OriginKeyServer, send_transaction
from tests.rooms.conftest import stored_pdus
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync, timeline

SEND = "/_matrix/federation/v1/send/{txnId}"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("origins.test", test_ca, dns, host="127.60.0.2") as server:
        yield server


@pytest.fixture(scope="module")
def slow_keys(test_ca, dns):
    """A key server that tests hold, to keep key fetches in flight."""
    with OriginKeyServer("slow.test", test_ca, dns, host="127.60.0.3") as server:
        yield server


@pytest.fixture(
    scope="module", params=[(0, "sqlite"), (2, "postgres")], ids=["main-sqlite", "2shards-postgres"]
)
def weir(request, test_ca, dns, tmp_path_factory):
    shards, engine = request.param
    directory = str(tmp_path_factory.mktemp("txn"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.60.0.1", port=0))
    fed["worker"] = {"shards": shards}
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {
            "federation": fed,
            # Two fetches in flight in all: one per shard with two shards.
            "security": {"federation": {"key_resolution_max_in_flight": 2}},
        },
    )
    if engine == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(directory, settings).start()
    proc.shards = shards
    proc.database_url = settings.get("database", {}).get(
        "url", f"sqlite:///{directory}/data/homeserver.db"
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


@pytest.fixture(scope="module")
def origin(keys):
    return keys.add_origin("o1")


def send(weir, test_ca, origin, txn_id, pdus, **kw):
    return send_transaction(weir.federation_url, origin, "weir.test", txn_id, pdus, test_ca, **kw)


def test_pdus_of_a_joined_remote_user_are_stored(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", ["one", "two", "three"], prev=join_id)
    r = send(weir, test_ca, origin, "t-stored", pdus[::-1])  # children first: sorted by depth
    assert r.status_code == 200, r.text
    assert r.json() == {"pdus": {i: {} for i in ids}}
    assert_matches_spec(r, "PUT", SEND, api="server-server")

    timeline = room.timeline()
    assert [e["event_id"] for e in timeline[-4:]] == [join_id, *ids]
    assert [e["content"].get("body") for e in timeline[-3:]] == ["one", "two", "three"]
    assert {e["sender"] for e in timeline[-3:]} == {origin.user("bob")}
    members = alice.get(
        f"/_matrix/client/v3/rooms/{room.room_id}/members", params={"membership": "join"}
    ).json()["chunk"]
    assert origin.user("bob") in {m["state_key"] for m in members}
    state = room.state_ids()
    assert state[("m.room.member", origin.user("bob"))] == join_id
    # Local users build on the remote events.
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/send/m.room.message/after",
        json={"msgtype": "m.text", "body": "hello bob"},
    )
    assert r.status_code == 200, r.text
    assert room.timeline()[-1]["event_id"] == r.json()["event_id"]


def test_a_received_pdu_wakes_a_waiting_sync(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    since = sync(alice)["next_batch"]
    waiters = metric(weir.client_url, "weir_sync_waiters")
    waiting = gevent.spawn(sync, alice, since, timeout=60_000)
    wait_for_metric(weir.client_url, "weir_sync_waiters", waiters + 1)
    ids, pdus = room.messages(origin, "bob", ["wake up"], prev=join_id)
    assert send(weir, test_ca, origin, "t-sync", pdus).json() == {"pdus": {ids[0]: {}}}
    events = timeline(waiting.get(timeout=30), room.room_id)
    assert [(e["event_id"], e["sender"]) for e in events] == [(ids[0], origin.user("bob"))]


def test_a_retry_gets_the_same_answer_and_nothing_is_applied_twice(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", ["once"], prev=join_id)
    first = send(weir, test_ca, origin, "t-retry", pdus)
    again = send(weir, test_ca, origin, "t-retry", pdus)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() == {"pdus": {ids[0]: {}}}
    # The same PDU in another transaction: accepted, and still stored once.
    other = send(weir, test_ca, origin, "t-retry-2", pdus)
    assert other.json() == {"pdus": {ids[0]: {}}}
    assert [e["event_id"] for e in room.timeline()].count(ids[0]) == 1


def test_each_pdu_gets_its_own_answer(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    good_ids, good = room.messages(origin, "bob", ["fine"], prev=join_id)
    unknown_room_id, unknown_room = origin.pdu(
        "!nowhere:weir.test",
        origin.user("bob"),
        "m.room.message",
        {"body": "x"},
        prev_events=[join_id],
        auth_events=[join_id],
    )
    # Signs as the origin, with the origin's key id, but another key.
    impostor = FakeOrigin(origin.name, origin.signing_key.version)
    forged_id, forged = impostor.pdu(
        room.room_id,
        origin.user("bob"),
        "m.room.message",
        {"body": "forged"},
        prev_events=[join_id],
        auth_events=room.auth_for(origin.user("bob")),
    )
    orphan_id, orphan = origin.pdu(
        room.room_id,
        origin.user("bob"),
        "m.room.message",
        {"body": "orphan"},
        prev_events=["$unknown"],
        auth_events=room.auth_for(origin.user("bob")),
    )
    # carol never joined: the auth rules refuse her message.
    stranger_id, stranger = origin.pdu(
        room.room_id,
        origin.user("carol"),
        "m.room.message",
        {"body": "hi"},
        prev_events=[join_id],
        auth_events=room.auth_for(origin.user("bob"))[:2],
    )
    float_id, floating = origin.pdu(
        room.room_id,
        origin.user("bob"),
        "m.room.message",
        {"body": "x", "n": 1.5},
        prev_events=[join_id],
        auth_events=room.auth_for(origin.user("bob")),
    )
    r = send(
        weir, test_ca, origin, "t-mixed", [*good, unknown_room, forged, orphan, stranger, floating]
    )
    assert r.status_code == 200, r.text
    results = r.json()["pdus"]
    assert_matches_spec(r, "PUT", SEND, api="server-server")
    assert results[good_ids[0]] == {}
    assert "not in the room" in results[unknown_room_id]["error"]
    assert "signature" in results[forged_id]["error"]
    # Its origin cannot give its prev_event: held to be tried again, not refused
    # (rooms/held.py), since a per-PDU error would make the sender drop it for good.
    assert results[orphan_id] == {}
    assert "rejected" in results[stranger_id]["error"]
    assert "invalid event" in results[float_id]["error"]
    stored = [e["event_id"] for e in room.timeline()]
    assert good_ids[0] in stored
    assert not {forged_id, orphan_id, stranger_id, float_id} & set(stored)


def test_soft_failed_pdus_are_stored_hidden_and_rejected_ones_remembered(
    weir, test_ca, alice, origin
):
    """bob is banned while his server has not heard yet. His next message, built on the
    event before the ban, passes the auth rules against the state before it but not against
    the current state: soft-failed, so accepted and stored, but never shown to clients and
    never a forward extremity. One built on the ban itself is rejected outright, and a retry
    is answered from the record of that rejection."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    (said_id,), said = room.messages(origin, "bob", ["before the ban"], prev=join_id)
    assert send(weir, test_ca, origin, "t-before-ban", said).json() == {"pdus": {said_id: {}}}
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/state/m.room.member/{bob}",
        json={"membership": "ban"},
    )
    assert r.status_code == 200, r.text
    ban_id = r.json()["event_id"]
    (late_id,), late = room.messages(origin, "bob", ["did not see the ban"], prev=said_id)
    (after_id,), after = room.messages(origin, "bob", ["saw the ban"], prev=ban_id)
    results = send(weir, test_ca, origin, "t-after-ban", [*late, *after]).json()["pdus"]
    assert results[late_id] == {}
    assert results[after_id]["error"].startswith("rejected by the state before it")
    assert late_id in dict(stored_pdus(weir, room.room_id))
    assert after_id not in dict(stored_pdus(weir, room.room_id))
    assert late_id not in [e["event_id"] for e in room.timeline()]
    assert room.latest_event_id() == ban_id
    retry = send(weir, test_ca, origin, "t-retry-rejected", after).json()["pdus"]
    assert retry[after_id]["error"].startswith("already rejected: rejected by the state")
    # Our next event follows the ban alone, not the soft-failed message.
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/send/m.room.message/after-ban",
        json={"msgtype": "m.text", "body": "next"},
    )
    assert dict(stored_pdus(weir, room.room_id))[r.json()["event_id"]]["prev_events"] == [ban_id]


def test_a_pdu_may_fork_the_room_and_our_next_event_joins_the_forks(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/send/m.room.message/fork1",
        json={"msgtype": "m.text", "body": "meanwhile"},
    )
    ours = r.json()["event_id"]
    (fork_id,), fork = room.messages(origin, "bob", ["from the join"], prev=join_id)
    assert send(weir, test_ca, origin, "t-fork", fork).json() == {"pdus": {fork_id: {}}}
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/send/m.room.message/fork2",
        json={"msgtype": "m.text", "body": "both"},
    )
    merged = dict(stored_pdus(weir, room.room_id))[r.json()["event_id"]]
    assert sorted(merged["prev_events"]) == sorted([ours, fork_id])


def test_a_pdu_whose_content_hash_fails_is_stored_redacted(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    ids, pdus = room.messages(origin, "bob", ["the original"], prev=join_id)
    pdus[0]["content"]["body"] = "tampered"  # the signature covers the redacted event only
    r = send(weir, test_ca, origin, "t-tampered", pdus)
    assert r.json() == {"pdus": {ids[0]: {}}}
    event = room.timeline()[-1]
    assert (event["event_id"], event["content"]) == (ids[0], {})


@pytest.mark.parametrize(
    "case, status, errcode",
    [
        ("51 pdus", 400, "M_BAD_JSON"),
        ("101 edus", 400, "M_BAD_JSON"),
        ("no pdus", 400, "M_BAD_JSON"),
        ("pdu not an object", 400, "M_BAD_JSON"),
        ("body over 10 MiB", 413, "M_TOO_LARGE"),
    ],
)
def test_malformed_or_oversized_transactions_are_refused(
    weir, test_ca, origin, case, status, errcode
):
    room_pdu = {"room_id": "!r:weir.test", "type": "m.room.message"}
    body = {"origin": origin.name, "origin_server_ts": 1, "pdus": []}
    if case == "51 pdus":
        body["pdus"] = [room_pdu] * 51
    elif case == "101 edus":
        body["edus"] = [{"edu_type": "m.typing", "content": {}}] * 101
    elif case == "no pdus":
        del body["pdus"]
    elif case == "pdu not an object":
        body["pdus"] = ["$event"]
    else:
        body["pdus"] = [dict(room_pdu, content={"pad": "x" * (10 * 1024 * 1024)})]
    r = send(weir, test_ca, origin, f"t-bad-{case}", [], body=body)
    assert (r.status_code, r.json()["errcode"]) == (status, errcode), r.text
    # At the limits exactly is fine: 50 PDUs (for a room we are not in) and 100 EDUs.
    ok = dict(
        body,
        pdus=[dict(room_pdu, depth=i) for i in range(50)],
        edus=[{"edu_type": "m.typing", "content": {}}] * 100,
    )
    r = send(weir, test_ca, origin, f"t-ok-{case}", [], body=ok)
    assert r.status_code == 200 and len(r.json()["pdus"]) == 50


def test_a_refused_key_fetch_is_answered_at_once_and_applied_later(
    weir, test_ca, alice, origin, slow_keys
):
    """Three PDUs whose senders' keys must be fetched, held at the key server: the budget
    (two in flight in all) lets one or two fetches start and refuses the rest. Main stages
    the transaction and answers 200 at once; once the keys come, every PDU is applied, once,
    and the recorded answer is the real one. A shard whose own share refuses the check
    relays the PDUs unchecked, and main does the same."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    servers = [slow_keys.add_origin(f"s{i}-{weir.shards}") for i in range(3)]
    joins = [room.join_pdu(server, "dan", prev=join_id) for server in servers]
    ids, bob_says = room.messages(origin, "bob", ["before the joins"], prev=join_id)
    pdus = [*bob_says, *(pdu for _, pdu in joins)]
    slow_keys.hold()
    try:
        r = send(weir, test_ca, origin, "t-budget", pdus)
        assert (r.status_code, r.json()) == (200, {"pdus": {}}), r.text
        assert metric(weir.client_url, "weir_inbound_staged") == 1
        assert ids[0] not in [e["event_id"] for e in room.timeline()]
        assert slow_keys.wait_hits("/_matrix/key/v2/server", 1)
    finally:
        slow_keys.release()
    for _attempt in range(100):
        r = send(weir, test_ca, origin, "t-budget", pdus)
        if r.status_code == 200 and r.json() != {"pdus": {}}:
            break
        gevent.sleep(0.1)  # the sender's backoff, or our worker's
    assert r.json() == {"pdus": {i: {} for i in [ids[0], *(i for i, _ in joins)]}}, r.text
    stored = [e["event_id"] for e in room.timeline()]
    assert all(stored.count(i) == 1 for i in [ids[0], *(i for i, _ in joins)])
    assert metric(weir.client_url, "weir_inbound_staged") == 0


def test_a_servers_transactions_are_applied_one_at_a_time(weir, test_ca, alice, origin, slow_keys):
    """The spec has a server send its next transaction only once the last was answered; we
    apply them in that order. A transaction whose PDU waits for a key that never comes is
    answered within a second and staged, and so is the next; once the key comes they are
    applied in order. A transaction of EDUs alone waits behind them too: its receipt for
    the staged message counts, where applied at once it would name an unknown event and be
    dropped. (A restart resuming them: tests/rooms/test_staging.py.)"""
    if weir.shards:
        pytest.skip("a shard fetches keys before main takes the origin's turn")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    server = slow_keys.add_origin("serial")
    join_id2, join = room.join_pdu(server, "erin", prev=join_id)
    said_ids, said = room.messages(origin, "bob", ["after erin's join"], prev=join_id)
    slow_keys.hold()
    try:
        for txn_id, pdus in (("serial-1", [join]), ("serial-2", said)):
            started = time.monotonic()
            r = send(weir, test_ca, origin, txn_id, pdus)
            assert (r.status_code, r.json()) == (200, {"pdus": {}}), r.text
            print(f"{txn_id} answered in {time.monotonic() - started:.2f} s")
        bob = origin.user("bob")
        receipt = {room.room_id: {"m.read": {bob: {"event_ids": said_ids, "data": {"ts": 7}}}}}
        r = send(
            weir,
            test_ca,
            origin,
            "serial-3",
            [],
            edus=[{"edu_type": "m.receipt", "content": receipt}],
        )
        assert (r.status_code, r.json()) == (200, {"pdus": {}}), r.text
        assert metric(weir.client_url, "weir_inbound_staged") == 3
    finally:
        slow_keys.release()
    wait_for_metric(weir.client_url, "weir_inbound_staged", 0, timeout=60)
    stored = [e["event_id"] for e in room.timeline()]
    assert stored.index(join_id2) < stored.index(said_ids[0])
    ephemeral = sync(alice)["rooms"]["join"][room.room_id]["ephemeral"]["events"]
    read = next(e["content"] for e in ephemeral if e["type"] == "m.receipt")
    assert read[said_ids[0]]["m.read"][bob] == {"ts": 7}
    assert send(weir, test_ca, origin, "serial-2", said).json() == {"pdus": {said_ids[0]: {}}}


def test_an_event_built_on_a_rejected_one_is_accepted(weir, test_ca, alice, origin):
    """The spec lets a rejected event stand as a prev_event: the state after it is the
    state before it. bob may not name the room (his power is 0), so his m.room.name is
    rejected; his next message, built on it, is stored, and the name is unchanged."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    name_id, name = room.pdu(
        origin,
        bob,
        "m.room.name",
        {"name": "bob's now"},
        state_key="",
        prev_events=[join_id],
        auth_events=room.auth_for(bob),
    )
    ids, after = room.messages(origin, "bob", ["still here"], prev=name_id)
    r = send(weir, test_ca, origin, "t-rejected-prev", [name, *after])
    assert r.status_code == 200, r.text
    answers = r.json()["pdus"]
    assert "error" in answers[name_id], answers
    assert answers[ids[0]] == {}, answers
    assert ids[0] in [e["event_id"] for e in room.timeline()]
    assert room.state_events().get(("m.room.name", "")) is None
    # The rejection stands: the same event again is refused from the record.
    r = send(weir, test_ca, origin, "t-rejected-again", [name])
    assert "already rejected" in r.json()["pdus"][name_id]["error"]
