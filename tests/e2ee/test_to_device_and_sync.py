"""To-device messages and what E2EE adds to /sync, on the real server (both engines):
delivery, idempotence, deletion once acknowledged, device lists, key counts, wake-ups."""

import gevent

from tests.e2ee.conftest import V3, count_rows, create_room
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import metric
from tests.sync.test_waiting import wait_until

PENDING = "SELECT COUNT(*) FROM to_device_messages WHERE user_id = ? AND device_id = ?"


def sync(client, since=None, timeout=0) -> dict:
    params = {"timeout": timeout, **({"since": since} if since else {})}
    r = client.get(f"{V3}/sync", params=params, timeout=30 + timeout / 1000)
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", "/_matrix/client/v3/sync")
    return r.json()


def send_to_device(sender, txn, messages, event_type="m.room_key_request"):
    r = sender.client.put(f"{V3}/sendToDevice/{event_type}/{txn}", json={"messages": messages})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "put", "/_matrix/client/v3/sendToDevice/{eventType}/{txnId}")


def test_to_device_is_delivered_once_per_txn_and_deleted_when_acknowledged(server, device):
    alice, bob = device("alice"), device("bob")
    first = sync(bob.client)
    content = {"action": "request", "request_id": "r1"}
    for _ in range(2):  # a retried request stores nothing twice
        send_to_device(alice, "txn1", {bob.user_id: {bob.device_id: content}})
    send_to_device(alice, "txn2", {bob.user_id: {"*": {"n": 2}}})
    assert count_rows(server, PENDING, (bob.user_id, bob.device_id)) == 2

    body = sync(bob.client, first["next_batch"])
    events = body["to_device"]["events"]
    assert events == [
        {"sender": alice.user_id, "type": "m.room_key_request", "content": content},
        {"sender": alice.user_id, "type": "m.room_key_request", "content": {"n": 2}},
    ]
    # Delivered but not acknowledged: a sync from the same token gets them again.
    assert sync(bob.client, first["next_batch"])["to_device"]["events"] == events
    assert count_rows(server, PENDING, (bob.user_id, bob.device_id)) == 2
    # The next since token acknowledges them: deleted, never sent again.
    after = sync(bob.client, body["next_batch"])
    assert after["to_device"]["events"] == []
    assert count_rows(server, PENDING, (bob.user_id, bob.device_id)) == 0


def test_to_device_wakes_a_parked_sync(server, device):
    alice, bob = device("alice"), device("bob")
    since = sync(bob.client)["next_batch"]
    waiting = gevent.spawn(sync, bob.client, since, 20000)
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)  # parked
    send_to_device(alice, "wake", {bob.user_id: {bob.device_id: {"hello": 1}}})
    body = waiting.get(timeout=25)
    assert body["to_device"]["events"][0]["content"] == {"hello": 1}


def test_sync_counts_one_time_keys_and_unused_fallback_types(server, device):
    alice, bob = device("alice"), device("bob")
    body = sync(alice.client)
    assert body["device_one_time_keys_count"] == {"signed_curve25519": 0}
    assert body["device_unused_fallback_key_types"] == []
    alice.upload(
        device_keys=alice.device_keys(),
        one_time_keys=alice.one_time_keys(2),
        fallback_keys=alice.one_time_keys(1, fallback=True),
    )
    body = sync(alice.client)
    assert body["device_one_time_keys_count"] == {"signed_curve25519": 2}
    assert body["device_unused_fallback_key_types"] == ["signed_curve25519"]
    claim = {"one_time_keys": {alice.user_id: {alice.device_id: "signed_curve25519"}}}
    for _ in range(3):
        assert bob.client.post(f"{V3}/keys/claim", json=claim).status_code == 200
    body = sync(alice.client)
    assert body["device_one_time_keys_count"] == {"signed_curve25519": 0}
    assert body["device_unused_fallback_key_types"] == []  # the fallback key was handed out


def test_a_key_change_wakes_room_members_and_shows_in_device_lists(server, device):
    alice, bob, stranger = device("alice"), device("bob"), device("stranger")
    room_id = create_room(alice.client, invite=[bob.user_id])
    assert bob.client.post(f"{V3}/join/{room_id}", json={}).status_code == 200
    bob_since = sync(bob.client)["next_batch"]
    stranger_since = sync(stranger.client)["next_batch"]

    waiting = gevent.spawn(sync, bob.client, bob_since, 20000)
    wait_until(lambda: metric(server, "weir_sync_waiters") == 1)
    assert alice.upload(device_keys=alice.device_keys()).status_code == 200
    body = waiting.get(timeout=25)
    assert body["device_lists"]["changed"] == [alice.user_id]
    # Someone who shares no room with alice is not told.
    assert sync(stranger.client, stranger_since)["device_lists"]["changed"] == []

    r = bob.client.get(f"{V3}/keys/changes", params={"from": bob_since, "to": body["next_batch"]})
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "get", "/_matrix/client/v3/keys/changes")
    assert r.json() == {"changed": [alice.user_id], "left": []}

    # Alice leaves: bob shares no room with her any more, so she is in `left`.
    assert alice.client.post(f"{V3}/rooms/{room_id}/leave", json={}).status_code == 200
    left = sync(bob.client, body["next_batch"])
    assert left["device_lists"]["left"] == [alice.user_id]
    assert alice.user_id not in left["device_lists"]["changed"]


def test_joining_a_room_lists_its_members_as_changed(server, device):
    alice, carol = device("alice"), device("carol")
    alice.upload(device_keys=alice.device_keys())
    room_id = create_room(alice.client, preset="public_chat")
    since = sync(carol.client)["next_batch"]
    assert carol.client.post(f"{V3}/join/{room_id}", json={}).status_code == 200
    body = sync(carol.client, since)
    assert alice.user_id in body["device_lists"]["changed"]
