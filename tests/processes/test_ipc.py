"""The shard IPC frames over a real Unix socket pair: requests and replies both ways, and
bad frames logged and dropped without ending the connection."""

import json
import logging
import socket

import gevent
import gevent.select
import pytest
from gevent.event import Event

from homeserver.processes.ipc import (
    ERROR,
    HEADER,
    MAX_FRAME_BYTES,
    REPLY,
    FrameConnection,
    FrameType,
    IpcError,
    IpcServer,
    connect,
    encode_frame,
)


def echo(connection, body):
    return {"echo": body}


def fail(connection, body):
    raise ValueError("no such shard")


@pytest.fixture
def pair():
    """A FrameConnection (with echo/fail handlers) and the raw socket at the other end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    closed = Event()
    connection = FrameConnection(
        ours,
        {FrameType.HEALTH: echo, FrameType.HELLO: fail},
        "test peer",
        on_close=lambda c: closed.set(),
    ).start()
    connection.closed_event = closed
    yield connection, theirs
    connection.close()
    theirs.close()


def read_frame(sock) -> tuple[int, int, dict]:
    header = b""
    while len(header) < HEADER.size:
        header += sock.recv(HEADER.size - len(header))
    length, frame_type, request_id = HEADER.unpack(header)
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return frame_type, request_id, json.loads(body)


def test_requests_and_replies_both_ways(pair):
    connection, theirs = pair
    # They ask, we answer with the handler.
    theirs.sendall(encode_frame(FrameType.HEALTH, 7, {"n": 1}))
    assert read_frame(theirs) == (FrameType.HEALTH | REPLY, 7, {"echo": {"n": 1}})
    # We ask, they answer.
    job = gevent.spawn(connection.request, FrameType.RELAY, {"txn": "t1"}, 5)
    frame_type, request_id, body = read_frame(theirs)
    assert (frame_type, body) == (FrameType.RELAY, {"txn": "t1"})
    theirs.sendall(encode_frame(FrameType.RELAY | REPLY, request_id, {"answer": {}}))
    assert job.get(timeout=5) == {"answer": {}}


def test_a_failing_handler_answers_error(pair):
    connection, theirs = pair
    theirs.sendall(encode_frame(FrameType.HELLO, 3, {}))
    frame_type, request_id, body = read_frame(theirs)
    assert (frame_type, request_id) == (ERROR, 3)
    assert "no such shard" in body["error"]
    # An ERROR reply to our request is an IpcError for the requester.
    job = gevent.spawn(connection.request, FrameType.RELAY, {}, 5)
    _, request_id, _ = read_frame(theirs)
    theirs.sendall(encode_frame(ERROR, request_id, {"error": "main is unhappy"}))
    with pytest.raises(IpcError, match="main is unhappy"):
        job.get(timeout=5)


def test_bad_frames_are_dropped_and_the_connection_goes_on(pair, caplog):
    connection, theirs = pair
    caplog.set_level(logging.WARNING, logger="homeserver.processes.ipc")
    too_long = MAX_FRAME_BYTES + 1
    bad = [
        HEADER.pack(too_long, FrameType.HEALTH, 1) + b"x" * too_long,  # over the cap
        HEADER.pack(9, FrameType.HEALTH, 2) + b"not json!",  # not JSON
        HEADER.pack(2, FrameType.HEALTH, 3) + b"[]",  # not an object
        HEADER.pack(2, 0x55, 4) + b"{}",  # unknown type
        HEADER.pack(2, FrameType.RELAY | REPLY, 99) + b"{}",  # nobody asked
    ]
    sender = gevent.spawn(theirs.sendall, b"".join(bad))
    answers = [read_frame(theirs) for _ in range(4)]  # the reply to nothing gets no answer
    sender.get(timeout=10)
    assert [(t, i) for t, i, _ in answers] == [(ERROR, 1), (ERROR, 2), (ERROR, 3), (ERROR, 4)]
    assert [b["error"] for _, _, b in answers] == [
        "frame too large",
        "body is not a JSON object",
        "body is not a JSON object",
        "unknown frame type 85",
    ]
    # Still serving.
    theirs.sendall(encode_frame(FrameType.HEALTH, 5, {"still": "here"}))
    assert read_frame(theirs) == (FrameType.HEALTH | REPLY, 5, {"echo": {"still": "here"}})
    assert not connection.closed
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "over" in logged and "not a JSON object" in logged and "unknown type" in logged
    assert "unknown request 99" in logged


def test_a_bad_reply_fails_only_its_request(pair):
    connection, theirs = pair
    job = gevent.spawn(connection.request, FrameType.RELAY, {}, 5)
    _, request_id, _ = read_frame(theirs)
    theirs.sendall(HEADER.pack(3, FrameType.RELAY | REPLY, request_id) + b"{x}")
    with pytest.raises(IpcError, match="bad reply"):
        job.get(timeout=5)
    job = gevent.spawn(connection.request, FrameType.RELAY, {}, 5)
    _, request_id, _ = read_frame(theirs)
    theirs.sendall(encode_frame(FrameType.HEALTH | REPLY, request_id, {}))  # wrong type
    with pytest.raises(IpcError, match="reply of type"):
        job.get(timeout=5)
    assert not connection.closed


def test_end_of_stream_fails_waiting_requests_and_closes(pair):
    connection, theirs = pair
    job = gevent.spawn(connection.request, FrameType.RELAY, {}, 30)
    read_frame(theirs)
    theirs.sendall(HEADER.pack(100, FrameType.HEALTH, 1) + b"{")  # cut off mid-frame
    theirs.close()
    with pytest.raises(IpcError, match="lost"):
        job.get(timeout=5)
    assert connection.closed_event.wait(5)
    with pytest.raises(IpcError):
        connection.request(FrameType.RELAY, {}, 1)


def test_a_request_without_answer_times_out(pair):
    connection, theirs = pair
    with pytest.raises(IpcError, match="no answer"):
        connection.request(FrameType.RELAY, {}, 0.2)
    assert connection._pending == {}


def test_a_frame_over_the_cap_is_never_sent():
    with pytest.raises(IpcError):
        encode_frame(FrameType.RELAY, 1, {"pad": "x" * MAX_FRAME_BYTES})


def test_server_and_client_over_a_socket_path(tmp_path):
    path = str(tmp_path / "ipc" / "shards.sock")
    server = IpcServer(path, {FrameType.HEALTH: echo}).start()
    try:
        client = connect(path, {FrameType.HEALTH: echo})
        assert client.request(FrameType.HEALTH, {"a": 1}, 5) == {"echo": {"a": 1}}
        # Main can ask the client too.
        (main_side,) = server.connections
        assert main_side.request(FrameType.HEALTH, {"b": 2}, 5) == {"echo": {"b": 2}}
        assert oct((tmp_path / "ipc").stat().st_mode & 0o777) == "0o700"
        # A second server on the same path refuses: one data_dir, one server.
        with pytest.raises(RuntimeError, match="another server"):
            IpcServer(path, {}).start()
        client.close()
    finally:
        server.stop()
    # A socket left behind by a server that died is replaced.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    IpcServer(path, {}).start().stop()


def test_a_send_stopped_midway_closes_the_connection(pair):
    """A sender killed inside sendall (a shutdown, a timeout) has written part of a frame:
    the stream is out of step for good, so the connection must close rather than carry the
    next frame inside this one's body."""
    connection, theirs = pair
    body = {"pad": "x" * (4 * 1024 * 1024)}  # far more than the socket buffers hold
    job = gevent.spawn(connection.request, FrameType.RELAY, body, 30)
    # Part of the frame has arrived; the rest cannot fit in the socket buffers.
    assert gevent.select.select([theirs], [], [], 5)[0]
    assert not job.ready()
    job.kill(block=True)
    assert connection.closed
    assert connection.closed_event.wait(5)
