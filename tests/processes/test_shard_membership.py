"""With worker shards, other servers' membership writes (send_join, invites) reach a shard,
and main checks and stores them, as it does relayed transactions: the join is in the room
for our clients, and the invite in our user's /sync."""

from urllib.parse import quote

import pytest

from tests.peers.origins import OriginKeyServer
from tests.rooms.test_federation_membership import alice_id, call, invite_pdu, join
from tests.support.remote_room import RemoteRoom
from tests.support.server import MatrixClient
from tests.support.shards import access_lines, sharded_settings, start_sharded
from tests.sync.conftest import sync

FED = "/_matrix/federation"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("shardmembers.test", test_ca, dns, host="127.62.5.2") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("shardmembers"))
    proc = start_sharded(directory, sharded_settings(test_ca, dns, directory, "127.62.5.1", 2))
    yield proc
    proc.stop()


def test_a_join_and_an_invite_through_a_shard_are_stored_by_main(weir, test_ca, keys):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    origin = keys.add_origin("s1")
    room = RemoteRoom.create(alice, room_version="10", name="Sharded")
    event_id, r = join(weir, test_ca, origin, room.room_id)
    assert r.status_code == 200, r.text
    assert r.json()["event"]["content"]["membership"] == "join"
    member = alice.get(
        f"/_matrix/client/v3/rooms/{quote(room.room_id, safe='')}/state/m.room.member/"
        + quote(origin.user("bob"), safe="")
    )
    assert member.status_code == 200 and member.json()["membership"] == "join"
    # A shard answered, and main did not serve the federation request itself.
    served = access_lines(weir, "/send_join/")
    assert served and all(label != "main" and status == "200" for label, status in served)

    invitee = alice_id(alice)
    far_room = f"!far:{origin.name}"
    invite_id, pdu = invite_pdu(origin, far_room, invitee)
    body = {"room_version": "10", "event": pdu, "invite_room_state": []}
    r = call(
        weir,
        test_ca,
        origin,
        "PUT",
        f"{FED}/v2/invite/{quote(far_room, safe='')}/{quote(invite_id, safe='')}",
        body,
    )
    assert r.status_code == 200, r.text
    assert far_room in sync(alice)["rooms"]["invite"]


def test_a_refusal_from_main_reaches_the_asking_server_whole(weir, test_ca, keys):
    origin = keys.add_origin("s2")
    far_room = f"!far2:{origin.name}"
    invite_id, pdu = invite_pdu(origin, far_room, "@nobody:weir.test")
    body = {"room_version": "10", "event": pdu, "invite_room_state": []}
    path = f"{FED}/v2/invite/{quote(far_room, safe='')}/{quote(invite_id, safe='')}"
    r = call(weir, test_ca, origin, "PUT", path, body)
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
