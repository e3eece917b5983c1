"""Redactions received over federation (PUT /send from fake origins) on the real server:
applied by the spec's rule for room versions 3 and later (the `redact` level, or the same
server as the target's sender), applied when the target arrives after its redaction, and
served redacted to other servers (federation /event) with hashes and signatures kept."""

import os
import re
from urllib.parse import quote

import gevent
import pytest
import requests
from signedjson.key import get_verify_key
from signedjson.sign import verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.rooms.events import compute_content_hash, event_id_for, redact
from homeserver.rooms.versions import ROOM_V11
from tests.peers.origins import OriginKeyServer, federation_request, send_transaction
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.remote_room import RemoteRoom
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("redact-origins.test", test_ca, dns, host="127.31.108.2") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("redact-received"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.31.108.3", port=0))
    proc = WeirProcess(
        directory, merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    ).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


@pytest.fixture(scope="module")
def origin(keys):
    return keys.add_origin("r1")


def send(weir, test_ca, origin, txn_id, pdus):
    r = send_transaction(weir.federation_url, origin, "weir.test", txn_id, pdus, test_ca)
    assert r.status_code == 200, r.text
    return r.json()["pdus"]


def joined_v11_room(weir, test_ca, alice, origin) -> tuple[RemoteRoom, str]:
    """A room of alice's (version 11, where `redacts` is in content) that bob of `origin`
    joined."""
    room = RemoteRoom.create(alice, room_version="11")
    join_id, join = room.join_pdu(origin, "bob")
    assert send(weir, test_ca, origin, f"join-{room.room_id}", [join]) == {join_id: {}}
    return room, join_id


def redaction_pdu(room, origin, localpart: str, target: str, prev: str) -> tuple[str, dict]:
    user = origin.user(localpart)
    return origin.pdu(
        room.room_id,
        user,
        "m.room.redaction",
        {"redacts": target, "reason": "spam"},
        prev_events=[prev],
        auth_events=room.auth_for(user),
        depth=room._next_depth(),
        version=ROOM_V11,
    )


def client_event(alice, room_id: str, event_id: str) -> dict:
    r = alice.get(f"{V3}/rooms/{quote(room_id, safe='')}/event/{quote(event_id, safe='')}")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_remote_users_redaction_of_their_own_event_applies(weir, test_ca, alice, origin):
    room, join_id = joined_v11_room(weir, test_ca, alice, origin)
    (target,), pdus = room.messages(origin, "bob", ["oops"], prev=join_id)
    redaction_id, redaction = redaction_pdu(room, origin, "bob", target, prev=target)
    assert send(weir, test_ca, origin, "own", [*pdus, redaction]) == {
        target: {},
        redaction_id: {},
    }
    event = client_event(alice, room.room_id, target)
    assert event["content"] == {}
    assert event["unsigned"]["redacted_because"]["event_id"] == redaction_id
    assert event["unsigned"]["redacted_because"]["redacts"] == target

    # Other servers get the redacted PDU: the hashes and signatures it was sent with, which
    # still verify against the redacted form; the content hash no longer matches.
    r = federation_request(
        weir.federation_url,
        origin,
        "weir.test",
        "GET",
        f"/_matrix/federation/v1/event/{quote(target, safe='')}",
        test_ca,
    )
    assert r.status_code == 200, r.text
    (served,) = r.json()["pdus"]
    assert served == redact(ROOM_V11, pdus[0])
    assert served["signatures"] == pdus[0]["signatures"]
    assert event_id_for(ROOM_V11, served) == target
    verify_signed_json(served, origin.name, get_verify_key(origin.signing_key))
    assert decode_base64(served["hashes"]["sha256"]) != compute_content_hash(served)


def test_a_redaction_that_arrives_before_its_target_applies_when_it_does(
    weir, test_ca, alice, origin
):
    room, join_id = joined_v11_room(weir, test_ca, alice, origin)
    (target,), pdus = room.messages(origin, "bob", ["too early"], prev=join_id)
    redaction_id, redaction = redaction_pdu(room, origin, "bob", target, prev=join_id)
    assert send(weir, test_ca, origin, "early-1", [redaction]) == {redaction_id: {}}
    # A sync parked before the target arrives is woken by it, and answers from the event as
    # stored (homeserver/sync/woken.py): redacted, never the content it came with.
    since = alice.get(f"{V3}/sync", params={"timeout": 0}).json()["next_batch"]
    waiters = waiters_metric(weir)
    parked = gevent.spawn(
        alice.get, f"{V3}/sync", params={"since": since, "timeout": 30000}, timeout=60
    )
    with gevent.Timeout(10):
        while waiters_metric(weir) == waiters:
            gevent.sleep(0.01)
    assert send(weir, test_ca, origin, "early-2", pdus) == {target: {}}
    woken = parked.get(timeout=30).json()
    (event,) = woken["rooms"]["join"][room.room_id]["timeline"]["events"]
    assert event["event_id"] == target and event["content"] == {}
    assert event["unsigned"]["redacted_because"]["event_id"] == redaction_id
    event = client_event(alice, room.room_id, target)
    assert event["content"] == {}
    assert event["unsigned"]["redacted_because"]["event_id"] == redaction_id


def waiters_metric(weir) -> float:
    text = requests.get(weir.url("/metrics"), timeout=10).text
    return float(re.search(r"^weir_sync_waiters (\S+)$", text, re.M).group(1))


def test_a_remote_user_without_the_redact_level_cannot_redact_ours(weir, test_ca, alice, origin):
    room, join_id = joined_v11_room(weir, test_ca, alice, origin)
    r = alice.put(
        f"{V3}/rooms/{quote(room.room_id, safe='')}/send/m.room.message/keep",
        json={"msgtype": "m.text", "body": "mine"},
    )
    ours = r.json()["event_id"]
    # The auth rules let bob send a redaction (level 0); it is stored, and does not apply.
    redaction_id, redaction = redaction_pdu(room, origin, "bob", ours, prev=ours)
    assert send(weir, test_ca, origin, "not-yours", [redaction]) == {redaction_id: {}}
    assert client_event(alice, room.room_id, ours)["content"]["body"] == "mine"
