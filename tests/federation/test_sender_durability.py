"""Nothing our users send is lost to a restart or a `kill -9`: the outbox is written with the
event (or the to-device message, or the device change), before the client's 200, and the
real server process resumes it when it starts."""

import os
import signal

import pytest

from tests.e2ee.conftest import Device
from tests.federation.test_sender import V3, bodies, say, weir_settings
from tests.peers.origins import OriginKeyServer, send_transaction
from tests.peers.receiver import TransactionSink
from tests.support.metrics import metric, wait_for_metric
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("durable.test", test_ca, dns, host="127.62.1.2") as server:
        yield server


@pytest.fixture(scope="module")
def sink(keys):
    return TransactionSink(keys)


@pytest.fixture(params=["sqlite", "postgres"])
def weir(request, test_ca, dns, tmp_path, sink):
    settings = weir_settings(test_ca, dns, str(tmp_path))
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(str(tmp_path), settings).start()
    sink.trust("weir.test", proc.federation_url, test_ca)
    yield proc
    proc.stop()


def kill_9(proc: WeirProcess) -> None:
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait(10)
    proc._stderr.close()


@pytest.mark.parametrize("stop", ["restart", "kill -9"])
def test_messages_sent_while_a_server_is_down_arrive_after_we_restart(
    weir, test_ca, keys, sink, stop
):
    origin = keys.add_origin(f"down-{stop.replace(' ', '')}-{os.urandom(3).hex()}")
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    room, _ = room_joined_by(weir, test_ca, alice, origin)
    sink.fail(origin.name, 503)  # the peer is down

    say(alice, room.room_id, ["one", "two", "three"])
    assert sink.wait_until(lambda: len(sink.attempts(origin.name)) >= 1)
    if stop == "kill -9":
        kill_9(weir)  # right after the third 200: nothing was flushed on the way out
    else:
        weir.stop()
    sink.succeed(origin.name)  # the peer is back while we are down
    weir.start()

    # No new message prompts them: the sender resumes the outbox when it starts.
    assert sink.wait_pdus(origin.name, 3, timeout=15), sink.attempts(origin.name)
    assert bodies(sink, origin.name) == ["one", "two", "three"]
    # The counter survived the restart: an ID comes again only for the same transaction,
    # sent again when we went down before hearing its answer (the 503).
    assert sink.ids_keep_their_pdus(origin.name), sink.attempts(origin.name)


def to_device_markers(sink, destination: str) -> list[int]:
    return [
        m["marker"]
        for e in sink.edus(destination)
        if e["edu_type"] == "m.direct_to_device"
        for by_device in e["content"]["messages"].values()
        for m in by_device.values()
    ]


def device_updates(sink, destination: str, user_id: str) -> list[dict]:
    return [
        e["content"]
        for e in sink.edus(destination)
        if e["edu_type"] == "m.device_list_update" and e["content"]["user_id"] == user_id
    ]


def test_to_device_messages_and_device_updates_survive_a_kill_9_in_order(weir, test_ca, keys, sink):
    """Durable EDUs: written with the local change, in the outbox across a `kill -9`, sent
    in order once the peer is back, each once."""
    origin = keys.add_origin(f"edus-{os.urandom(3).hex()}")
    alice = MatrixClient(weir.client_url)
    alice.user_id = alice.register("alice")["user_id"]
    room, _ = room_joined_by(weir, test_ca, alice, origin)
    sink.fail(origin.name, 503)

    bob = origin.user("bob")
    for n in range(5):
        messages = {bob: {"BOBDEVICE": {"marker": n}}}
        r = alice.put(f"{V3}/sendToDevice/m.test/t{n}", json={"messages": messages})
        assert r.status_code == 200, r.text
    second = MatrixClient(weir.client_url)
    second.login("alice")
    second.user_id = alice.user_id
    phone = Device(second)
    assert phone.upload(device_keys=phone.device_keys()).status_code == 200
    assert sink.wait_until(lambda: len(sink.attempts(origin.name)) >= 1)
    assert metric(weir.client_url, "weir_federation_sender_edu_queue") >= 6
    kill_9(weir)
    sink.succeed(origin.name)
    weir.start()

    def arrived():
        updates = device_updates(sink, origin.name, alice.user_id)
        return len(to_device_markers(sink, origin.name)) >= 5 and any(
            u["device_id"] == phone.device_id and "keys" in u for u in updates
        )

    assert sink.wait_until(arrived, timeout=15), sink.attempts(origin.name)
    assert to_device_markers(sink, origin.name) == [0, 1, 2, 3, 4]
    [update] = [u for u in device_updates(sink, origin.name, alice.user_id) if "keys" in u]
    assert update["keys"]["device_id"] == phone.device_id and update["prev_id"] is not None
    wait_for_metric(weir.client_url, "weir_federation_sender_edu_queue", 0)


def test_refused_edus_go_after_three_refusals_and_a_full_backlog_refuses_more(
    test_ca, dns, keys, sink, tmp_path
):
    """A peer that refuses an EDU (400) gets it three times, then it is dropped and
    counted; a peer owed `max_queued_edus` gets no more, counted too. Neither wedges the
    destination, and the sending client always gets its 200."""
    settings = weir_settings(test_ca, dns, str(tmp_path), max_queued_edus=100)
    weir = WeirProcess(str(tmp_path), settings).start()
    try:
        sink.trust("weir.test", weir.federation_url, test_ca)
        origin = keys.add_origin(f"refuses-{os.urandom(3).hex()}")
        alice = MatrixClient(weir.client_url)
        alice.register("alice")
        bob = origin.user("bob")

        def send(txn_id: str, marker: int) -> None:
            messages = {bob: {"BOBDEVICE": {"marker": marker}}}
            r = alice.put(f"{V3}/sendToDevice/m.test/{txn_id}", json={"messages": messages})
            assert r.status_code == 200, r.text

        def dropped(reason: str) -> float:
            return metric(
                weir.client_url,
                "weir_federation_edus_dropped_total",
                edu_type="m.direct_to_device",
                reason=reason,
            )

        sink.fail(origin.name, 400)
        send("refused", -1)
        assert sink.wait_until(lambda: len(sink.attempts(origin.name)) >= 3)
        wait_for_metric(
            weir.client_url,
            "weir_federation_edus_dropped_total",
            1,
            edu_type="m.direct_to_device",
            reason="refused",
        )
        assert len(sink.attempts(origin.name)) == 3
        assert metric(weir.client_url, "weir_federation_sender_edu_queue") == 0

        # Down (503): it backs off, and its backlog fills to 100; the 101st is dropped.
        sink.fail(origin.name, 503)
        for n in range(101):
            send(f"b{n}", n)
        assert dropped("backlog") == 1
        assert metric(weir.client_url, "weir_federation_sender_edu_queue") == 100
        sink.succeed(origin.name)
        r = send_transaction(weir.federation_url, origin, "weir.test", "back", [], test_ca)
        assert r.status_code == 200, r.text  # it is up: its backoff ends
        assert sink.wait_until(lambda: len(to_device_markers(sink, origin.name)) >= 100)
        assert to_device_markers(sink, origin.name) == list(range(100))
        wait_for_metric(weir.client_url, "weir_federation_sender_edu_queue", 0)
    finally:
        weir.stop()
