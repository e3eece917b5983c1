"""Inbound staging (homeserver/rooms/staging.py) against the real server: a key server that
never answers stalls no /send answer, the PDUs are applied once the keys come, a restart
resumes what was staged, and an origin past its staging cap gets 429 while others do not."""

import os
import time

import pytest

from tests.peers.origins import OriginKeyServer, send_transaction
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

STAGED_CAP = 50  # staged_per_origin_max_pdus: the least it may be


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("staging.test", test_ca, dns, host="127.63.0.2") as server:
        yield server


@pytest.fixture(scope="module")
def slow_keys(test_ca, dns):
    """A key server the tests hold: what its origins signed waits for their keys."""
    with OriginKeyServer("slowstage.test", test_ca, dns, host="127.63.0.3") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("staging"))
    # A remote_timeout long enough that a wait for the key would show in the answer time.
    fed = federation_settings(test_ca, dns, remote_timeout=30)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.63.0.1", port=0))
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {
            "federation": fed,
            "security": {"federation": {"staged_per_origin_max_pdus": STAGED_CAP}},
        },
    )
    proc = WeirProcess(directory, settings).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def send(weir, test_ca, origin, txn_id, pdus):
    return send_transaction(weir.federation_url, origin, "weir.test", txn_id, pdus, test_ca)


def timed(weir, test_ca, origin, txn_id, pdus):
    started = time.monotonic()
    r = send(weir, test_ca, origin, txn_id, pdus)
    return r, time.monotonic() - started


def test_a_key_server_that_never_answers_stalls_no_answer_and_a_restart_resumes(
    weir, test_ca, alice, keys, slow_keys
):
    origin = keys.add_origin("o1")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    # erin's server's keys wait at the held key server; bob's message comes after her join.
    erin_id, erin_join = room.join_pdu(slow_keys.add_origin("erin"), "erin", prev=join_id)
    said_ids, said = room.messages(origin, "bob", ["after erin"], prev=erin_id)
    slow_keys.hold()
    try:
        answers = [timed(weir, test_ca, origin, "s-1", [erin_join])]
        answers.append(timed(weir, test_ca, origin, "s-2", said))
        for r, seconds in answers:
            assert (r.status_code, r.json()) == (200, {"pdus": {}}), r.text
            print(f"answered 200 in {seconds:.2f} s, its key not fetched yet")
            assert seconds < 10  # the key fetch's own deadline is 30 s
        assert metric(weir.client_url, "weir_inbound_staged") == 2
        weir.stop()  # staged: the restart resumes them
        weir.start()
    finally:
        slow_keys.release()
    wait_for_metric(weir.client_url, "weir_inbound_staged", 0, timeout=60)
    alice.base_url = weir.client_url
    stored = [e["event_id"] for e in room.timeline()]
    assert stored.index(erin_id) < stored.index(said_ids[0])
    assert send(weir, test_ca, origin, "s-2", said).json() == {"pdus": {said_ids[0]: {}}}


def test_an_origin_past_its_staging_cap_gets_429_and_others_do_not(
    weir, test_ca, alice, keys, slow_keys
):
    hostile, honest = keys.add_origin("busy"), keys.add_origin("calm")
    room, join_id = room_joined_by(weir, test_ca, alice, hostile)
    carl_join_id, honest_join = room.join_pdu(honest, "carl", prev=join_id)
    assert send(weir, test_ca, honest, "calm-join", [honest_join]).status_code == 200
    stuck_id, stuck = room.join_pdu(slow_keys.add_origin("stuck"), "sam", prev=join_id)
    _, many = room.messages(hostile, "bob", [f"m{i}" for i in range(STAGED_CAP - 1)], stuck_id)
    _, one_more = room.messages(hostile, "bob", ["over"], prev=join_id)
    refused_before = metric(weir.client_url, "weir_inbound_staging_refused_total")
    slow_keys.hold()
    try:
        assert send(weir, test_ca, hostile, "b-1", [stuck]).json() == {"pdus": {}}
        assert send(weir, test_ca, hostile, "b-2", many).json() == {"pdus": {}}
        r = send(weir, test_ca, hostile, "b-3", one_more)
        assert (r.status_code, r.json()["errcode"]) == (429, "M_LIMIT_EXCEEDED"), r.text
        assert metric(weir.client_url, "weir_inbound_staging_refused_total") == refused_before + 1
        # Another origin of the same room is applied at once, its answer the real one.
        ids, pdus = room.messages(honest, "carl", ["unaffected"], prev=carl_join_id)
        assert send(weir, test_ca, honest, "calm-1", pdus).json() == {"pdus": {ids[0]: {}}}
    finally:
        slow_keys.release()
    wait_for_metric(weir.client_url, "weir_inbound_staged", 0, timeout=60)
    assert send(weir, test_ca, hostile, "b-3", one_more).status_code == 200  # the retry
