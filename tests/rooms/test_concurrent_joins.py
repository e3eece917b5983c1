"""Joins from many servers at once, a few in flight at a time, as a room fills up on the real
network: through make_join/send_join, and sent in transactions, each fork of joins resolved
(by the auth chain index, storage/auth_chains.py). Every member ends in the room's current
state, and that state is what the room's own resolver makes of its forward extremities."""

from urllib.parse import quote

import gevent
import pytest

from homeserver.rooms.events import add_hashes_and_signatures, event_id_for
from homeserver.rooms.resolution import RoomResolver
from homeserver.rooms.versions import ROOM_V10
from homeserver.storage.database import open_database
from homeserver.storage.rooms import RoomStore
from tests.peers.origins import OriginKeyServer, federation_request, send_transaction
from tests.support.federation import tls_weir
from tests.support.remote_room import RemoteRoom
from tests.support.server import MatrixClient

WEIR = "weir.test"
FED = "/_matrix/federation"
JOINERS = 40
AT_ONCE = 4


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("joiners.test", test_ca, dns, host="127.31.132.2") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("concurrent-joins"))
    # Forty servers join from one address: their keys are fetched at once.
    keys_rate = {"key_resolution_per_ip_rate": {"max_requests": 1000, "per_seconds": 60}}
    proc = tls_weir(
        test_ca,
        directory,
        "127.31.132.3",
        WEIR,
        dns,
        federation={"port": 0, "remote_timeout": 5},
        security={"federation": keys_rate},
    ).start()
    proc.database_url = f"sqlite:///{directory}/data/homeserver.db"
    yield proc
    proc.stop()


def q(value: str) -> str:
    return quote(value, safe="")


def join(weir, test_ca, origin, room_id: str) -> str:
    user = origin.user("m")
    path = f"{FED}/v1/make_join/{q(room_id)}/{q(user)}?ver=10"
    r = federation_request(weir.federation_url, origin, WEIR, "GET", path, test_ca)
    assert r.status_code == 200, r.text
    pdu = dict(r.json()["event"])
    add_hashes_and_signatures(ROOM_V10, pdu, origin.name, origin.signing_key)
    event_id = event_id_for(ROOM_V10, pdu)
    path = f"{FED}/v2/send_join/{q(room_id)}/{q(event_id)}"
    r = federation_request(weir.federation_url, origin, WEIR, "PUT", path, test_ca, body=pdu)
    assert r.status_code == 200, r.text
    return user


def test_joins_at_once_keep_every_member(weir, test_ca, keys):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    room = RemoteRoom.create(alice, room_version="10")
    origins = [keys.add_origin(f"j{i}") for i in range(JOINERS)]
    joined: list[str] = []
    for at in range(0, JOINERS, AT_ONCE):
        batch = [
            gevent.spawn(join, weir, test_ca, o, room.room_id) for o in origins[at : at + AT_ONCE]
        ]
        joined += [job.get(timeout=60) for job in batch]
    assert_every_member_and_resolved(weir, room, joined)


def test_joins_sent_at_once_in_transactions_keep_every_member(weir, test_ca, keys):
    """Each batch of joins is built on one tip and sent by its servers at once, each in a
    transaction of its own: forks of joins, every one resolved against the others."""
    alice = MatrixClient(weir.client_url)
    alice.register("alice-txn")
    room = RemoteRoom.create(alice, room_version="10")
    origins = [keys.add_origin(f"t{i}") for i in range(JOINERS)]

    def send(origin, pdu) -> None:
        r = send_transaction(
            weir.federation_url, origin, WEIR, f"join-{origin.name}", [pdu], test_ca
        )
        assert r.status_code == 200 and r.json()["pdus"] == {event_id_for(ROOM_V10, pdu): {}}, (
            r.text
        )

    for at in range(0, JOINERS, AT_ONCE):
        tip = room.latest_event_id()
        batch = [(o, room.join_pdu(o, "m", prev=tip)[1]) for o in origins[at : at + AT_ONCE]]
        for job in [gevent.spawn(send, o, pdu) for o, pdu in batch]:
            job.get(timeout=60)
    assert_every_member_and_resolved(weir, room, [o.user("m") for o in origins])


def assert_every_member_and_resolved(weir, room: RemoteRoom, joined: list[str]) -> None:
    state = room.state_ids()
    missing = [u for u in joined if ("m.room.member", u) not in state]
    assert not missing, f"{len(missing)} of {len(joined)} joins left out of the room's state"
    # And the state is what the room's resolver makes of its forward extremities, read
    # from the database the server wrote.
    db = open_database(weir.database_url)
    try:
        store = RoomStore(db)
        resolver = RoomResolver(store, ROOM_V10, room.room_id)
        extremities = [e.event_id for e in store.forward_extremities(room.room_id)]
        assert resolver.resolve(resolver.state_after(extremities)) == state
    finally:
        db.close()
