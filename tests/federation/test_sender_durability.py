"""Nothing our users send is lost to a restart or a `kill -9`: the outbox is written with the
event, before the client's 200, and the real server process resumes it when it starts."""

import os
import signal

import pytest

from tests.federation.test_sender import bodies, say, weir_settings
from tests.peers.origins import OriginKeyServer
from tests.peers.receiver import TransactionSink
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
    ids = [t.txn_id for t in sink.attempts(origin.name)]
    assert len(ids) == len(set(ids)), ids  # the counter survived the restart
