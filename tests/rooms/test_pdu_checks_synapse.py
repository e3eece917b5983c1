"""Our checks on received PDUs against events a real Synapse made: its event IDs, format,
content hashes and signatures must all pass, and a tampered copy must not. (Our own tests
build PDUs with our own code; this catches a mistake made the same way on both sides.)

A fake server (its key served by an honest peer) joins a room Synapse created, through
make_join and send_join: Synapse accepts a join our code hashed, signed and named, and
answers with the room's state and auth chain. Our PDU checker then verifies those events
with Synapse's key, fetched by our keyring.
"""

import copy
from urllib.parse import quote

import pytest
import requests

from homeserver.config import parse_config
from homeserver.core.events import Event
from homeserver.rooms.auth import auth_event_ids_to_check, check_auth_events
from homeserver.rooms.events import (
    add_hashes_and_signatures,
    check_pdu_format,
    event_id_for,
    room_id_of,
)
from homeserver.rooms.pdu_checks import CheckedPdu
from homeserver.rooms.versions import KNOWN_ROOM_VERSIONS
from homeserver.runtime import HomeserverRuntime
from tests.peers.honest import HonestPeer
from tests.support.federation import federation_settings, make_client

pytestmark = pytest.mark.synapse

PEER_IP = "127.30.2.1"
# Another server for the v12 room: each peer has a fresh key, and Synapse caches the first.
PEER_IP_V12 = "127.30.2.12"


@pytest.fixture(scope="module")
def synapse_events(synapse, test_ca):
    """The PDUs of a room Synapse created (room version 10), as Synapse serves them over
    federation to a server that joined it, and the room version."""
    pdus, version, _ = synapse_room(synapse, test_ca, "10", "pdus", PEER_IP)
    return pdus, version


@pytest.fixture(scope="module")
def synapse_v12_events(synapse, test_ca):
    """The same for a room version 12 room, with the room ID Synapse gave it."""
    return synapse_room(synapse, test_ca, "12", "pdus12", PEER_IP_V12)


def synapse_room(synapse, test_ca, room_version: str, username: str, peer_ip: str):
    token = synapse.register(username)["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    r = requests.post(
        f"{synapse.client_url}/_matrix/client/v3/createRoom",
        headers=headers,
        json={"preset": "public_chat", "room_version": room_version},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    room_id = r.json()["room_id"]
    r = requests.put(
        f"{synapse.client_url}/_matrix/client/v3/rooms/{quote(room_id, safe='')}"
        "/send/m.room.message/1",
        headers=headers,
        timeout=60,
        json={"msgtype": "m.text", "body": "hello from synapse"},
    )
    assert r.status_code == 200, r.text
    message_id = r.json()["event_id"]

    # A server of ours (its key served by the peer) joins the room the federation way: its
    # join, hashed, signed and named by our code, must satisfy Synapse, which answers with
    # the room's state and auth chain: PDUs Synapse signed.
    with (
        HonestPeer(f"{peer_ip}:8448", test_ca, host=peer_ip, port=8448) as peer,
        make_client(test_ca, server_name=peer.server_name, signing_key=peer.signing_key) as client,
    ):
        user = f"@visitor:{peer.server_name}"
        room = quote(room_id, safe="")
        template = client.get_json(
            synapse.server_name,
            f"/_matrix/federation/v1/make_join/{room}/{quote(user)}",
            {"ver": [room_version]},
        )
        version = KNOWN_ROOM_VERSIONS[template["room_version"]]
        join = template["event"]
        add_hashes_and_signatures(version, join, peer.server_name, peer.signing_key)
        join_id = event_id_for(version, join)
        answer = client.put_json(
            synapse.server_name, f"/_matrix/federation/v2/send_join/{room}/{quote(join_id)}", join
        )
        pdus = {event_id_for(version, p): p for p in answer["state"] + answer["auth_chain"]}
        # Synapse took our join in: it now serves the room's events to our server.
        (pdus[message_id],) = client.get_json(
            synapse.server_name, f"/_matrix/federation/v1/event/{quote(message_id)}"
        )["pdus"]
    return pdus, version, room_id


@pytest.fixture
def checker(tmp_path, test_ca):
    rt = HomeserverRuntime(
        parse_config(
            {
                "server_name": "weir.test",
                "data_dir": str(tmp_path),
                "database": {"url": f"sqlite:///{tmp_path}/homeserver.db"},
                "federation": federation_settings(test_ca),
            }
        )
    )
    yield rt.inbound_transactions.checker
    rt.close()


def test_synapse_pdus_pass_our_checks(synapse_events, checker, synapse):
    pdus, version = synapse_events
    assert len(pdus) >= 6  # create, join, power levels, join rules, ..., the message
    for event_id, pdu in pdus.items():
        assert event_id_for(version, pdu) == event_id
        check_pdu_format(version, Event(event_id, pdu))
        checked = checker.verify(CheckedPdu(event_id, pdu, version), "192.0.2.1")
        assert checked.error is None, (event_id, checked.error)
        assert checked.signed_by == {synapse.server_name}
        # The hash matched: the event is kept whole, not redacted.
        assert checked.event.pdu == {k: v for k, v in pdu.items() if k != "unsigned"}
    assert checker.keyring.network_fetches == 1  # Synapse's key, once


def test_tampered_synapse_pdus_fail_our_checks(synapse_events, checker):
    pdus, version = synapse_events
    event_id, message = next((i, p) for i, p in pdus.items() if p["type"] == "m.room.message")
    # Content outside what redaction keeps: the signature still holds, the hash does not,
    # so the event is kept redacted (spec: "Passes hash checks, otherwise it is redacted").
    tampered = copy.deepcopy(message)
    tampered["content"]["body"] = "not what synapse said"
    checked = checker.verify(CheckedPdu(event_id, tampered, version), None)
    assert checked.error is None and checked.event.pdu["content"] == {}
    # What the signature covers: dropped.
    forged = copy.deepcopy(message)
    forged["origin_server_ts"] += 1
    checked = checker.verify(CheckedPdu(event_id_for(version, forged), forged, version), None)
    assert "signature" in checked.error


def test_synapse_v12_room_ids_and_events_pass_our_checks(synapse_v12_events, checker, synapse):
    """Synapse 1.163's v12 room: we derive the same room ID from its create event, the same
    event IDs, accept every event's format, signature and hash, and its auth rules."""
    pdus, version, room_id = synapse_v12_events
    assert version.identifier == "12" and len(pdus) >= 6
    (create_id, create) = next((i, p) for i, p in pdus.items() if p["type"] == "m.room.create")
    assert "room_id" not in create
    assert room_id_of(version, create) == room_id == "!" + create_id[1:]
    events = {}
    for event_id, pdu in pdus.items():
        assert event_id_for(version, pdu) == event_id
        check_pdu_format(version, Event(event_id, pdu))
        assert room_id_of(version, pdu) == room_id
        checked = checker.verify(CheckedPdu(event_id, pdu, version), "192.0.2.1")
        assert checked.error is None, (event_id, checked.error)
        assert checked.signed_by == {synapse.server_name}
        events[event_id] = checked.event
    # Every event passes our v12 auth rules against its auth events, the create event among
    # them only through the room ID.
    for event in events.values():
        assert create_id not in event.auth_event_ids
        check_auth_events(
            version, event, [events[i] for i in auth_event_ids_to_check(version, event)]
        )
