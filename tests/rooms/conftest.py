"""A real server shared by a test module, on SQLite and on PostgreSQL, and helpers for
reading what it stored."""

import itertools
import json
import sqlite3
from urllib.parse import quote

import pytest

from tests.support.server import MatrixClient, WeirProcess, base_settings

V3 = "/_matrix/client/v3"
_names = itertools.count()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("weir")
    settings = base_settings(str(directory / "data"))
    if request.param == "postgres":
        settings["database"] = {"url": request.getfixturevalue("pg_cluster").new_database()}
    proc = WeirProcess(str(directory), settings).start()
    proc.database_url = settings.get("database", {}).get(
        "url", f"sqlite:///{directory}/data/homeserver.db"
    )
    yield proc
    proc.stop()


@pytest.fixture
def user(server):
    """user("alice") registers a fresh account (a unique name per call) and logs it in."""

    def make(prefix: str = "user") -> MatrixClient:
        client = MatrixClient(server.client_url)
        client.register(f"{prefix}{next(_names)}")
        client.user_id = whoami(client)
        return client

    return make


def whoami(client: MatrixClient) -> str:
    return client.get(f"{V3}/account/whoami").json()["user_id"]


def alias_path(alias: str) -> str:
    return f"{V3}/directory/room/{quote(alias, safe='')}"


def create_room(client: MatrixClient, **body) -> str:
    r = client.post(f"{V3}/createRoom", json=body)
    assert r.status_code == 200, r.text
    return r.json()["room_id"]


def send(client: MatrixClient, room_id: str, body: str, txn: str | None = None) -> str:
    txn = txn or f"t{next(_names)}"
    r = client.put(
        f"{V3}/rooms/{room_id}/send/m.room.message/{txn}", json={"msgtype": "m.text", "body": body}
    )
    assert r.status_code == 200, r.text
    return r.json()["event_id"]


def stored_pdus(server, room_id: str) -> list[tuple[str, dict]]:
    """(event_id, PDU) of every event of the room, in stream order, read from the database
    the server writes."""
    sql = "SELECT event_id, json FROM events WHERE room_id = {} ORDER BY stream_ordering"
    url = server.database_url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            rows = conn.execute(sql.format("?"), (room_id,)).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            rows = conn.execute(sql.format("%s"), (room_id,)).fetchall()
    return [(event_id, json.loads(text)) for event_id, text in rows]
