"""Weir with application services registered, on SQLite and PostgreSQL, and helpers."""

import json
import os
import socket
import subprocess
import sys
import time
from urllib.parse import quote

import pytest

from tests.support.server import MatrixClient, WeirProcess, base_settings

V3 = "/_matrix/client/v3"
SERVER_NAME = "weir.test"  # base_settings' server_name
HERE = os.path.dirname(os.path.abspath(__file__))


def registration_yaml(
    as_id: str,
    url: str | None,
    *,
    users: str = "@bridge_.*:weir\\.test",
    aliases: str = "#bridge_.*:weir\\.test",
    rooms: str | None = None,
    exclusive: bool = True,
    rate_limited: bool = False,
    ephemeral: bool = True,
    msc3202: bool = False,
    protocols: tuple[str, ...] = (),
) -> str:
    """A registration file as mautrix writes one."""
    url_line = "null" if url is None else json.dumps(url)
    rooms_yaml = "[]" if rooms is None else f"[{{regex: '{rooms}', exclusive: false}}]"
    return f"""id: {as_id}
url: {url_line}
as_token: as-{as_id}
hs_token: hs-{as_id}
sender_localpart: {as_id}bot
rate_limited: {str(rate_limited).lower()}
de.sorunome.msc2409.push_ephemeral: {str(ephemeral).lower()}
receive_ephemeral: {str(ephemeral).lower()}
org.matrix.msc3202: {str(msc3202).lower()}
protocols: {json.dumps(list(protocols))}
namespaces:
  users:
    - regex: '{users}'
      exclusive: {str(exclusive).lower()}
  aliases:
    - regex: '{aliases}'
      exclusive: {str(exclusive).lower()}
  rooms: {rooms_yaml}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_with_appservices(tmp_path, request):
    """start(registrations={id: yaml}, database_url=None, **appservice settings) -> a
    WeirProcess; call it again with the same name to restart on the same data."""
    started: list[WeirProcess] = []

    def start(registrations: dict, database_url: str | None = None, **appservice) -> WeirProcess:
        paths = []
        for as_id, text in registrations.items():
            path = tmp_path / f"{as_id}.yaml"
            path.write_text(text)
            paths.append(str(path))
        settings = base_settings(str(tmp_path / "data"), database_url)
        settings["app_service_config_files"] = paths
        if appservice:
            settings["appservice"] = appservice
        proc = WeirProcess(str(tmp_path), settings).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/data/homeserver.db"
    return request.getfixturevalue("pg_cluster").new_database()


def as_client(weir: WeirProcess, as_id: str) -> MatrixClient:
    return MatrixClient(weir.client_url, token=f"as-{as_id}")


def user(weir: WeirProcess, name: str) -> MatrixClient:
    client = MatrixClient(weir.client_url)
    client.register(name)
    client.user_id = f"@{name}:{SERVER_NAME}"
    return client


def create_room(client: MatrixClient, **body) -> str:
    r = client.post(f"{V3}/createRoom", json=body)
    assert r.status_code == 200, r.text
    return r.json()["room_id"]


def send(client: MatrixClient, room_id: str, text: str, **params) -> str:
    txn = f"t{time.monotonic_ns()}"
    r = client.put(
        f"{V3}/rooms/{quote(room_id)}/send/m.room.message/{txn}",
        json={"msgtype": "m.text", "body": text},
        params=params,
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


class Bridge:
    """tests/appservice/mautrix_bridge.py in a process of its own, driven by JSON lines."""

    def __init__(self, weir: WeirProcess, as_id: str, port: int, directory: str):
        config = {
            "homeserver": weir.client_url,
            "domain": SERVER_NAME,
            "as_token": f"as-{as_id}",
            "hs_token": f"hs-{as_id}",
            "sender_localpart": f"{as_id}bot",
            "id": as_id,
            "host": "127.0.0.1",
            "port": port,
        }
        path = os.path.join(directory, "bridge.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "mautrix_bridge.py"), path],
            cwd=directory,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict] = []
        self.queries: list[str] = []
        self._next_id = 0
        self.read_until(lambda line: line.get("ready"))

    def read_until(self, condition, timeout: float = 30) -> dict:
        import gevent

        with gevent.Timeout(timeout, AssertionError("the bridge said nothing in time")):
            while True:
                raw = self.proc.stdout.readline()
                assert raw, f"the bridge exited with {self.proc.wait()}"
                line = json.loads(raw)
                if "event" in line:
                    self.events.append(line["event"])
                if "query_alias" in line:
                    self.queries.append(line["query_alias"])
                if condition(line):
                    return line

    def command(self, op: str, **args) -> dict:
        self._next_id += 1
        ident = self._next_id
        self.proc.stdin.write(json.dumps({"id": ident, "op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self.read_until(lambda line: line.get("id") == ident)

    def wait_for_event(self, event_id: str) -> dict:
        for event in self.events:
            if event["event_id"] == event_id:
                return event
        return self.read_until(lambda line: line.get("event", {}).get("event_id") == event_id)[
            "event"
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
