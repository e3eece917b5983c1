"""Jump to date on the real server (SQLite and PostgreSQL): `timestamp_to_event` for clients
(both directions, nothing there, bad parameters, a non-member) and for other servers, asked
by a signed fake origin that is in the room and by one that is not."""

import os
from urllib.parse import quote, urlencode

import pytest

from tests.peers.origins import OriginKeyServer, federation_request
from tests.rooms.conftest import V3, create_room, send
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import in_flight, read_metrics
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.spec import assert_matches_spec

CLIENT_PATH = "/_matrix/client/v1/rooms/{roomId}/timestamp_to_event"
FEDERATION_PATH = "/_matrix/federation/v1/timestamp_to_event/{roomId}"


def q(value: str) -> str:
    return quote(value, safe="")


def jump(client, room_id: str, status: int = 200, **params) -> dict:
    r = client.get(f"/_matrix/client/v1/rooms/{q(room_id)}/timestamp_to_event", params=params)
    assert r.status_code == status, r.text
    if status == 200:
        assert_matches_spec(r, "GET", CLIENT_PATH)
    return r.json()


def event_ts(client, room_id: str, event_id: str) -> int:
    r = client.get(f"{V3}/rooms/{q(room_id)}/event/{q(event_id)}")
    assert r.status_code == 200, r.text
    return r.json()["origin_server_ts"]


def test_timestamp_to_event_both_directions(user):
    alice, carol = user("alice"), user("carol")
    room_id = create_room(alice, preset="private_chat")
    ids = [send(alice, room_id, f"m{i}") for i in range(3)]
    times = [event_ts(alice, room_id, e) for e in ids]

    found = jump(alice, room_id, ts=times[1], dir="f")
    assert found["origin_server_ts"] == times[1] and found["event_id"] in ids[1:]
    found = jump(alice, room_id, ts=times[2] + 1000, dir="b")
    assert found == {"event_id": ids[2], "origin_server_ts": times[2]}
    found = jump(alice, room_id, ts=times[0] - 1, dir="b")  # the room's creation, before
    assert found["origin_server_ts"] < times[0]
    # Nothing after the last event, and no server to ask: 404.
    assert jump(alice, room_id, 404, ts=times[2] + 60_000, dir="f")["errcode"] == "M_NOT_FOUND"
    assert jump(alice, room_id, 404, ts=0, dir="b")["errcode"] == "M_NOT_FOUND"

    for params in ({"dir": "f"}, {"ts": times[0]}):
        assert jump(alice, room_id, 400, **params)["errcode"] == "M_MISSING_PARAM"
    for params in ({"ts": "soon", "dir": "f"}, {"ts": -1, "dir": "f"}, {"ts": 1, "dir": "x"}):
        assert jump(alice, room_id, 400, **params)["errcode"] == "M_INVALID_PARAM"
    # A user who may read none of the room learns nothing of it.
    assert jump(carol, room_id, 403, ts=times[0], dir="f")["errcode"] == "M_FORBIDDEN"


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("jump.test", test_ca, dns, host="127.60.0.2") as server:
        yield server


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def weir(request, test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("jump"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.60.0.1", port=0))
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


def test_federation_timestamp_to_event_for_servers_in_the_room(weir, keys, test_ca):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    inside, outside = keys.add_origin("in"), keys.add_origin("out")
    room, join_id = room_joined_by(weir, test_ca, alice, inside)
    last = send(alice, room.room_id, "the last one")
    last_ts = event_ts(alice, room.room_id, last)

    def ask(origin, **params):
        uri = FEDERATION_PATH.format(roomId=q(room.room_id)) + "?" + urlencode(params)
        return federation_request(weir.federation_url, origin, "weir.test", "GET", uri, test_ca)

    r = ask(inside, ts=last_ts + 1000, dir="b")
    assert r.status_code == 200, r.text
    assert_matches_spec(r, "GET", FEDERATION_PATH, api="server-server")
    assert r.json() == {"event_id": last, "origin_server_ts": last_ts}
    r = ask(inside, ts=last_ts + 60_000, dir="f")
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    r = ask(inside, ts=last_ts, dir="sideways")
    assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM")
    # A server with no member in the room is told nothing.
    r = ask(outside, ts=last_ts, dir="b")
    assert (r.status_code, r.json()["errcode"]) == (403, "M_FORBIDDEN")

    # Our timeline has nothing later, so the origin is asked; its address serves keys alone,
    # so its failure leaves the client a plain 404, and the client's slot is free again.
    for _ in range(2):
        found = jump(alice, room.room_id, 404, ts=last_ts + 60_000, dir="f")
        assert found["errcode"] == "M_NOT_FOUND"
    calls = {
        dict(labels)["outcome"]: value
        for (name, labels), value in read_metrics(weir.client_url).items()
        if name == "weir_outbound_calls_total" and ("call", "timestamp_to_event") in labels
    }
    assert sum(calls.values()) == 2 and "ok" not in calls, calls
    assert in_flight(weir.client_url, "client_outbound") == 0
