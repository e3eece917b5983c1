"""Typing and read receipts of remote users (m.typing and m.receipt EDUs in PUT /send) against
the real server: served by main (shards = 0, SQLite) and by two worker shards relaying to
main (PostgreSQL), from fake origins whose keys a real TLS key server serves.

An EDU is applied before the transaction is answered (in main, after the relay with
shards), so a /sync made after the 200 sees it: no test waits for time to pass."""

import os

import gevent
import pytest

from tests.peers.origins import OriginKeyServer, send_transaction
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.sync.conftest import sync

ITEMS = "weir_inbound_edu_items_total"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("edus.test", test_ca, dns, host="127.31.109.4") as server:
        yield server


@pytest.fixture(
    scope="module", params=[(0, "sqlite"), (2, "postgres")], ids=["main-sqlite", "2shards-postgres"]
)
def weir(request, test_ca, dns, tmp_path_factory):
    shards, engine = request.param
    directory = str(tmp_path_factory.mktemp("edus"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.31.109.3", port=0))
    fed["worker"] = {"shards": shards}
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    if engine == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.user_id = client.register("alice")["user_id"]
    return client


@pytest.fixture(scope="module")
def origin(keys):
    return keys.add_origin("o1")


@pytest.fixture(scope="module")
def other(keys):
    return keys.add_origin("o2")


def send(weir, test_ca, origin, txn_id, pdus=(), edus=()):
    """A transaction; with EDUs only its answer is always `{"pdus": {}}`."""
    r = send_transaction(
        weir.federation_url, origin, "weir.test", txn_id, list(pdus), test_ca, edus=list(edus)
    )
    assert r.status_code == 200, r.text
    return r.json()


def typing_edu(room_id, user_id, typing=True, **extra):
    content = {"room_id": room_id, "user_id": user_id, "typing": typing, **extra}
    return {"edu_type": "m.typing", "content": content}


def receipt_edu(room_id, user_id, event_ids, data=None, receipt_type="m.read"):
    receipt = {"event_ids": event_ids, "data": data if data is not None else {"ts": 1234}}
    return {"edu_type": "m.receipt", "content": {room_id: {receipt_type: {user_id: receipt}}}}


def ephemeral(body: dict, room_id: str) -> dict:
    """{type: content} of the room's ephemeral events in a sync answer."""
    room = body["rooms"]["join"].get(room_id, {})
    return {e["type"]: e["content"] for e in room.get("ephemeral", {}).get("events", [])}


def typing_now(client, room_id: str) -> list[str]:
    return ephemeral(sync(client), room_id).get("m.typing", {}).get("user_ids", [])


def items(weir, edu_type: str, outcome: str) -> float:
    return metric(weir.client_url, ITEMS, edu_type=edu_type, outcome=outcome)


def test_remote_typing_wakes_a_waiting_sync_and_stops(weir, test_ca, alice, origin):
    room, _ = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    since = sync(alice)["next_batch"]
    waiters = metric(weir.client_url, "weir_sync_waiters")
    waiting = gevent.spawn(sync, alice, since, timeout=60_000)
    wait_for_metric(weir.client_url, "weir_sync_waiters", waiters + 1)
    assert send(weir, test_ca, origin, "typing-on", edus=[typing_edu(room.room_id, bob)]) == {
        "pdus": {}
    }
    woken = waiting.get(timeout=10)
    assert ephemeral(woken, room.room_id)["m.typing"] == {"user_ids": [bob]}
    # It stops when its server says so; the change reaches a sync from the last token.
    send(weir, test_ca, origin, "typing-off", edus=[typing_edu(room.room_id, bob, False)])
    after = sync(alice, woken["next_batch"])
    assert ephemeral(after, room.room_id)["m.typing"] == {"user_ids": []}


def test_a_remote_receipt_for_an_event_of_the_same_transaction(weir, test_ca, alice, origin):
    """The PDUs are stored first, so a receipt may name an event the transaction carries."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    since = sync(alice)["next_batch"]
    (said,), pdus = room.messages(origin, "bob", ["read by me"], prev=join_id)
    edu = receipt_edu(room.room_id, bob, [said], {"ts": 1700000000000, "thread_id": "main"})
    assert send(weir, test_ca, origin, "receipt-same", pdus, [edu]) == {"pdus": {said: {}}}
    receipts = ephemeral(sync(alice, since), room.room_id)["m.receipt"]
    assert receipts == {said: {"m.read": {bob: {"ts": 1700000000000, "thread_id": "main"}}}}
    # A retry of the answered transaction applies nothing again; an older receipt is ignored.
    since = sync(alice)["next_batch"]
    send(weir, test_ca, origin, "receipt-same", pdus, [edu])
    old = receipt_edu(room.room_id, bob, [join_id], {"ts": 1, "thread_id": "main"})
    send(weir, test_ca, origin, "receipt-old", edus=[old])
    assert "m.receipt" not in ephemeral(sync(alice, since), room.room_id)


def test_our_receipt_and_a_remote_one_show_together(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    r = alice.post(f"/_matrix/client/v3/rooms/{room.room_id}/receipt/m.read/{join_id}", json={})
    assert r.status_code == 200, r.text
    send(weir, test_ca, origin, "receipt-both", edus=[receipt_edu(room.room_id, bob, [join_id])])
    read = ephemeral(sync(alice), room.room_id)["m.receipt"][join_id]["m.read"]
    assert set(read) == {alice.user_id, bob}
    assert read[bob] == {"ts": 1234}


def test_an_edu_for_a_user_of_another_server_is_dropped(weir, test_ca, alice, origin, other):
    """o2 speaks for o1's joined user: dropped, and the transaction is still 200."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    dropped = items(weir, "m.typing", "dropped") + items(weir, "m.receipt", "dropped")
    forged = [typing_edu(room.room_id, bob), receipt_edu(room.room_id, bob, [join_id])]
    assert send(weir, test_ca, other, "forged", edus=forged) == {"pdus": {}}
    body = sync(alice)
    assert typing_now(alice, room.room_id) == []
    assert "m.receipt" not in ephemeral(body, room.room_id)
    assert items(weir, "m.typing", "dropped") + items(weir, "m.receipt", "dropped") == dropped + 2


def test_an_edu_for_a_user_not_in_the_room_is_dropped(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    stranger = origin.user("carol")  # of the right server, never joined
    bob = origin.user("bob")
    edus = [
        typing_edu(room.room_id, stranger),
        receipt_edu(room.room_id, stranger, [join_id]),
        typing_edu("!unknown:weir.test", bob),  # a room we do not know: nobody is joined
        typing_edu(room.room_id, bob),  # the one that passes, last
    ]
    send(weir, test_ca, origin, "strangers", edus=edus)
    assert typing_now(alice, room.room_id) == [bob]
    assert "m.receipt" not in ephemeral(sync(alice), room.room_id)


def test_malformed_private_and_other_edus_are_dropped_alone(weir, test_ca, alice, origin):
    """Presence, device lists, to-device and unknown types are accepted and dropped; a
    malformed or private item is dropped alone; the good receipt beside them is applied."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob, rid = origin.user("bob"), room.room_id
    edus = [
        {"edu_type": "m.presence", "content": {"push": [{"user_id": bob, "presence": "online"}]}},
        {"edu_type": "m.device_list_update", "content": {"user_id": bob, "device_id": "D"}},
        {"edu_type": "m.direct_to_device", "content": {"sender": bob, "messages": {}}},
        {"edu_type": "org.example.unknown", "content": {}},
        {"edu_type": "m.typing", "content": {"room_id": rid, "user_id": bob, "typing": "yes"}},
        {"edu_type": "m.typing", "content": "not an object"},
        {"edu_type": "m.receipt", "content": ["not", "an", "object"]},
        receipt_edu(rid, bob, [join_id], receipt_type="m.read.private"),
        receipt_edu(rid, bob, ["not-an-event-id"]),
        receipt_edu(rid, bob, [join_id] * 11),  # more event IDs than a receipt may name
        receipt_edu(rid, bob, [join_id], {"thread_id": "t" * 256}),
        receipt_edu(rid, bob, ["$never-seen"]),  # well formed, but we do not hold it
        receipt_edu(rid, bob, [join_id], {"ts": "soon", "thread_id": 7}),  # now; unthreaded
    ]
    before = sync(alice)["next_batch"]
    assert send(weir, test_ca, origin, "mixed-edus", edus=edus) == {"pdus": {}}
    body = sync(alice, before)
    assert "m.typing" not in ephemeral(body, rid)
    read = ephemeral(body, rid)["m.receipt"]
    assert list(read) == [join_id] and list(read[join_id]["m.read"]) == [bob]
    assert isinstance(read[join_id]["m.read"][bob]["ts"], int)  # "soon" replaced by now
    assert "thread_id" not in read[join_id]["m.read"][bob]


def test_one_transaction_looks_at_a_bounded_number_of_receipts(weir, test_ca, alice, origin):
    """A receipt EDU naming 2000 rooms: the first 1000 rooms and receipts are looked at
    (each dropped: nobody is joined to those rooms), the rest dropped unread."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    bob = origin.user("bob")
    receipt = {"event_ids": [join_id], "data": {"ts": 1}}
    flood = {f"!flood{i}:weir.test": {"m.read": {bob: receipt}} for i in range(2000)}
    dropped = items(weir, "m.receipt", "dropped")
    accepted = items(weir, "m.receipt", "accepted")
    edus = [{"edu_type": "m.receipt", "content": flood}, receipt_edu(room.room_id, bob, [join_id])]
    send(weir, test_ca, origin, "flood", edus=edus)
    # 500 rooms and their 500 receipts, then one drop for the bound, then the good receipt,
    # which comes after the bound, is dropped too.
    assert items(weir, "m.receipt", "dropped") == dropped + 500 + 1 + 1
    assert items(weir, "m.receipt", "accepted") == accepted
    # The next transaction has a bound of its own.
    send(weir, test_ca, origin, "after-flood", edus=[receipt_edu(room.room_id, bob, [join_id])])
    assert items(weir, "m.receipt", "accepted") == accepted + 1


def test_a_room_shows_at_most_100_remote_typers(weir, test_ca, alice, origin):
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    users, prev = [], join_id
    for batch in range(3):  # 101 more users join, at most 50 PDUs a transaction
        pdus = []
        for i in range(batch * 50, min(batch * 50 + 50, 101)):
            prev, pdu = room.join_pdu(origin, f"typist{i}", prev=prev)
            users.append(origin.user(f"typist{i}"))
            pdus.append(pdu)
        answer = send(weir, test_ca, origin, f"typists-{batch}", pdus)
        assert all(result == {} for result in answer["pdus"].values()), answer
    edus = [typing_edu(room.room_id, u) for u in users[:100]]
    send(weir, test_ca, origin, "typing-100", edus=edus)
    send(weir, test_ca, origin, "typing-101", edus=[typing_edu(room.room_id, users[100])])
    typing = typing_now(alice, room.room_id)
    assert len(typing) == 100 and users[100] not in typing
    # Our own users are never crowded out.
    r = alice.put(
        f"/_matrix/client/v3/rooms/{room.room_id}/typing/{alice.user_id}",
        json={"typing": True, "timeout": 30000},
    )
    assert r.status_code == 200, r.text
    assert alice.user_id in typing_now(alice, room.room_id)


def device_lists_until(client, since: str, wanted) -> dict:
    """Long-polls /sync from `since` until its device_lists satisfy `wanted`."""
    with gevent.Timeout(20, AssertionError("device_lists never showed the change")):
        while True:
            body = sync(client, since=since, timeout=5000)
            lists = body.get("device_lists", {"changed": [], "left": []})
            if wanted(lists):
                return lists
            since = body["next_batch"]


def test_a_remote_users_device_change_and_leave_reach_device_lists(weir, test_ca, alice, origin):
    """Issue 34, item 5: a device list update of a remote user who shares a room with alice
    puts them in her sync's device_lists.changed; their leave from the only room they shared
    puts them in `left`, so her client stops encrypting to their devices."""
    room, join_id = room_joined_by(weir, test_ca, alice, origin, "dora")
    dora = origin.user("dora")
    since = sync(alice)["next_batch"]
    update = {"user_id": dora, "device_id": "DORA1", "stream_id": 7, "prev_id": []}
    send(
        weir,
        test_ca,
        origin,
        "dora-d1",
        edus=[{"edu_type": "m.device_list_update", "content": update}],
    )
    changed = device_lists_until(alice, since, lambda lists: dora in lists.get("changed", []))
    assert dora not in changed.get("left", [])
    since = sync(alice)["next_batch"]
    leave_id, leave = room.pdu(
        origin,
        dora,
        "m.room.member",
        {"membership": "leave"},
        state_key=dora,
        prev_events=[join_id],
        auth_events=room.auth_for(dora),
    )
    answer = send(weir, test_ca, origin, "dora-leave", pdus=[leave])
    assert answer == {"pdus": {leave_id: {}}}
    left = device_lists_until(alice, since, lambda lists: dora in lists.get("left", []))
    assert dora not in left.get("changed", [])
