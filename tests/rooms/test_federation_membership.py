"""Membership asked for by other servers, and what they may read, against the real server:
fake origins (keys served by a real TLS key server) sign make_*/send_*, invites and reads.
Each test asserts what the origin was answered and what the server stored or shows its
clients."""

import os
import sqlite3
from urllib.parse import quote, urlencode

import pytest
import requests
from signedjson.key import decode_verify_key_bytes
from signedjson.sign import verify_signed_json
from unpaddedbase64 import decode_base64

from homeserver.rooms.events import add_hashes_and_signatures, event_id_for, redact
from homeserver.rooms.versions import ROOM_V10
from tests.peers.origins import FakeOrigin, OriginKeyServer, federation_request
from tests.rooms.conftest import stored_pdus
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.remote_room import RemoteRoom
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec
from tests.sync.conftest import sync

FED = "/_matrix/federation"
# The versions our fake servers say they support in make_join. The rooms here are version 10,
# as the events built by hand below are; version 12's joins are in test_membership_synapse.
SUPPORTED = ["10", "11", "12"]
WEIR = "weir.test"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("members.test", test_ca, dns, host="127.62.0.2") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("fedmember"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, WEIR, "127.62.0.1", port=0))
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    proc = WeirProcess(directory, settings).start()
    proc.database_url = f"sqlite:///{directory}/data/homeserver.db"
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def call(weir, test_ca, origin, method, path, body=None, **query):
    uri = path + (("?" + urlencode(query, doseq=True)) if query else "")
    return federation_request(weir.federation_url, origin, WEIR, method, uri, test_ca, body)


def q(value: str) -> str:
    return quote(value, safe="")


def join(weir, test_ca, origin, room_id, localpart="bob"):
    """make_join then send_join as @localpart:origin; returns (event_id, send_join response)."""
    user = origin.user(localpart)
    r = call(
        weir, test_ca, origin, "GET", f"{FED}/v1/make_join/{q(room_id)}/{q(user)}", ver=SUPPORTED
    )
    assert r.status_code == 200, r.text
    assert_matches_spec(
        r, "get", "/_matrix/federation/v1/make_join/{roomId}/{userId}", "server-server"
    )
    event_id, pdu = sign(origin, r.json()["event"])
    r = call(weir, test_ca, origin, "PUT", f"{FED}/v2/send_join/{q(room_id)}/{q(event_id)}", pdu)
    return event_id, r


def sign(origin: FakeOrigin, template: dict) -> tuple[str, dict]:
    pdu = dict(template)
    add_hashes_and_signatures(ROOM_V10, pdu, origin.name, origin.signing_key)
    return event_id_for(ROOM_V10, pdu), pdu


def outbox(weir) -> list[tuple[str, str]]:
    path = weir.database_url[len("sqlite:///") :]
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT destination, event_id FROM federation_outbox").fetchall()
    finally:
        conn.close()


def our_verify_key(weir, test_ca):
    doc = requests.get(
        weir.federation_url + "/_matrix/key/v2/server", verify=test_ca.ca_path, timeout=10
    ).json()
    key_id, key = next(iter(doc["verify_keys"].items()))
    return decode_verify_key_bytes(key_id, decode_base64(key["key"]))


def test_a_remote_user_joins_through_make_and_send_join(weir, test_ca, keys, alice):
    o1, o2 = keys.add_origin("j1"), keys.add_origin("j2")
    room = RemoteRoom.create(alice, room_version="10", name="Lobby")
    event_id, r = join(weir, test_ca, o1, room.room_id)
    assert r.status_code == 200, r.text
    assert_matches_spec(
        r, "put", "/_matrix/federation/v2/send_join/{roomId}/{eventId}", "server-server"
    )
    body = r.json()
    state_types = {(e["type"], e["state_key"]) for e in body["state"]}
    assert {
        ("m.room.create", ""),
        ("m.room.name", ""),
        ("m.room.member", alice_id(alice)),
    } <= state_types
    assert ("m.room.member", o1.user("bob")) not in state_types  # the state before the join
    # Ours first, then the others, the joining server among them (as Synapse answers).
    assert body["servers_in_room"] == [WEIR, o1.name] and body["members_omitted"] is False
    chain_ids = {event_id_for(ROOM_V10, e) for e in body["auth_chain"]}
    assert room.state_ids()[("m.room.create", "")] in chain_ids
    # Stored, in the room's state as its clients see it.
    assert room.state_ids()[("m.room.member", o1.user("bob"))] == event_id
    assert event_id in [e for e, _ in stored_pdus(weir, room.room_id)]
    # o2 joins next: its join is queued for o1 (in the room), never for o2 or ourselves.
    event_id2, r = join(weir, test_ca, o2, room.room_id)
    assert r.status_code == 200, r.text
    assert r.json()["servers_in_room"] == [WEIR, *sorted([o1.name, o2.name])]
    queued = [d for d, e in outbox(weir) if e == event_id2]
    assert queued == [o1.name]


def alice_id(alice) -> str:
    return alice.get("/_matrix/client/v3/account/whoami").json()["user_id"]


def test_make_join_refuses_what_it_must(weir, test_ca, keys, alice):
    o1 = keys.add_origin("m1")
    room = RemoteRoom.create(alice, room_version="10")
    path = f"{FED}/v1/make_join/{q(room.room_id)}/{q(o1.user('bob'))}"
    r = call(weir, test_ca, o1, "GET", path, ver=["1", "2"])
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INCOMPATIBLE_ROOM_VERSION")
    assert r.json()["room_version"] == "10"
    r = call(weir, test_ca, o1, "GET", path)  # no ver: version 1 only, per the spec
    assert r.json()["errcode"] == "M_INCOMPATIBLE_ROOM_VERSION"
    other = f"{FED}/v1/make_join/{q(room.room_id)}/{q('@bob:elsewhere.test')}"
    r = call(weir, test_ca, o1, "GET", other, ver=SUPPORTED)
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    unknown = f"{FED}/v1/make_join/{q('!nope:weir.test')}/{q(o1.user('bob'))}"
    r = call(weir, test_ca, o1, "GET", unknown, ver=SUPPORTED)
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    private = RemoteRoom.create(alice, room_version="10", preset="private_chat")
    path = f"{FED}/v1/make_join/{q(private.room_id)}/{q(o1.user('bob'))}"
    r = call(weir, test_ca, o1, "GET", path, ver=SUPPORTED)
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")


def test_a_forged_or_mismatched_send_join_stores_nothing(weir, test_ca, keys, alice):
    o1 = keys.add_origin("f1")
    room = RemoteRoom.create(alice, room_version="10")
    user = o1.user("bob")
    r = call(
        weir, test_ca, o1, "GET", f"{FED}/v1/make_join/{q(room.room_id)}/{q(user)}", ver=SUPPORTED
    )
    template = r.json()["event"]
    # Signed by a key that is not the origin's.
    impostor = FakeOrigin(o1.name, "o1")
    event_id, pdu = sign(impostor, template)
    r = call(weir, test_ca, o1, "PUT", f"{FED}/v2/send_join/{q(room.room_id)}/{q(event_id)}", pdu)
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN"), r.text
    # Signed well, but sent under another event ID.
    event_id, pdu = sign(o1, template)
    r = call(weir, test_ca, o1, "PUT", f"{FED}/v2/send_join/{q(room.room_id)}/$other", pdu)
    assert (r.status_code, r.json()["errcode"]) == (400, "M_BAD_JSON")
    # A content changed after signing (the hash no longer matches).
    tampered = dict(pdu, content={"membership": "join", "displayname": "x"})
    tampered_id = event_id_for(ROOM_V10, tampered)
    r = call(
        weir, test_ca, o1, "PUT", f"{FED}/v2/send_join/{q(room.room_id)}/{q(tampered_id)}", tampered
    )
    assert r.status_code in (400, 403), r.text
    assert ("m.room.member", user) not in room.state_ids()
    assert outbox(weir) == [] or all(e not in (event_id, tampered_id) for _, e in outbox(weir))
    stored = [e for e, _ in stored_pdus(weir, room.room_id)]
    assert event_id not in stored and tampered_id not in stored


def test_a_remote_user_leaves_and_knocks(weir, test_ca, keys, alice):
    o1 = keys.add_origin("l1")
    room = RemoteRoom.create(alice, room_version="10")
    _, r = join(weir, test_ca, o1, room.room_id)
    assert r.status_code == 200, r.text
    user = o1.user("bob")
    r = call(weir, test_ca, o1, "GET", f"{FED}/v1/make_leave/{q(room.room_id)}/{q(user)}")
    assert r.status_code == 200, r.text
    event_id, pdu = sign(o1, r.json()["event"])
    r = call(weir, test_ca, o1, "PUT", f"{FED}/v2/send_leave/{q(room.room_id)}/{q(event_id)}", pdu)
    assert (r.status_code, r.json()) == (200, {}), r.text
    assert room.state_ids()[("m.room.member", user)] == event_id
    # A knock on a room whose join rule is knock.
    knock_room = RemoteRoom.create(alice, room_version="10", preset="private_chat", name="Door")
    r = alice.put(
        f"/_matrix/client/v3/rooms/{q(knock_room.room_id)}/state/m.room.join_rules/",
        json={"join_rule": "knock"},
    )
    assert r.status_code == 200, r.text
    path = f"{FED}/v1/make_knock/{q(knock_room.room_id)}/{q(user)}"
    assert call(weir, test_ca, o1, "GET", path).json()["errcode"] == "M_MISSING_PARAM"
    r = call(weir, test_ca, o1, "GET", path, ver=SUPPORTED)
    assert r.status_code == 200, r.text
    event_id, pdu = sign(o1, r.json()["event"])
    r = call(
        weir, test_ca, o1, "PUT", f"{FED}/v1/send_knock/{q(knock_room.room_id)}/{q(event_id)}", pdu
    )
    assert r.status_code == 200, r.text
    assert {"type": "m.room.name", "state_key": ""}.items() <= next(
        e for e in r.json()["knock_room_state"] if e["type"] == "m.room.name"
    ).items()
    assert knock_room.state_ids()[("m.room.member", user)] == event_id


def invite_pdu(origin, room_id, invitee, depth=5):
    """An invite as Synapse sends one: with the top-level `origin` the spec lists."""
    pdu = {
        "room_id": room_id,
        "sender": origin.user("carol"),
        "type": "m.room.member",
        "state_key": invitee,
        "content": {"membership": "invite"},
        "prev_events": ["$prev"],
        "auth_events": ["$create"],
        "depth": depth,
        "origin": origin.name,
        "origin_server_ts": 1_700_000_000_000,
    }
    return sign(origin, pdu)


def test_an_invite_from_another_server_shows_in_sync_and_survives_restart(
    weir, test_ca, keys, alice
):
    o1 = keys.add_origin("i1")
    invitee = alice_id(alice)
    room_id = f"!remote:{o1.name}"
    event_id, pdu = invite_pdu(o1, room_id, invitee)
    stripped = [
        {
            "type": "m.room.name",
            "state_key": "",
            "sender": o1.user("carol"),
            "content": {"name": "Far"},
        },
        {
            "type": "m.room.join_rules",
            "state_key": "",
            "sender": o1.user("carol"),
            "content": {"join_rule": "invite"},
        },
    ]
    body = {"room_version": "10", "event": pdu, "invite_room_state": stripped}
    before = sync(alice)["next_batch"]
    r = call(weir, test_ca, o1, "PUT", f"{FED}/v2/invite/{q(room_id)}/{q(event_id)}", body)
    assert r.status_code == 200, r.text
    assert_matches_spec(
        r, "put", "/_matrix/federation/v2/invite/{roomId}/{eventId}", "server-server"
    )
    signed = r.json()["event"]
    verify_signed_json(redact(ROOM_V10, signed), WEIR, our_verify_key(weir, test_ca))
    assert signed["signatures"][o1.name] == pdu["signatures"][o1.name]

    def invite_state():
        return sync(alice)["rooms"]["invite"][room_id]["invite_state"]["events"]

    events = invite_state()
    assert events[:2] == stripped
    assert events[-1] == {
        "type": "m.room.member",
        "state_key": invitee,
        "sender": o1.user("carol"),
        "content": {"membership": "invite"},
    }
    # Incrementally: shown once after the token it came after.
    assert room_id in sync(alice, since=before)["rooms"]["invite"]
    weir.stop()
    weir.start()
    alice.base_url = weir.client_url  # the same data, listeners on new ports
    assert invite_state()[:2] == stripped


def test_invites_that_are_refused(weir, test_ca, keys, alice):
    o1 = keys.add_origin("i2")
    room_id = f"!remote2:{o1.name}"
    event_id, pdu = invite_pdu(o1, room_id, f"@nobody:{WEIR}")
    r = call(
        weir,
        test_ca,
        o1,
        "PUT",
        f"{FED}/v2/invite/{q(room_id)}/{q(event_id)}",
        {"room_version": "10", "event": pdu},
    )
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    r = call(
        weir,
        test_ca,
        o1,
        "PUT",
        f"{FED}/v2/invite/{q(room_id)}/{q(event_id)}",
        {"room_version": "999", "event": pdu},
    )
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INCOMPATIBLE_ROOM_VERSION")
    assert r.json()["room_version"] == "999"
    # An invite whose sender is not of the requesting server.
    o2 = keys.add_origin("i3")
    event_id, pdu = invite_pdu(o1, room_id, alice_id(alice))
    r = call(
        weir,
        test_ca,
        o2,
        "PUT",
        f"{FED}/v2/invite/{q(room_id)}/{q(event_id)}",
        {"room_version": "10", "event": pdu},
    )
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")
    assert room_id not in sync(alice)["rooms"]["invite"]


def test_reads_are_for_servers_in_the_room(weir, test_ca, keys, alice):
    member, stranger = keys.add_origin("r1"), keys.add_origin("r2")
    room = RemoteRoom.create(alice, room_version="10")
    join_id, r = join(weir, test_ca, member, room.room_id)
    assert r.status_code == 200, r.text
    for i in range(5):
        alice.put(
            f"/_matrix/client/v3/rooms/{q(room.room_id)}/send/m.room.message/r{i}",
            json={"msgtype": "m.text", "body": f"m{i}"},
        )
    latest = room.latest_event_id()
    rid = q(room.room_id)
    r = call(weir, test_ca, member, "GET", f"{FED}/v1/state_ids/{rid}", event_id=latest)
    assert r.status_code == 200, r.text
    assert join_id in r.json()["pdu_ids"]
    assert room.state_ids()[("m.room.create", "")] in r.json()["auth_chain_ids"]
    r = call(weir, test_ca, member, "GET", f"{FED}/v1/state/{rid}", event_id=latest)
    assert len(r.json()["pdus"]) == len(room.state_ids())
    r = call(weir, test_ca, member, "GET", f"{FED}/v1/event/{q(latest)}")
    assert r.status_code == 200 and event_id_for(ROOM_V10, r.json()["pdus"][0]) == latest
    r = call(weir, test_ca, member, "GET", f"{FED}/v1/event_auth/{rid}/{q(join_id)}")
    assert room.state_ids()[("m.room.create", "")] in {
        event_id_for(ROOM_V10, e) for e in r.json()["auth_chain"]
    }
    r = call(weir, test_ca, member, "GET", f"{FED}/v1/backfill/{rid}", v=[latest], limit=3)
    got = [event_id_for(ROOM_V10, e) for e in r.json()["pdus"]]
    assert len(got) == 3 and got[0] == latest
    r = call(
        weir,
        test_ca,
        member,
        "POST",
        f"{FED}/v1/get_missing_events/{rid}",
        {"earliest_events": [join_id], "latest_events": [latest], "limit": 1000},
    )
    bodies = [e["content"].get("body") for e in r.json()["events"]]
    assert bodies == ["m0", "m1", "m2", "m3"]  # between the two, oldest first
    # A server with nobody in the room reads nothing of it.
    for method, path, extra, body in [
        ("GET", f"{FED}/v1/state_ids/{rid}", {"event_id": latest}, None),
        ("GET", f"{FED}/v1/state/{rid}", {"event_id": latest}, None),
        ("GET", f"{FED}/v1/event_auth/{rid}/{q(join_id)}", {}, None),
        ("GET", f"{FED}/v1/backfill/{rid}", {"v": latest, "limit": 10}, None),
        (
            "POST",
            f"{FED}/v1/get_missing_events/{rid}",
            {},
            {"earliest_events": [], "latest_events": [latest]},
        ),
    ]:
        r = call(weir, test_ca, stranger, method, path, body, **extra)
        assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN"), path
    r = call(weir, test_ca, stranger, "GET", f"{FED}/v1/event/{q(latest)}")
    assert r.status_code == 403
