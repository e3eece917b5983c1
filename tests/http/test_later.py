"""A parked /sync waits after the application has returned (homeserver/http/later.py): in
process, with the real app behind the real server."""

from __future__ import annotations

import gc
import json
import socket
import time
from urllib.parse import quote

import gevent
import pytest
from flask.ctx import RequestContext
from gevent.event import Event

from homeserver.api.app import create_flask_app
from homeserver.config import parse_config
from homeserver.core.requester import Requester
from homeserver.http.later import LaterResponse
from homeserver.http.places import WorkPool
from homeserver.http.server import WeirWSGIServer
from homeserver.rooms.creation import CreateRoomRequest
from homeserver.runtime import HomeserverRuntime
from tests.support.server import base_settings

SYNC = "/_matrix/client/v3/sync"


class Served:
    def __init__(self, tmp_path, pool_size: int = 8, hooks=()):
        settings = base_settings(str(tmp_path / "data"))
        self.runtime = HomeserverRuntime(parse_config(settings, str(tmp_path)))
        self.app = create_flask_app(self.runtime)
        for hook in hooks:
            self.app.after_request(hook)
        self.server = WeirWSGIServer(
            ("127.0.0.1", 0), self.app, pool=WorkPool(pool_size), keepalive_timeout=5
        )
        self.server.start()
        account = self.runtime.accounts.register("alice", "pw")
        self.alice = Requester(account.user_id, account.device_id, False, "")
        self.token = account.access_token
        self.room_id = self.runtime.room_creator.create(account.user_id, CreateRoomRequest())
        self.since = self.runtime.sync.sync(self.alice, None, 0, False, None)["next_batch"]
        self.socks: list[socket.socket] = []

    def park(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.server.server_port), timeout=10)
        sock.sendall(
            # set_presence=offline: the sync itself changes nothing that would answer it.
            f"GET {SYNC}?since={quote(self.since)}&timeout=60000&set_presence=offline"
            " HTTP/1.1\r\nHost: t\r\n"
            f"Authorization: Bearer {self.token}\r\n\r\n".encode()
        )
        self.socks.append(sock)
        return sock

    def wait_parked(self, count: int) -> None:
        deadline = time.monotonic() + 10
        # parked(), not waiting(): an answered sync's registration stays held for its
        # client's next long-poll (homeserver/sync/held_registrations.py).
        while (parked := self.runtime.notifier.parked()) != count:
            assert time.monotonic() < deadline, f"{parked} syncs parked, not {count}"
            gevent.sleep(0.01)

    def send(self, body: str) -> None:
        self.runtime.rooms.send_message(
            self.alice, self.room_id, "m.room.message", {"body": body}, f"t-{body}"
        )

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.server.stop(timeout=1)
        self.runtime.close()


@pytest.fixture
def served(tmp_path):
    served = Served(tmp_path)
    yield served
    served.close()


def response_of(sock: socket.socket) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of the next response on the connection."""
    reader = sock.makefile("rb")
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, json.loads(reader.read(int(headers["content-length"])))


def flask_frames(greenlet) -> list[str]:
    frame, found = greenlet.gr_frame, []
    while frame is not None:
        if "/flask/" in frame.f_code.co_filename:
            found.append(frame.f_code.co_name)
        frame = frame.f_back
    return found


def test_a_parked_sync_holds_nothing_of_flasks_and_wakes_with_its_answer(served):
    socks = [served.park() for _ in range(3)]
    served.wait_parked(3)
    # A sync registers before its view returns: the last one's Flask teardown may still be
    # running. Once no parked connection's greenlet is inside Flask (parked inside the view,
    # each would stay there), no request context is left either.
    deadline = time.monotonic() + 10
    while [flask_frames(g) for g in served.server.connections] != [[], [], []]:
        assert time.monotonic() < deadline, [flask_frames(g) for g in served.server.connections]
        gevent.sleep(0.01)
    assert [o for o in gc.get_objects() if isinstance(o, RequestContext)] == []

    served.send("wake up")
    for sock in socks:
        status, headers, body = response_of(sock)
        assert status == 200 and headers["access-control-allow-origin"] == "*"
        timeline = body["rooms"]["join"][served.room_id]["timeline"]["events"]
        assert [e["content"] for e in timeline] == [{"body": "wake up"}]
    served.wait_parked(0)


def test_a_parked_sync_that_finds_no_place_when_woken_gets_a_matrix_503(tmp_path):
    served = Served(tmp_path, pool_size=1)
    served.server.places.wait_seconds = 0.2
    release = Event()

    def occupy():  # the only work place, taken until released
        served.server.places.pool.add(gevent.getcurrent())
        release.wait()

    try:
        sock = served.park()
        served.wait_parked(1)
        holder = gevent.spawn(occupy)
        gevent.sleep(0)
        served.send("no room")
        status, headers, body = response_of(sock)
        assert (status, body["errcode"], headers["retry-after"]) == (503, "M_UNKNOWN", "1")
        served.wait_parked(0)
        release.set()
        holder.join(5)
        assert len(served.server.places.pool) == 0  # and no place kept
    finally:
        release.set()
        served.close()


def test_a_waiting_answer_that_flask_never_returned_ends_its_wait(tmp_path):
    def lose_it(response):
        if isinstance(response, LaterResponse):
            raise RuntimeError("an after-request hook failed")
        return response

    served = Served(tmp_path, hooks=[lose_it])
    try:
        status, _, body = response_of(served.park())
        assert (status, body["errcode"]) == (500, "M_UNKNOWN")
        # The sync registered and was dropped on Flask's way out: the server ended it.
        served.wait_parked(0)
    finally:
        served.close()
