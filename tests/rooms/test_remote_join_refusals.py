"""Remote joins that must fail, and fail cleanly: a resident server whose send_join answer
holds a forged state event or a bad signature is refused and nothing of the room is stored;
a join, a knock, or a createRoom inviting a user of a server that never answers ends at its
deadline with 504, its slot freed."""

import glob
import os
import sqlite3
from urllib.parse import quote

import pytest

from tests.peers.resident import ResidentPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import tls_weir
from tests.support.metrics import in_flight, metric
from tests.support.server import MatrixClient

WEIR_IP = "127.40.15.11"
RESIDENT_IP = "127.40.15.12"
TARPIT_IP = "127.40.15.13"
INVITE_TARPIT_IP = "127.40.15.14"  # its own: the join test leaves TARPIT_IP cooling down
KNOCK_TARPIT_IP = "127.40.15.15"  # and this one, for the same reason
V3 = "/_matrix/client/v3"


@pytest.fixture(scope="module")
def resident(test_ca):
    peer = ResidentPeer(test_ca, host=RESIDENT_IP).start()
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def weir(test_ca, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-bad-joins"))
    # Short deadlines, so the tarpit cases end quickly.
    fed = {"remote_timeout": 3, "joins": {"deadline": 3}}
    proc = tls_weir(test_ca, directory, WEIR_IP, f"{WEIR_IP}:8448", federation=fed)
    with proc:
        yield proc


@pytest.fixture(scope="module")
def alice(weir):
    user = MatrixClient(weir.client_url)
    user.register("badjoinalice")
    return user


def _stored_events(weir, room_id: str) -> int:
    """Events of the room in the server's own database file, read directly."""
    (path,) = glob.glob(os.path.join(weir.directory, "**", "homeserver.db"), recursive=True)
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM events WHERE room_id = ?", (room_id,)).fetchone()[0]


@pytest.mark.parametrize("lie", ["forged_state", "bad_signature"])
def test_a_lying_send_join_answer_is_refused_and_nothing_stored(weir, alice, resident, lie):
    resident.lie = lie
    sent_before = resident.send_joins()
    r = alice.post(f"{V3}/join/{quote(resident.room_id)}", json={})
    assert (r.status_code, r.json()["errcode"]) == (502, "M_UNKNOWN"), r.text
    # The answer was had and read: the refusal is ours, not a failure to reach the peer.
    assert resident.send_joins() == sent_before + 1
    assert resident.room_id not in alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]
    state = alice.get(f"{V3}/rooms/{quote(resident.room_id)}/state")
    assert state.status_code in (403, 404), state.text
    assert _stored_events(weir, resident.room_id) == 0
    assert in_flight(weir.client_url, "client_outbound") == 0


def test_an_honest_resident_is_joined(weir, alice, resident):
    resident.lie = None
    r = alice.post(f"{V3}/join/{quote(resident.room_id)}", json={})
    assert r.status_code == 200, r.text
    name = alice.get(f"{V3}/rooms/{quote(resident.room_id)}/state/m.room.name")
    assert name.json() == {"name": "Resident"}
    # The room's five events and our join.
    assert _stored_events(weir, resident.room_id) == 6
    assert metric(weir.client_url, "weir_send_join_duration_seconds_count", outcome="ok") >= 1


def test_a_join_through_a_tarpit_ends_at_its_deadline_and_frees_its_slot(weir, alice):
    with Tarpit(host=TARPIT_IP, port=8448) as tarpit:
        room_id = f"!stuck:{TARPIT_IP}:8448"
        r = alice.post(f"{V3}/join/{quote(room_id)}", json={}, timeout=30)
        assert (r.status_code, r.json()["errcode"]) == (504, "M_UNKNOWN"), r.text
        assert tarpit.accepted >= 1
    assert in_flight(weir.client_url, "client_outbound") == 0
    assert (
        metric(weir.client_url, "weir_outbound_calls_total", call="join", outcome="deadline") == 1
    )
    assert _stored_events(weir, room_id) == 0


def test_create_room_inviting_a_tarpit_user_ends_at_its_deadline_and_frees_its_slot(weir, alice):
    rooms_before = set(alice.get(f"{V3}/joined_rooms").json()["joined_rooms"])
    with Tarpit(host=INVITE_TARPIT_IP, port=8448) as tarpit:
        invitee = f"@stuck:{INVITE_TARPIT_IP}:8448"
        r = alice.post(f"{V3}/createRoom", json={"invite": [invitee]}, timeout=30)
        assert (r.status_code, r.json()["errcode"]) == (504, "M_UNKNOWN"), r.text
        assert tarpit.accepted >= 1
    assert in_flight(weir.client_url, "client_outbound") == 0
    assert (
        metric(weir.client_url, "weir_outbound_calls_total", call="invite", outcome="deadline") == 1
    )
    # As with Synapse, the room was made before the invite failed: its creator is in it,
    # and the invitee is not invited.
    (room_id,) = set(alice.get(f"{V3}/joined_rooms").json()["joined_rooms"]) - rooms_before
    member = alice.get(f"{V3}/rooms/{quote(room_id)}/state/m.room.member/{quote(invitee)}")
    assert member.status_code == 404, member.text


def test_a_knock_through_a_tarpit_ends_at_its_deadline_and_frees_its_slot(weir, alice):
    with Tarpit(host=KNOCK_TARPIT_IP, port=8448) as tarpit:
        room_id = f"!door:{KNOCK_TARPIT_IP}:8448"
        r = alice.post(
            f"{V3}/knock/{quote(room_id)}",
            params={"via": f"{KNOCK_TARPIT_IP}:8448"},
            json={},
            timeout=30,
        )
        assert (r.status_code, r.json()["errcode"]) == (504, "M_UNKNOWN"), r.text
        assert tarpit.accepted >= 1
    assert in_flight(weir.client_url, "client_outbound") == 0
    assert (
        metric(weir.client_url, "weir_outbound_calls_total", call="knock", outcome="deadline") == 1
    )
    assert room_id not in alice.get(f"{V3}/sync", timeout=30).json()["rooms"]["knock"]
