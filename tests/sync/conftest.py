"""A real server shared by a test module (SQLite and PostgreSQL, from tests/rooms), an
in-process runtime on a SQLite file, and helpers for driving /sync."""

import json

import pytest
import requests

from homeserver.config import parse_config
from homeserver.runtime import HomeserverRuntime
from tests.rooms.conftest import V3, server, user  # noqa: F401 - fixtures shared with rooms
from tests.support.spec import assert_matches_spec


@pytest.fixture
def runtime(tmp_path):
    """The runtime alone, for the notifier and the sync service in process."""
    rt = HomeserverRuntime(
        parse_config(
            {
                "server_name": "hs.test",
                "data_dir": str(tmp_path),
                "database": {"url": f"sqlite:///{tmp_path}/hs.db"},
            }
        )
    )
    yield rt
    rt.close()


def sync(client, since=None, timeout=0, sync_filter=None, check_spec=True, **params) -> dict:
    """One /sync, checked against the spec's schema (unless event_fields trims events)."""
    if since is not None:
        params["since"] = since
    if sync_filter is not None:
        params["filter"] = sync_filter if isinstance(sync_filter, str) else json.dumps(sync_filter)
    r = client.get(f"{V3}/sync", params={"timeout": timeout, **params}, timeout=30 + timeout / 1000)
    assert r.status_code == 200, r.text
    if check_spec:
        assert_matches_spec(r, "get", "/_matrix/client/v3/sync")
    return r.json()


def timeline(body: dict, room_id: str, section: str = "join") -> list[dict]:
    return body["rooms"][section][room_id]["timeline"]["events"]


def event_ids(events: list[dict]) -> list[str]:
    return [e["event_id"] for e in events]


def metric(weir, name: str) -> float:
    """One unlabelled gauge from the server's /metrics."""
    for line in requests.get(weir.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")
