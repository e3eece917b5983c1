"""Remote directory lookups at peers that answer too slowly to ever finish: a slow drip (a
byte every half second, so every read succeeds in time) and a well-known that hangs after
the TLS handshake. The total deadline ends both, against the real server process; the slot
and our connections are freed; and the lines the lookup logs carry its request id.

With `remote_timeout = 2` the directory deadline (10 s) is cut to 2 s."""

import json
import time

import requests

from tests.peers.slow import HangingPeer, SlowDripPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import federation_settings
from tests.support.metrics import in_flight

V3 = "/_matrix/client/v3"
DEADLINE = 2


def settings(test_ca, dns) -> dict:
    return {
        "server": {"http": {"main_pool_size": 8}},
        "federation": federation_settings(test_ca, dns, remote_timeout=DEADLINE),
        "logging": {"format": "json"},
    }


def remote_rooms(weir, server: str):
    started = time.monotonic()
    r = requests.get(weir.url(f"{V3}/publicRooms"), params={"server": server}, timeout=60)
    return r, time.monotonic() - started


def log_entries(weir) -> list[dict]:
    with open(weir.stderr_path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def test_a_slow_drip_ends_at_the_deadline_though_every_read_succeeds(start_weir, dns, test_ca):
    with SlowDripPeer(test_ca, ("drip.test",), "127.60.201.1", 0, interval=0.5) as drip:
        dns.add_a("drip.test", "127.60.201.1")
        weir = start_weir(settings(test_ca, dns))
        r, elapsed = remote_rooms(weir, f"drip.test:{drip.port}")
        assert (r.status_code, r.json()["errcode"]) == (504, "M_UNKNOWN")
        print(f"\nslow drip: 504 after {elapsed:.2f}s, {drip.bytes_sent} bytes dripped")
        assert DEADLINE - 0.5 <= elapsed < DEADLINE + 3
        assert drip.requests == 1 and drip.bytes_sent >= 2  # reads kept succeeding
        assert drip.wait_current(0, timeout=5)  # we closed our connection
        assert in_flight(weir.client_url, "client_outbound") == 0


def test_a_hanging_well_known_costs_half_the_deadline_and_logs_under_the_request(
    start_weir, dns, test_ca
):
    # hang.test has no port: discovery asks https://hang.test/.well-known/matrix/server
    # (which never answers), then finds a tarpit through SRV with what time is left.
    with (
        HangingPeer(test_ca, ("hang.test",), "127.60.202.1", 443) as hang,
        Tarpit("127.60.202.2", 0) as tarpit,
    ):
        dns.add_a("hang.test", "127.60.202.1")
        dns.add_a("tarpit.hang.test", "127.60.202.2")
        dns.add_srv("_matrix-fed._tcp.hang.test", "tarpit.hang.test", tarpit.port)
        weir = start_weir(settings(test_ca, dns))
        r, elapsed = remote_rooms(weir, "hang.test")
        assert r.status_code == 504, r.text
        assert DEADLINE - 0.5 <= elapsed < DEADLINE + 3
        assert hang.requests == 1  # the well-known request was read, and never answered
        assert tarpit.accepted == 1  # the rest of the deadline went to the SRV target
        assert hang.wait_current(0, timeout=5) and tarpit.wait_current(0, timeout=5)
        assert in_flight(weir.client_url, "client_outbound") == 0

        weir.wait_for_log(r"publicRooms\?server=hang.test 504")
        entries = log_entries(weir)
        access = next(
            e
            for e in entries
            if e["logger"] == "weir.access" and "server=hang.test" in e["message"]
        )
        well_known = next(e for e in entries if "well-known of hang.test" in e["message"])
        assert "timed out" in well_known["message"]
        # The discovery line is tagged with the id of the request it worked for.
        assert well_known["request_id"] == access["request_id"]
        # Lines logged outside any request carry none.
        assert "request_id" not in next(e for e in entries if "serving" in e["message"])
