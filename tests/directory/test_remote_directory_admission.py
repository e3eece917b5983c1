"""ADR-0079 against a peer that accepts connections and never answers: remote publicRooms
and aliases run under the client outbound budget (half the main pool, one per client) and a
10 s total deadline, against the real server process in pool mode."""

import socket
import time

import gevent
import requests

from tests.peers.tarpit import Tarpit
from tests.support.federation import federation_settings
from tests.support.metrics import in_flight, metric, wait_for_metric

V3 = "/_matrix/client/v3"
BUDGET = "client_outbound"


def as_client(i: int) -> dict:
    # The tests connect from loopback, a trusted proxy: each forwarded address is a client.
    return {"X-Forwarded-For": f"198.51.100.{i}", "Connection": "close"}


def settings(test_ca, dns, **http) -> dict:
    return {
        "server": {"http": {"main_pool_size": 8, "trusted_proxies": ["127.0.0.0/8"], **http}},
        "federation": federation_settings(test_ca, dns),
    }


def remote_rooms(weir, server: str, client: int, **params):
    started = time.monotonic()
    r = requests.get(
        weir.url(f"{V3}/publicRooms"),
        params={"server": server, **params},
        headers=as_client(client),
        timeout=60,
    )
    return r, time.monotonic() - started


def assert_refused_at_once(response):
    assert response.status_code == 429, response.text
    assert response.json() == {
        "errcode": "M_LIMIT_EXCEEDED",
        "retry_after_ms": 1000,
        "error": response.json()["error"],
    }
    assert response.headers["Retry-After"] == "1"


def test_tarpit_holds_at_most_the_budget_until_the_deadline(start_weir, dns, test_ca):
    dns.add_a("tarpit.test", "127.40.0.1")
    with Tarpit("127.40.0.1", 8448) as tarpit:
        weir = start_weir(settings(test_ca, dns))
        # Ten clients, ten different queries (so nothing is shared): four may wait.
        calls = [
            gevent.spawn(remote_rooms, weir, "tarpit.test:8448", i, limit=i + 1) for i in range(10)
        ]
        assert len(gevent.wait(calls, count=6, timeout=10)) == 6
        refused = [c for c in calls if c.ready()]
        waiting = [c for c in calls if not c.ready()]
        for c in refused:
            assert_refused_at_once(c.value[0])
        latencies = sorted(c.value[1] * 1000 for c in refused)
        print(f"\nrefusal latencies (ms): {', '.join(f'{ms:.1f}' for ms in latencies)}")
        assert latencies[-1] < 1000  # "at once": long before any deadline (figures printed)

        assert tarpit.wait_accepted(4, timeout=10)
        assert in_flight(weir.client_url, BUDGET) == 4
        # A second request from a client that is already waiting is refused too.
        busy_client = calls.index(waiting[0])
        again, _ = remote_rooms(weir, "tarpit.test:8448", busy_client, limit=99)
        assert_refused_at_once(again)
        # Requests that never leave the server are served meanwhile.
        assert requests.get(weir.url("/_matrix/client/versions"), timeout=10).status_code == 200
        local = requests.get(weir.url(f"{V3}/publicRooms"), timeout=10)
        assert local.status_code == 200 and "chunk" in local.json()
        login = requests.post(
            weir.url(f"{V3}/login"),
            timeout=10,
            json={"type": "m.login.password", "user": "nobody", "password": "x"},
        )
        assert login.status_code == 403  # answered (no such user), not stalled

        gevent.joinall(waiting, timeout=30)
        for c in waiting:
            response, elapsed = c.value
            assert response.status_code == 504, response.text
            assert response.json()["errcode"] == "M_UNKNOWN"
            assert "tarpit.test:8448" in response.json()["error"]
            assert 9.0 <= elapsed < 20.0, elapsed  # the 10 s deadline, not remote_timeout (60)
        print(
            f"admitted requests ended after {min(c.value[1] for c in waiting):.2f}-"
            f"{max(c.value[1] for c in waiting):.2f} s"
        )
        assert tarpit.accepted == 4 and tarpit.max_concurrent <= 4
        assert in_flight(weir.client_url, BUDGET) == 0

        # The address timed out: it cools down, and the next lookup fails at once, without
        # a slot and without a connection.
        cooled, elapsed = remote_rooms(weir, "tarpit.test:8448", 50, limit=50)
        assert cooled.status_code == 504
        assert "cooling down" in cooled.json()["error"]
        assert elapsed < 1.0
        assert tarpit.accepted == 4
        assert metric(weir.client_url, "weir_cooldown_addresses") == 1
        assert (
            metric(weir.client_url, "weir_outbound_deadline_expiries_total", call="public_rooms")
            == 4
        )


def test_a_client_that_hangs_up_frees_its_slot(start_weir, dns, test_ca):
    dns.add_a("hangup.test", "127.40.0.2")
    with Tarpit("127.40.0.2", 8448) as tarpit:
        weir = start_weir(settings(test_ca, dns))
        host, port = weir.client_url.split("//")[1].split(":")
        conn = socket.create_connection((host, int(port)))
        conn.sendall(
            b"GET /_matrix/client/v3/publicRooms?server=hangup.test:8448 HTTP/1.1\r\n"
            b"Host: x\r\nX-Forwarded-For: 198.51.100.1\r\n\r\n"
        )
        assert tarpit.wait_accepted(1, timeout=10)
        assert in_flight(weir.client_url, BUDGET) == 1
        conn.close()
        freed_after = wait_for_metric(
            weir.client_url, "weir_budget_in_flight", 0, timeout=5, budget=BUDGET
        )
        print(f"\nslot freed {freed_after * 1000:.0f} ms after the client hung up")
        assert freed_after < 1.0
        assert tarpit.wait_current(0, timeout=5)  # our outbound connection is closed too
        # A hang-up says nothing about the peer: its address is not cooling down.
        assert metric(weir.client_url, "weir_cooldown_addresses") == 0
        weir.wait_for_log(
            r"GET /_matrix/client/v3/publicRooms\?server=hangup\S* ClientDisconnected"
        )


def test_waiting_on_a_shared_call_takes_a_slot(start_weir, dns, test_ca):
    """Eight identical requests at a tarpit: one leads, the others wait on its call, and
    every waiter holds a slot, or eight of them would pin a pool of eight."""
    dns.add_a("shared.test", "127.40.0.3")
    with Tarpit("127.40.0.3", 8448) as tarpit:
        fed = federation_settings(test_ca, dns, remote_timeout=2)
        weir = start_weir({**settings(test_ca, dns), "federation": fed})
        calls = [gevent.spawn(remote_rooms, weir, "shared.test:8448", i) for i in range(8)]
        assert len(gevent.wait(calls, count=4, timeout=10)) == 4
        for c in [c for c in calls if c.ready()]:
            assert_refused_at_once(c.value[0])
        assert in_flight(weir.client_url, BUDGET) == 4
        assert tarpit.wait_accepted(1, timeout=10)
        gevent.joinall(calls, timeout=30)
        outcomes = sorted(c.value[0].status_code for c in calls)
        assert outcomes == [429] * 4 + [504] * 4
        assert tarpit.accepted == 1  # one call, shared; its timeout is every waiter's failure
        assert in_flight(weir.client_url, BUDGET) == 0
        assert metric(weir.client_url, "weir_coalesced_waits_total", call="public_rooms") == 3


def test_a_bad_server_name_is_refused_before_anything(start_weir, dns, test_ca):
    weir = start_weir(settings(test_ca, dns))
    for path in (
        f"{V3}/publicRooms?server=not%20a%20server",
        f"{V3}/directory/room/%23lobby:bad%20server",
    ):
        r = requests.get(weir.url(path), headers=as_client(1), timeout=10)
        assert (r.status_code, r.json()["errcode"]) == (400, "M_INVALID_PARAM")
    assert (
        metric(weir.client_url, "weir_outbound_calls_total", call="public_rooms", outcome="refused")
        == 0
    )
