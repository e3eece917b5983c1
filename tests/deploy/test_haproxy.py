"""Real HAProxy in front of the real server, with deploy/haproxy.cfg rendered for loopback
(tests/support/haproxy.py): client keys, federation through the 8448 frontend, the /metrics
refusal, and a SIGTERM under load.

Clients are loopback addresses of their own (127.0.0.10-19). HAProxy reaches Weir from
127.0.0.1, the only address in Weir's `trusted_proxies`, as the balancer's fixed address is
in deploy/weir.toml.
"""

import collections
import http.client
import json
import os
import re
import ssl
import time
import tomllib
from urllib.parse import urlsplit

import gevent
import pytest
import requests

from tests.peers.honest import HonestPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import federation_settings
from tests.support.haproxy import (
    DEPLOY_CONFIG,
    HAProxy,
    RenderError,
    client_from,
    render_config,
)
from tests.support.metrics import in_flight, wait_for_metric
from tests.support.server import REPO, MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"
BUDGET = "client_outbound"
LB_SOURCE = "127.0.0.1"  # where HAProxy's connections to Weir come from
CLIENTS = [f"127.0.0.{i}" for i in range(10, 20)]
TARPIT_IP = "127.47.0.2"
ORIGIN_IP = "127.47.0.3"
HAPROXY_503 = b"No server is available to handle this request."
CONTAINER_CONFIG = os.path.join(REPO, "docker", "config.toml")


def weir_settings(directory: str, test_ca, dns, **http) -> dict:
    return merge(
        base_settings(os.path.join(directory, "data")),
        {
            "server": {"http": {"trusted_proxies": [f"{LB_SOURCE}/32"], **http}},
            "federation": federation_settings(test_ca, dns),
        },
    )


def start_stack(directory: str, test_ca, dns, binary: str, check_inter=None, **http):
    weir = WeirProcess(directory, weir_settings(directory, test_ca, dns, **http)).start()
    try:
        lb = HAProxy(
            directory,
            test_ca,
            client=weir.client_url,
            federation=weir.federation_url,
            check_inter=check_inter,
            binary=binary,
        ).start()
    except BaseException:
        weir.stop()
        raise
    return weir, lb


@pytest.fixture(scope="module")
def stack(haproxy_bin, test_ca, dns, tmp_path_factory):
    """One Weir behind one HAProxy. main_pool_size 20: ADR-0079's global cap is 10."""
    weir, lb = start_stack(
        str(tmp_path_factory.mktemp("behind-haproxy")), test_ca, dns, haproxy_bin, main_pool_size=20
    )
    yield weir, lb
    lb.stop()
    weir.stop()


@pytest.fixture(scope="module")
def origin(test_ca, dns):
    """Another server, whose keys Weir fetches to check its X-Matrix signatures."""
    dns.add_a("origin.lb.test", ORIGIN_IP)
    with HonestPeer("origin.lb.test", test_ca, host=ORIGIN_IP, port=8448) as peer:
        yield peer


def raw_request(
    base_url: str,
    method: str,
    target: str,
    *,
    source_ip: str,
    ca_path: str,
    headers: dict | None = None,
    body: bytes | None = None,
):
    """(status, body) of one request whose target goes out exactly as written: requests
    (urllib3) would re-encode it, and a signature covers it byte for byte."""
    parts = urlsplit(base_url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            parts.hostname,
            parts.port,
            timeout=30,
            source_address=(source_ip, 0),
            context=ssl.create_default_context(cafile=ca_path),
        )
    else:
        conn = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=30, source_address=(source_ip, 0)
        )
    try:
        conn.request(method, target, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def assert_refused_at_once(response):
    assert response.status_code == 429, response.text
    assert response.json()["errcode"] == "M_LIMIT_EXCEEDED"
    assert response.headers["Retry-After"] == "1"


# -- the rendering -------------------------------------------------------------------------

RENDER_ARGS = {
    "client_bind": "fd@3",
    "federation_bind": "fd@4",
    "client_servers": ["127.0.0.1:1001"],
    "federation_servers": ["127.0.0.1:1002"],
    "certs": "/tmp/certs",
    "stats_socket": "/tmp/s.sock",
    "max_fds": 20000,
    "check_inter": "200ms",
}


def test_rendering_changes_only_addresses_limits_and_check_intervals():
    with open(DEPLOY_CONFIG) as f:
        source = f.read().splitlines()
    rendered = render_config("\n".join(source), **RENDER_ARGS).splitlines()
    removed = [line.split()[0] for line in source if line not in rendered]
    added = [line.split()[0:2] for line in rendered if line not in source]
    # deploy/ has three instances in each of its three backends; this test renders one.
    assert sorted(removed) == ["bind"] * 2 + ["default-server"] * 3 + ["maxconn"] + ["server"] * 9
    assert sorted(added) == [
        ["bind", "fd@3"],
        ["bind", "fd@4"],
        *[["default-server", "check"]] * 3,
        ["maxconn", "9900"],
        *[["server", "weir-1"]] * 3,
        ["stats", "socket"],
    ]
    defaults = [line for line in rendered if line.strip().startswith("default-server")]
    assert all(" inter 200ms fastinter 200ms " in line for line in defaults), defaults


def test_rendering_points_each_backend_at_every_instance():
    with open(DEPLOY_CONFIG) as f:
        source = f.read()
    instances = {"client_servers": [], "federation_servers": []}
    for n in range(4):  # one more than deploy/ has: the rendering follows the test
        instances["client_servers"].append(f"127.0.0.1:{2000 + n}")
        instances["federation_servers"].append(f"127.0.0.1:{3000 + n}")
    rendered = render_config(source, **{**RENDER_ARGS, **instances})
    servers = [
        line.split()[1:3] for line in rendered.splitlines() if line.strip().startswith("server ")
    ]
    client = [[f"weir-{n + 1}", f"127.0.0.1:{2000 + n}"] for n in range(4)]
    federation = [[f"weir-{n + 1}", f"127.0.0.1:{3000 + n}"] for n in range(4)]
    assert servers == client + client + federation  # the client and sync backends, then 8448


@pytest.mark.parametrize(
    "old, new",
    [
        ("server weir-2 weir-2:8008", "server app weir-2:8008"),  # a renamed server
        ("bind :8448 ", "bind :8443 "),  # a moved frontend
        ("    maxconn 20000\n", ""),  # no global maxconn
        ("global\n", "global\n    stats socket /x\nglobal\n"),  # two global sections
    ],
)
def test_rendering_fails_loudly_when_the_deployed_config_changes_shape(old, new):
    with open(DEPLOY_CONFIG) as f:
        source = f.read()
    assert old in source
    with pytest.raises(RenderError):
        render_config(source.replace(old, new, 1), **RENDER_ARGS)


# -- the client key --------------------------------------------------------------------------


def test_every_client_behind_haproxy_is_keyed_by_its_own_address(stack, dns, test_ca):
    weir, lb = stack
    dns.add_a("tarpit.lb.test", TARPIT_IP)

    def lookup(ip: str, limit: int, headers: dict | None = None):
        # Ten clients, ten different queries: nothing is shared, so each needs a slot.
        with client_from(ip, test_ca.ca_path) as session:
            return session.get(
                lb.client_url + f"{V3}/publicRooms",
                headers=headers,
                params={"server": "tarpit.lb.test:8448", "limit": limit},
                timeout=60,
            )

    with Tarpit(TARPIT_IP, 8448) as tarpit:
        held = [gevent.spawn(lookup, ip, n + 1) for n, ip in enumerate(CLIENTS[:9])]
        assert tarpit.wait_accepted(9, timeout=30), tarpit
        assert in_flight(weir.client_url, BUDGET) == 9

        # A client that holds a slot forges X-Forwarded-For. HAProxy appends the address
        # it saw, Weir believes only that hop: the client keeps its own key, whose one slot
        # is taken. (Keyed by the forged address it would have been admitted: one global
        # slot is still free.)
        forged = lookup(CLIENTS[0], 50, headers={"X-Forwarded-For": "198.51.100.7"})
        assert_refused_at_once(forged)
        weir.wait_for_log(r"publicRooms\?\S*limit=50 429 \S+ 127\.0\.0\.10$")

        held.append(gevent.spawn(lookup, CLIENTS[9], 10))
        assert tarpit.wait_accepted(10, timeout=30), tarpit
        assert in_flight(weir.client_url, BUDGET) == 10
        assert not any(call.ready() for call in held)  # ten admitted, none refused
        # The per-client cap (1) for one of them, then the global cap (10) for a newcomer.
        assert_refused_at_once(lookup(CLIENTS[9], 60))
        assert_refused_at_once(lookup("127.0.0.20", 70))
        assert tarpit.accepted == 10 and tarpit.max_concurrent == 10
    # The tarpit hangs up on everyone: the held lookups end, and their slots come back.
    gevent.joinall(held, timeout=30)
    assert [call.value.status_code for call in held] == [502] * 10
    wait_for_metric(weir.client_url, "weir_budget_in_flight", 0, timeout=10, budget=BUDGET)
    # Weir logged each under its own address, the one the client connected from.
    for n, ip in enumerate(CLIENTS):
        weir.wait_for_log(rf"publicRooms\?\S*limit={n + 1} 502 \S+ {re.escape(ip)}$")
    print(
        f"\n10 clients through HAProxy: 10 admitted, tarpit held {tarpit.max_concurrent} "
        "connections at once; a forged X-Forwarded-For kept its own key (429)"
    )


# -- federation through the 8448 frontend ----------------------------------------------------


def test_x_matrix_signatures_verify_through_haproxy(stack, test_ca, origin):
    weir, lb = stack
    alice = MatrixClient(lb.client_url)
    alice.session = client_from(CLIENTS[0], test_ca.ca_path)
    alice.register("alice")
    r = alice.put(f"{V3}/profile/@alice:weir.test/displayname", json={"displayname": "Alice"})
    assert r.status_code == 200, r.text

    def signed(base_url, method, target, content=None):
        headers = {"Authorization": origin.sign_request("weir.test", method, target, content)}
        body = None
        if content is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(content).encode()
        return raw_request(
            base_url,
            method,
            target,
            source_ip=ORIGIN_IP,
            ca_path=test_ca.ca_path,
            headers=headers,
            body=body,
        )

    # Lower-case and needless escapes (%3a, %2e, %7e): a proxy that normalised the target
    # would break the signature, which covers it as the origin sent it.
    profile = (
        "/_matrix/federation/v1/query/profile?user_id=%40alice%3aweir%2etest&field=displayname"
    )
    for frontend in (lb.federation_url, lb.client_url):  # 8448, and 443 by path
        status, body = signed(frontend, "GET", profile)
        assert (status, json.loads(body)) == (200, {"displayname": "Alice"}), body
    send = "/_matrix/federation/v1/send/lb%3atxn%201%7e"
    content = {
        "origin": origin.server_name,
        "origin_server_ts": int(time.time() * 1000),
        "pdus": [],
    }
    status, body = signed(lb.federation_url, "PUT", send, content)
    assert (status, json.loads(body)) == (200, {"pdus": {}}), body
    weir.wait_for_log(r"PUT /_matrix/federation/v1/send/lb:txn 1~ 200 .* origin=origin\.lb\.test")

    # The control: the same request, its target normalised on the way, is refused.
    auth = origin.sign_request("weir.test", "GET", profile)
    status, body = raw_request(
        lb.federation_url,
        "GET",
        profile.replace("%3a", "%3A"),
        source_ip=ORIGIN_IP,
        ca_path=test_ca.ca_path,
        headers={"Authorization": auth},
    )
    assert (status, json.loads(body)["errcode"]) == (401, "M_UNAUTHORIZED")


# -- /metrics --------------------------------------------------------------------------------

# Every target here reaches Weir's /metrics when sent to it directly.
METRICS_TARGETS = [
    "/metrics",
    "/metrics?name=x",
    "/metrics/",
    "//metrics",
    "/%6detrics",
    "/%6Detrics",
]
# An escaped `/` is no separator to Weir (http/routing.py): these are not its /metrics.
ESCAPED_SLASH_TARGETS = ["/metrics%2F", "/%2fmetrics"]


@pytest.mark.parametrize("target", METRICS_TARGETS + ESCAPED_SLASH_TARGETS)
def test_metrics_is_refused_through_the_balancer(stack, test_ca, target):
    weir, lb = stack
    # Weir would serve this client (127.0.0.0/8 may scrape): the balancer is what refuses.
    status, body = raw_request(
        weir.client_url, "GET", target, source_ip=CLIENTS[0], ca_path=test_ca.ca_path
    )
    if target in ESCAPED_SLASH_TARGETS:
        assert status == 404 and b"M_UNRECOGNIZED" in body, (status, body[:80])
    else:
        assert status == 200 and body.startswith(b"# HELP"), (status, body[:80])
    for frontend in (lb.client_url, lb.federation_url):
        status, body = raw_request(
            frontend, "GET", target, source_ip=CLIENTS[0], ca_path=test_ca.ca_path
        )
        assert status == 404, (frontend, status, body[:80])
        assert b"404 Not Found" in body and b"weir_" not in body  # HAProxy's page, not Weir's


# -- SIGTERM under load ----------------------------------------------------------------------

DRAIN_CLIENTS = 50
# Weir goes on serving this long after SIGTERM while /health answers 503. HAProxy, rendered
# with 200 ms check intervals, marks it down after 3 failed checks (~0.6 s); 3 s leaves room
# on a loaded machine.
DRAIN_DELAY = 3.0


def test_sigterm_under_load_loses_no_request(haproxy_bin, test_ca, dns, tmp_path):
    weir, lb = start_stack(
        str(tmp_path),
        test_ca,
        dns,
        haproxy_bin,
        check_inter="200ms",
        shutdown_drain_delay=DRAIN_DELAY,
    )
    try:
        figures = run_drain(weir, lb, test_ca)
    finally:
        lb.stop()
        weir.stop()
    assert figures["weir exit code"] == 0


def test_the_images_own_config_drains_under_load(haproxy_bin, test_ca, dns, tmp_path):
    """docker/config.toml as the image ships it (its drain delay and every default), behind
    deploy/haproxy.cfg with its deployed check intervals: SIGTERM under load, no reset and
    no 502. Only what cannot run here is changed: addresses, the data folder, the database."""
    with open(CONTAINER_CONFIG, "rb") as f:
        shipped = tomllib.load(f)
    assert shipped["server"]["http"]["shutdown_drain_delay"] > 0
    shipped.pop("database")  # /data/homeserver.db: the test's data folder instead
    for listener in (shipped["server"]["http"], shipped["federation"]):
        listener["bind_address"] = "127.0.0.1"
    directory = str(tmp_path)
    settings = merge(shipped, weir_settings(directory, test_ca, dns))
    weir = WeirProcess(directory, settings).start()
    try:
        lb = HAProxy(
            directory,
            test_ca,
            client=weir.client_url,
            federation=weir.federation_url,
            binary=haproxy_bin,
        ).start()
    except BaseException:
        weir.stop()
        raise
    try:
        figures = run_drain(weir, lb, test_ca)
    finally:
        lb.stop()
        weir.stop()
    assert figures["weir exit code"] == 0


def run_drain(weir: WeirProcess, lb: HAProxy, test_ca) -> dict:
    calls = []  # [started, finished, outcome]: a status, or the exception
    stop_load = False

    def client(i: int) -> None:
        # A keep-alive client of its own; it stops at its first 503 (nobody is serving).
        with client_from(CLIENTS[i % len(CLIENTS)], test_ca.ca_path) as session:
            while not stop_load:
                call = [time.monotonic(), None, None]
                calls.append(call)
                try:
                    r = session.get(lb.client_url + "/_matrix/client/versions", timeout=30)
                    call[2] = r.status_code
                    if r.status_code == 503 and HAPROXY_503 in r.content:
                        call[2] = "503 from HAProxy"
                except requests.RequestException as e:  # a reset: counted, and fails the test
                    call[2] = f"{type(e).__name__}: {e}"
                call[1] = time.monotonic()
                if call[2] != 200:
                    return

    clients = [gevent.spawn(client, i) for i in range(DRAIN_CLIENTS)]
    try:
        # Under way: every client has had answers, so each has its keep-alive connections.
        with gevent.Timeout(60, AssertionError("the load never got going")):
            while sum(1 for c in calls if c[2] == 200) < DRAIN_CLIENTS * 4:
                gevent.sleep(0.01)
        assert not any(c.ready() for c in clients), [c[2] for c in calls if c[2] != 200]
        sigterm_at = time.monotonic()
        weir.proc.terminate()
        in_flight_at_sigterm = [c for c in calls if c[0] < sigterm_at and c[1] is None]
        down_after = lb.wait_for(
            lambda: lb.server("client").get("status") == "DOWN",
            30,
            "HAProxy never marked the server down",
        )
        check = lb.server("client")
        weir_up_when_marked_down = weir.proc.poll() is None
        gevent.joinall(clients, timeout=30)
    finally:
        stop_load = True
        gevent.joinall(clients, timeout=30)
    exit_code = weir.proc.wait(30)

    outcomes = collections.Counter(c[2] for c in calls)
    before = collections.Counter(c[2] for c in calls if c[0] < sigterm_at)
    figures = {
        "clients": DRAIN_CLIENTS,
        "in flight at SIGTERM": len(in_flight_at_sigterm),
        "of which completed 200": sum(1 for c in in_flight_at_sigterm if c[2] == 200),
        "served 200 after SIGTERM (draining)": sum(
            1 for c in calls if c[0] >= sigterm_at and c[2] == 200
        ),
        "503 from HAProxy (server down)": outcomes["503 from HAProxy"],
        "502": outcomes[502],
        "resets and other errors": sum(
            n for o, n in outcomes.items() if o not in (200, "503 from HAProxy", 502)
        ),
        "marked down after (s)": round(down_after, 2),
        "down by": f"{check['check_status']} {check['check_code']}",
        "requests in all": len(calls),
        "weir exit code": exit_code,
    }
    print("\ndrain figures: " + ", ".join(f"{k}: {v}" for k, v in figures.items()))
    assert set(outcomes) <= {200, "503 from HAProxy"}, outcomes  # no reset, no 502
    assert set(before) == {200}, before  # everything sent before SIGTERM was served
    assert figures["in flight at SIGTERM"] > 0
    assert figures["of which completed 200"] == figures["in flight at SIGTERM"]
    # Marked down because /health answered 503 while Weir still served, not because a
    # connection was refused: the listeners closed only after HAProxy stopped sending.
    assert figures["down by"] == "L7STS 503" and weir_up_when_marked_down, check
    return figures
