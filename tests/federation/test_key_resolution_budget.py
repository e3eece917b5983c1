"""Every network-capable key resolution, in a shard and in main, runs under
the key-resolution budgets, including the keys of the senders of relayed PDUs.

Main and one shard run in this process, as the server composes them: each its own runtime
over one database, the shard's federation listener on loopback, the shard relaying to main
over the real IPC socket. The one outbound client of each runtime is instrumented: every
request it makes for keys (``/_matrix/key/...``) is recorded with whether the calling
greenlet holds a key-resolution slot. The test drives every path that resolves keys (the
shard's X-Matrix check, its PDU checks, its notary endpoint, the notary fallback, main's
re-check of relayed PDUs) and fails if any key request was made without a slot, or if a
path made none (so a path that stopped resolving keys does not pass unnoticed).
"""

import gevent
import pytest
import requests
from gevent.event import Event
from signedjson.sign import sign_json

from homeserver.api.app import FEDERATION
from homeserver.config import parse_config
from homeserver.processes.ipc import FrameType, IpcServer
from homeserver.processes.listeners import HomeserverServer
from homeserver.processes.shard import MainLink
from homeserver.processes.shards import answer_relay
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from tests.peers.honest import HonestPeer
from tests.peers.origins import FakeOrigin, OriginKeyServer, send_transaction
from tests.support.federation import federation_settings

KEY_PATHS = "/_matrix/key/"


class KeyRequestRecorder:
    """Wraps a runtime's outbound client; records every key request and the source IPs its
    key rate limiter was asked about."""

    def __init__(self, runtime, name):
        self.name = name
        self.calls: list[tuple[str, str, bool]] = []  # (destination, path, held a slot)
        self.rate_checks: list[str] = []
        client, keyring = runtime.federation_client, runtime.keyring
        request_json, rate = client.request_json, keyring.rate
        recorder = self

        def recorded_request(method, destination, path, **kw):
            if path.startswith(KEY_PATHS):
                self.calls.append((destination, path, keyring.in_budgeted_fetch()))
            return request_json(method, destination, path, **kw)

        class RecordedRate:
            def check(self, key):
                recorder.rate_checks.append(key)
                return rate.check(key)

        client.request_json = recorded_request
        keyring.rate = RecordedRate()

    def unbudgeted(self):
        return [(d, p) for d, p, held in self.calls if not held]

    def destinations(self):
        return {d for d, _, _ in self.calls}


@pytest.fixture
def composed(tmp_path, test_ca, dns):
    """(main runtime, shard runtime, shard federation URL, notary peer, key server)."""
    keys = OriginKeyServer("keybudget.test", test_ca, dns, host="127.62.0.2").start()
    notary = HonestPeer("127.62.0.3:8448", test_ca, host="127.62.0.3", port=8448).start()
    config = parse_config(
        {
            "server_name": "weir.test",
            "data_dir": str(tmp_path),
            "database": {"url": f"sqlite:///{tmp_path}/homeserver.db"},
            "federation": {
                **federation_settings(test_ca, dns, remote_timeout=5),
                "worker": {"shards": 4},
            },
            "security": {
                "federation": {"trusted_key_servers": [{"server_name": notary.server_name}]}
            },
        }
    )
    main = HomeserverRuntime(config)
    path = str(tmp_path / "ipc" / "shards.sock")
    ipc = IpcServer(
        path, {FrameType.RELAY: lambda conn, body: answer_relay(main.inbound_transactions, body)}
    ).start()
    link = MainLink(1, path, Event())
    shard = HomeserverRuntime(config, key_resolution_shards=4, transaction_relay=link.relay)
    link.runtime = shard
    server = HomeserverServer(shard, federation_listener=("127.62.0.1", 0), listeners=(FEDERATION,))
    server.start()
    try:
        yield main, shard, server.federation_url, notary, keys, link
    finally:
        server.stop(grace=1)
        link.connection.close()
        ipc.stop()
        shard.close()
        main.close()
        notary.stop()
        keys.stop()


def joined_room(main):
    alice = main.accounts.register("alice", "pw")
    # Version 10: join_pdu lists the create event among the auth events, as v12 forbids.
    return main.room_creator.create(
        alice.user_id, CreateRoomRequest(preset="public_chat", room_version="10")
    )


def join_pdu(main, room_id, server: FakeOrigin, localpart: str) -> tuple[str, dict]:
    state = {k: s.event.event_id for k, s in main.rooms.store.current_state(room_id).items()}
    user = server.user(localpart)
    prev = [e.event_id for e in main.rooms.store.forward_extremities(room_id)]
    return server.pdu(
        room_id,
        user,
        "m.room.member",
        {"membership": "join"},
        state_key=user,
        prev_events=prev,
        auth_events=[
            state[("m.room.create", "")],
            state[("m.room.power_levels", "")],
            state[("m.room.join_rules", "")],
        ],
    )


def test_every_key_resolution_holds_a_budget_slot(composed, test_ca):
    main, shard, federation_url, notary, keys, link = composed
    main_calls, shard_calls = KeyRequestRecorder(main, "main"), KeyRequestRecorder(shard, "shard")
    room_id = joined_room(main)

    # 1. The shard: X-Matrix auth (the sender's keys) and PDU checks (a PDU sender's keys),
    #    then main re-checks the relayed PDU (keys now cached: no fetch needed there).
    sender, member = keys.add_origin("sender"), keys.add_origin("member")
    join_id, join = join_pdu(main, room_id, member, "mia")
    r = send_transaction(federation_url, sender, "weir.test", "t1", [join], test_ca)
    assert r.json() == {"pdus": {join_id: {}}}, r.text
    assert {sender.name, member.name} <= shard_calls.destinations()

    # 2. Main: a relayed PDU whose sender's keys nobody has fetched yet, with the source IP
    #    of the request the shard received.
    late = keys.add_origin("late")
    late_id, late_join = join_pdu(main, room_id, late, "lou")
    assert link.relay(sender.name, "t2", [late_join], {}, "198.51.100.23") == {
        "pdus": {late_id: {}}
    }
    assert late.name in main_calls.destinations()
    assert "198.51.100.23" in main_calls.rate_checks

    # 3. The shard's notary endpoint, and 4. the notary fallback for a server whose own key
    #    server does not know it.
    queried = keys.add_origin("queried")
    r = requests.get(f"{federation_url}/_matrix/key/v2/query/{queried.name}", timeout=30)
    assert [d["server_name"] for d in r.json()["server_keys"]] == [queried.name]
    dark = FakeOrigin(f"dark.keybudget.test:{keys.port}")  # its key server answers 404
    keys.dns.add_a("dark.keybudget.test", keys.host)
    notary.route(
        "POST",
        "/_matrix/key/v2/query",
        lambda req: (
            200,
            {
                "server_keys": [
                    sign_json(dark.key_document(), notary.server_name, notary.signing_key)
                ]
            },
        ),
    )
    dark_id, dark_join = join_pdu(main, room_id, dark, "dee")
    r = send_transaction(federation_url, sender, "weir.test", "t3", [dark_join], test_ca)
    assert r.json() == {"pdus": {dark_id: {}}}, r.text
    assert notary.hits("/_matrix/key/v2/query") == 1
    assert {queried.name, notary.server_name} <= shard_calls.destinations()

    # Every one of those key requests held a slot, in both processes' budgets...
    assert shard_calls.calls and main_calls.calls
    assert shard_calls.unbudgeted() == [] and main_calls.unbudgeted() == []
    assert "127.0.0.1" in shard_calls.rate_checks
    # ...and the slots are all back.
    assert shard.key_resolution_budget.in_flight == main.key_resolution_budget.in_flight == 0
    assert shard.key_resolution_budget.global_cap == 4
    assert main.key_resolution_budget.global_cap == 16

    # The instrument itself: a key request made around the keyring is caught.
    stray = keys.add_origin("stray")
    shard.federation_client.get_json(stray.name, "/_matrix/key/v2/server")
    assert shard_calls.unbudgeted() == [(stray.name, "/_matrix/key/v2/server")]


def test_a_refusal_by_mains_budget_stages_the_relayed_transaction(composed):
    """Main's budget refusing a relayed PDU's key fetch no longer refuses the sender: main
    stages the transaction and answers 200 at once with nothing applied (rooms/staging.py),
    and its worker applies both PDUs once the budget frees; the answer is then recorded."""
    main, shard, federation_url, notary, keys, link = composed
    room_id = joined_room(main)
    sender, late = keys.add_origin("sender"), keys.add_origin("late")
    bob_id, bob_join = join_pdu(main, room_id, sender, "bob")
    late_id, late_join = join_pdu(main, room_id, late, "lou")
    held = [main.key_resolution_budget.try_acquire(f"busy{i}") for i in range(16)]
    try:
        answer = link.relay(sender.name, "t1", [bob_join, late_join], {}, "198.51.100.9")
        assert answer == {"pdus": {}}
        assert main.rooms.store.get_event(bob_id) is None
        assert main.rooms.store.get_event(late_id) is None
        assert main.inbound_transactions.store.staged_count() == 1
    finally:
        for slot in held:
            slot.release()
    with gevent.Timeout(30, AssertionError("the staged transaction was never applied")):
        while main.inbound_transactions.store.answer(sender.name, "t1") is None:
            gevent.sleep(0.05)
    assert main.inbound_transactions.store.answer(sender.name, "t1") == {
        "pdus": {bob_id: {}, late_id: {}}
    }
    assert main.inbound_transactions.store.staged_count() == 0
