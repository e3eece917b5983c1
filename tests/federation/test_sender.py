"""The federation sender against the real server: fake origins join a local public room over
/send (tests/support/remote_room.py), and what their servers then receive is recorded by a
TLS peer that checks our X-Matrix signature (tests/peers/receiver.py)."""

import os

import pytest

from tests.peers.origins import OriginKeyServer, send_transaction
from tests.peers.receiver import TransactionSink
from tests.peers.tarpit import Tarpit
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, read_metrics
from tests.support.remote_room import RemoteRoom, room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("sender.test", test_ca, dns, host="127.62.0.2") as server:
        yield server


@pytest.fixture(scope="module")
def sink(keys):
    return TransactionSink(keys)


def weir_settings(test_ca, dns, directory: str, **sender) -> dict:
    fed = federation_settings(test_ca, dns, remote_timeout=3)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.62.0.1", port=0))
    fed["sender"] = {"max_in_flight": 8, **sender}
    return merge(
        base_settings(os.path.join(directory, "data")),
        {
            "server_name": "weir.test",
            "federation": fed,
            # Some twenty-five origins join from one address: their keys are fetched at once.
            "security": {
                "federation": {
                    "key_resolution_per_ip_rate": {"max_requests": 1000, "per_seconds": 60}
                }
            },
        },
    )


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory, sink):
    directory = str(tmp_path_factory.mktemp("sender"))
    proc = WeirProcess(directory, weir_settings(test_ca, dns, directory)).start()
    sink.trust("weir.test", proc.federation_url, test_ca)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def say(client, room_id: str, bodies: list[str], prefix: str = "t") -> list[str]:
    ids = []
    for i, body in enumerate(bodies):
        r = client.put(
            f"{V3}/rooms/{room_id}/send/m.room.message/{prefix}{i}",
            json={"msgtype": "m.text", "body": body},
        )
        assert r.status_code == 200, r.text
        ids.append(r.json()["event_id"])
    return ids


def bodies(sink, destination: str) -> list[str]:
    return [p["content"].get("body") for p in sink.pdus(destination)]


def test_every_server_in_the_room_gets_our_events_in_order(weir, test_ca, keys, sink, alice):
    one, two = keys.add_origin("in-order-1"), keys.add_origin("in-order-2")
    room, _ = room_joined_by(weir, test_ca, alice, one)
    join_id, join = room.join_pdu(two, "carol")
    r = send_transaction(weir.federation_url, two, "weir.test", "j2", [join], test_ca)
    assert r.json() == {"pdus": {join_id: {}}}, r.text

    sent = ["m1", "m2", "m3", "m4", "m5"]
    ids = say(alice, room.room_id, sent)

    for origin in (one, two):
        assert sink.wait_pdus(origin.name, 5), sink.attempts(origin.name)
        assert bodies(sink, origin.name) == sent
        assert [p["room_id"] for p in sink.pdus(origin.name)] == [room.room_id] * 5
        # Signed by us (the sink checked the X-Matrix header), and never two at once.
        assert all(t.status == 200 for t in sink.attempts(origin.name))
        assert sink.max_in_flight[origin.name] == 1
        assert all(t.body["origin"] == "weir.test" for t in sink.accepted(origin.name))
    # What we sent is what we stored: the PDUs are the events, not copies of them.
    assert len(set(ids)) == 5


def joined_rooms(weir, test_ca, alice, origin, n: int) -> list[RemoteRoom]:
    return [room_joined_by(weir, test_ca, alice, origin, localpart=f"u{i}")[0] for i in range(n)]


def come_back(weir, test_ca, sink, origin, txn_id: str) -> None:
    """The destination works again and sends us a transaction: its backoff ends."""
    sink.succeed(origin.name)
    r = send_transaction(weir.federation_url, origin, "weir.test", txn_id, [], test_ca, edus=[])
    assert r.status_code == 200, r.text


def test_batches_hold_fifty_pdus_and_ids_are_never_reused(weir, test_ca, keys, sink, alice):
    origin = keys.add_origin("batches")
    rooms = joined_rooms(weir, test_ca, alice, origin, 3)
    sink.fail(origin.name, 503)
    say(alice, rooms[0].room_id, ["first"], prefix="f")
    assert sink.wait_until(lambda: len(sink.attempts(origin.name)) == 1)
    sent = {room.room_id: [f"{n}-{i}" for i in range(40)] for n, room in enumerate(rooms)}
    for room_id, texts in sent.items():
        say(alice, room_id, texts, prefix="b")  # queued while it backs off
    sent[rooms[0].room_id].insert(0, "first")
    come_back(weir, test_ca, sink, origin, "batches-back")

    assert sink.wait_pdus(origin.name, 121, timeout=30), len(sink.pdus(origin.name))
    for room_id, texts in sent.items():
        got = [p["content"]["body"] for p in sink.pdus(origin.name) if p["room_id"] == room_id]
        assert got == texts
    sizes = [len(t.body["pdus"]) for t in sink.accepted(origin.name)]
    assert max(sizes) == 50 and sum(sizes) == 121, sizes
    ids = [t.txn_id for t in sink.attempts(origin.name)]
    assert len(ids) == len(set(ids))
    assert sink.max_in_flight[origin.name] == 1


def test_catch_up_sends_a_rooms_newest_fifty_and_leaves_the_gap(weir, test_ca, keys, sink, alice):
    origin = keys.add_origin("catch-up")
    [room] = joined_rooms(weir, test_ca, alice, origin, 1)
    sink.fail(origin.name, 502)
    texts = [f"c{i}" for i in range(60)]
    say(alice, room.room_id, texts[:1], prefix="c")
    assert sink.wait_until(lambda: len(sink.attempts(origin.name)) == 1)
    say(alice, room.room_id, texts[1:], prefix="d")
    come_back(weir, test_ca, sink, origin, "catch-up-back")

    assert sink.wait_pdus(origin.name, 50, timeout=10)
    say(alice, room.room_id, ["after"], prefix="e")
    assert sink.wait_pdus(origin.name, 51, timeout=10)
    # The ten oldest were left for the peer to fetch (their IDs are the first PDU's
    # prev_events chain); nothing older came after the newest.
    assert bodies(sink, origin.name) == [*texts[10:], "after"]


def test_a_failed_server_backs_off_until_it_talks_to_us(weir, test_ca, keys, sink, alice):
    origin = keys.add_origin("backoff")
    room, _ = room_joined_by(weir, test_ca, alice, origin)
    sink.fail(origin.name, 500)
    say(alice, room.room_id, ["while down"], prefix="d")
    assert sink.wait_until(lambda: len(sink.attempts(origin.name)) == 1)
    # Backing off for 10 s: no retry comes meanwhile, even for a new event.
    say(alice, room.room_id, ["still down"], prefix="e")
    assert not sink.wait_until(lambda: len(sink.attempts(origin.name)) > 1, timeout=3)
    assert metric(weir.client_url, "weir_federation_sender_backoff") >= 1

    # An inbound transaction says it is back: it is retried at once, everything in order.
    sink.succeed(origin.name)
    r = send_transaction(weir.federation_url, origin, "weir.test", "hello", [], test_ca, edus=[])
    assert r.status_code == 200, r.text
    assert sink.wait_pdus(origin.name, 2, timeout=5), sink.attempts(origin.name)
    assert bodies(sink, origin.name) == ["while down", "still down"]
    ids = [t.txn_id for t in sink.attempts(origin.name)]
    assert len(ids) == len(set(ids))  # the retry had an ID of its own
    assert metric(weir.client_url, "weir_federation_transactions_total", outcome="failure") >= 1


def test_typing_and_read_receipts_go_out_as_edus(weir, test_ca, keys, sink, alice):
    origin = keys.add_origin("edus")
    room, _ = room_joined_by(weir, test_ca, alice, origin)
    [event_id] = say(alice, room.room_id, ["read me"], prefix="r")
    user = alice.get(f"{V3}/account/whoami").json()["user_id"]
    r = alice.put(f"{V3}/rooms/{room.room_id}/typing/{user}", json={"typing": True})
    assert r.status_code == 200, r.text
    r = alice.post(f"{V3}/rooms/{room.room_id}/receipt/m.read/{event_id}", json={})
    assert r.status_code == 200, r.text

    def kinds():
        return {e["edu_type"] for e in sink.edus(origin.name)}

    assert sink.wait_until(lambda: {"m.typing", "m.receipt"} <= kinds()), sink.edus(origin.name)
    typing = next(e for e in sink.edus(origin.name) if e["edu_type"] == "m.typing")
    assert typing["content"] == {"room_id": room.room_id, "user_id": user, "typing": True}
    receipt = next(e for e in sink.edus(origin.name) if e["edu_type"] == "m.receipt")
    read = receipt["content"][room.room_id]["m.read"][user]
    assert read["event_ids"] == [event_id] and isinstance(read["data"]["ts"], int)


def test_dead_servers_never_take_the_live_lane_and_never_delay_a_live_one(
    weir, test_ca, dns, keys, sink, alice
):
    """16 members' servers are TLS tarpits (their keys were fetched while they were up);
    max_in_flight is 8, a quarter of it the live lane's alone. The live server gets each
    message while they are held (homeserver/federation/sender.py, lanes)."""
    live = keys.add_origin("live")
    # The live server has answered us before: it is a server that answers.
    warm, _ = room_joined_by(weir, test_ca, alice, live, localpart="warm")
    say(alice, warm.room_id, ["warm-up"], prefix="w")
    assert sink.wait_pdus(live.name, 1)

    room = RemoteRoom.create(alice)
    # Twice max_in_flight: without the live quarter they would fill every slot, twice over.
    dead = [keys.add_origin(f"dead{i}") for i in range(16)]
    for origin in dead:
        dns.remove(origin.name.split(":")[0])
        dns.add_a(origin.name.split(":")[0], keys.host, ttl=1)
    for i, origin in enumerate([live, *dead]):
        join_id, join = room.join_pdu(origin, "m")
        r = send_transaction(weir.federation_url, origin, "weir.test", f"q{i}", [join], test_ca)
        assert r.json() == {"pdus": {join_id: {}}}, r.text
    # Now they die: their names lead to a tarpit on the same port.
    with Tarpit("127.62.0.9", keys.port) as tarpit:
        for origin in dead:
            dns.remove(origin.name.split(":")[0])
            dns.add_a(origin.name.split(":")[0], tarpit.host, ttl=300)
        gevent_sleep_past_ttl()
        before = len(sink.pdus(live.name))
        say(alice, room.room_id, ["while held"], prefix="q")
        assert tarpit.wait_accepted(1, timeout=5)
        assert sink.wait_pdus(live.name, before + 1, timeout=2), "the live server waited"
        assert tarpit.current >= 1  # tarpits are held right now
        # They time out (3 s) and fail, in the unproven lane's three quarters.
        assert tarpit.wait_accepted(8, timeout=10)
        say(alice, room.room_id, ["again"], prefix="r")
        assert sink.wait_pdus(live.name, before + 2, timeout=2), "the live server waited"
        assert tarpit.max_concurrent <= 8, tarpit.counters()
        # Every dead server has now been tried once and failed.
        assert tarpit.wait_accepted(len(dead), timeout=60), tarpit.counters()
    # A fresh tarpit counts from here. Each dead server sends us a transaction, which ends
    # its backoff: all sixteen want to send at once, first in the unproven lane. They are not
    # live until they answer one of ours: never in the live server's quarter.
    with Tarpit("127.62.0.9", keys.port) as tarpit:
        for i, origin in enumerate(dead):
            r = send_transaction(
                weir.federation_url, origin, "weir.test", f"back{i}", [], test_ca, edus=[]
            )
            assert r.status_code == 200, r.text
        assert tarpit.wait_accepted(4, timeout=20), tarpit.counters()  # two rounds at least
        say(alice, room.room_id, ["quarter"], prefix="s")
        assert sink.wait_pdus(live.name, before + 3, timeout=2), (
            bodies(sink, live.name),
            {k: v for k, v in read_metrics(weir.client_url).items() if "sender" in k[0]},
        )
        assert tarpit.max_concurrent <= 6, tarpit.counters()
        assert metric(weir.client_url, "weir_federation_sender_unproven_in_flight") <= 6
        assert metric(weir.client_url, "weir_federation_sender_revivals_total") >= len(dead)


def gevent_sleep_past_ttl():
    """The dead servers' old addresses were cached for 1 s."""
    import gevent

    gevent.sleep(1.5)


def test_a_kick_reaches_the_server_it_removes(weir, test_ca, keys, sink, alice):
    """A leave or kick goes to the servers joined before it: the kicked user's too."""
    origin = keys.add_origin("kicked")
    room, _ = room_joined_by(weir, test_ca, alice, origin)
    user = origin.user("bob")
    r = alice.post(f"{V3}/rooms/{room.room_id}/kick", json={"user_id": user, "reason": "bye"})
    assert r.status_code == 200, r.text
    assert sink.wait_pdus(origin.name, 1), sink.attempts(origin.name)
    [kick] = sink.pdus(origin.name)
    assert (kick["type"], kick["state_key"], kick["content"]["membership"]) == (
        "m.room.member",
        user,
        "leave",
    )
    # Nobody of that server is left: later events stay here.
    say(alice, room.room_id, ["after the kick"], prefix="k")
    r = alice.get(f"{V3}/rooms/{room.room_id}/messages", params={"dir": "b", "limit": 1})
    assert r.json()["chunk"][0]["content"]["body"] == "after the kick"
    assert not sink.wait_until(lambda: len(sink.pdus(origin.name)) > 1, timeout=1)
