"""Error shapes, CORS, health and discovery, against the real server process."""

import email.utils
import socket
import time

import requests

V3 = "/_matrix/client/v3"


def test_versions_and_well_known(weir):
    versions = requests.get(weir.url("/_matrix/client/versions")).json()["versions"]
    assert versions[:8] == ["r0.0.1", "r0.1.0", "r0.2.0", "r0.3.0", "r0.4.0", "r0.5.0"] + [
        "r0.6.0",
        "r0.6.1",
    ]
    assert versions[8:] == [f"v1.{minor}" for minor in range(1, 17)]
    client = requests.get(weir.url("/.well-known/matrix/client")).json()
    assert client == {"m.homeserver": {"base_url": "http://127.0.0.1/"}}
    server = requests.get(weir.url("/.well-known/matrix/server")).json()
    assert server["m.server"].startswith("weir.test:")


def test_health_needs_no_auth(weir):
    r = requests.get(weir.url("/health"))
    assert r.status_code == 200


def test_unknown_path_and_wrong_method(weir):
    r = requests.get(weir.url("/_matrix/client/v3/nothing/here"))
    assert (r.status_code, r.json()["errcode"]) == (404, "M_UNRECOGNIZED")
    r = requests.delete(weir.url(f"{V3}/login"))
    assert (r.status_code, r.json()["errcode"]) == (405, "M_UNRECOGNIZED")
    # The federation API is not served on the client listener.
    r = requests.get(weir.url("/_matrix/key/v2/server"))
    assert r.status_code == 404


def test_bad_json_and_missing_fields(weir):
    r = requests.post(
        weir.url(f"{V3}/login"), data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert (r.status_code, r.json()["errcode"]) == (400, "M_NOT_JSON")
    r = requests.post(weir.url(f"{V3}/login"), json=[1, 2])
    assert (r.status_code, r.json()["errcode"]) == (400, "M_NOT_JSON")
    r = requests.post(weir.url(f"{V3}/login"), json={"password": "x"})
    assert (r.status_code, r.json()["errcode"]) == (400, "M_MISSING_PARAM")
    assert "type" in r.json()["error"]
    r = requests.post(weir.url(f"{V3}/login"), json={"type": 5})
    assert (r.status_code, r.json()["errcode"]) == (400, "M_BAD_JSON")
    assert "type" in r.json()["error"]


def test_json_nested_too_deep_is_bad_json_on_either_listener(weir):
    # 3,000 levels in 6 kB: past what the parser recurses into, and past any body's limit.
    deep = b'{"type": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    r = requests.post(
        weir.url(f"{V3}/login"), data=deep, headers={"Content-Type": "application/json"}
    )
    assert (r.status_code, r.json()["errcode"]) == (400, "M_BAD_JSON")
    # A federation body is read only once the origin has a key: a stranger's transaction is
    # refused at its head, its body never parsed (tests/federation/test_hostile_peer.py has
    # a known origin's deep body).
    r = requests.put(
        weir.fed_url("/_matrix/federation/v1/send/t1"),
        data=deep,
        headers={
            "Content-Type": "application/json",
            "Authorization": 'X-Matrix origin="stranger.test",key="ed25519:a",sig="c2ln"',
        },
    )
    assert (r.status_code, r.json()["errcode"]) == (401, "M_UNAUTHORIZED")


def test_a_lone_surrogate_is_not_json(weir):
    # "\ud800" alone names no character: it has no UTF-8 form, so it could be neither hashed
    # (canonical JSON is UTF-8) nor sent back to any client.
    r = requests.post(
        weir.url(f"{V3}/register"),
        data=b'{"username": "lone", "password": "pass\\ud800word", '
        b'"auth": {"type": "m.login.dummy"}}',
        headers={"Content-Type": "application/json"},
    )
    assert (r.status_code, r.json()["errcode"]) == (400, "M_NOT_JSON")
    # A surrogate pair is one character, and fine.
    r = requests.post(
        weir.url(f"{V3}/register"),
        data=b'{"username": "paired", "password": "pass\\ud83d\\ude00word", '
        b'"auth": {"type": "m.login.dummy"}}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text


def test_nan_and_infinity_are_not_json(weir, client):
    # Python's parser takes them (1e999 it reads as infinity); JSON has no such numbers.
    # Kept, they would be served back verbatim in /sync, which no strict JSON parser (a
    # browser's) can read.
    client.register("nan")
    me = client.get(f"{V3}/account/whoami").json()["user_id"]
    for constant in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        r = client.put(
            f"{V3}/user/{me}/account_data/x.numbers",
            data=b'{"n": ' + constant + b"}",
            headers={"Content-Type": "application/json"},
        )
        assert (r.status_code, r.json().get("errcode")) == (400, "M_NOT_JSON"), constant
    r = client.get(f"{V3}/user/{me}/account_data/x.numbers")
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")


def test_oversized_json_body_is_refused(weir):
    r = requests.post(
        weir.url(f"{V3}/login"),
        data=b"{" + b" " * (2 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert (r.status_code, r.json()["errcode"]) == (413, "M_TOO_LARGE")


def test_auth_errors(weir):
    r = requests.get(weir.url(f"{V3}/account/whoami"))
    assert (r.status_code, r.json()["errcode"]) == (401, "M_MISSING_TOKEN")
    r = requests.get(weir.url(f"{V3}/account/whoami"), headers={"Authorization": "Bearer nope"})
    assert (r.status_code, r.json()["errcode"]) == (401, "M_UNKNOWN_TOKEN")


def test_cors_headers_and_preflight(weir):
    r = requests.options(
        weir.url(f"{V3}/account/whoami"),
        headers={"Origin": "https://app.element.io", "Access-Control-Request-Method": "GET"},
    )
    assert r.status_code == 204
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
    assert "PUT" in r.headers["Access-Control-Allow-Methods"]
    r = requests.get(weir.url("/_matrix/client/versions"))
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    r = requests.get(weir.url("/nowhere"))
    assert r.headers["Access-Control-Allow-Origin"] == "*"


def test_access_log_has_request_id_status_and_redacted_token(weir):
    requests.get(weir.url(f"{V3}/account/whoami"), params={"access_token": "sekrit-token"})
    weir.stop()
    log = open(weir.stderr_path).read()
    line = next(ln for ln in log.splitlines() if "/account/whoami" in ln)
    assert "sekrit-token" not in log
    assert "access_token=<redacted>" in line
    assert " 401 " in line and "GET" in line and "127.0.0.1" in line and "ms" in line


def test_sigterm_exits_zero_after_in_flight_requests(weir):
    assert requests.get(weir.url("/health")).status_code == 200
    assert weir.stop() == 0


def test_sigterm_fails_health_first_while_still_serving(start_weir):
    """server.http.shutdown_drain_delay: a load balancer sees /health answer 503 while the
    server still serves, and stops sending before the listeners close. Every response says
    Connection: close, so the balancer never reuses a connection that is about to close
    (tests/deploy/test_haproxy.py runs this behind HAProxy)."""
    weir = start_weir({"server": {"http": {"shutdown_drain_delay": 4}}})
    session = requests.Session()
    assert session.get(weir.url("/health")).status_code == 200  # a keep-alive connection
    weir.proc.terminate()
    weir.wait_for_log("shutdown: /health answers 503")
    health = session.get(weir.url("/health"), timeout=10)  # on that idle connection
    assert (health.status_code, health.json()) == (503, {"status": "stopping"})
    assert health.headers["Connection"] == "close"
    versions = requests.get(weir.url("/_matrix/client/versions"), timeout=10)  # a new one
    assert versions.status_code == 200 and versions.headers["Connection"] == "close"
    assert weir.proc.wait(30) == 0


def test_idle_keepalive_connection_is_closed(start_weir):
    weir = start_weir({"server": {"http": {"keepalive_timeout": 0.5}}})
    host, port = weir.client_url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        received = b""
        started = time.monotonic()
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        # The server answered, then closed the idle connection: recv saw EOF.
        assert received.startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 10


def test_handler_sets_tcp_nodelay_on_accepted_sockets():
    # pywsgi never sets it, and keep-alive responses then wait ~40 ms for a delayed ACK.

    from homeserver.http.places import WorkPool
    from homeserver.http.server import WeirWSGIServer

    def app(environ, start_response):
        nodelay = environ["weir.socket"].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(nodelay).encode()]

    server = WeirWSGIServer(("127.0.0.1", 0), app, pool=WorkPool(4), keepalive_timeout=5)
    server.start()
    try:
        session = requests.Session()
        url = f"http://127.0.0.1:{server.server_port}/"
        assert [session.get(url).text for _ in range(2)] == ["1", "1"]
    finally:
        server.stop()


def _raw_exchange(url: str, request: bytes, timeout: float = 30) -> bytes:
    """Sends `request` on a new connection and reads until the server closes it."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request)
        sock.settimeout(timeout)  # far less than the 75 s keep-alive a full drain would wait
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_a_refused_body_is_not_read_to_its_end(weir):
    """A client announcing 10 GB to /login gets 413 at once, and the connection closes
    instead of the server reading (or waiting for) the rest on a main-pool greenlet."""
    received = _raw_exchange(
        weir.client_url,
        (
            b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: weir.test\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n" + b" " * 1000
        ),
    )
    assert received.startswith(b"HTTP/1.1 413 ")
    assert b"M_TOO_LARGE" in received and b"Connection: close" in received


def test_a_refused_chunked_body_closes_the_connection(weir):
    # A chunked body has no announced end: the server cannot know what draining would cost.
    # One chunk just over the 1 MiB JSON cap arrives whole; the body never ends.
    size = 1024 * 1024 + 10
    received = _raw_exchange(
        weir.client_url,
        (
            b"POST /_matrix/client/v3/login HTTP/1.1\r\nHost: weir.test\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{size:x}\r\n".encode()
            + b" " * size
            + b"\r\n"
        ),
    )
    assert received.startswith(b"HTTP/1.1 413 ")
    assert b"Connection: close" in received


def test_a_refused_body_of_modest_size_keeps_the_connection(weir):
    # An honest client that sent a little too much gets its answer on a connection it keeps.
    session = requests.Session()
    r = session.post(
        weir.url(f"{V3}/login"),
        data=b"{" + b" " * (2 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert (r.status_code, r.json()["errcode"]) == (413, "M_TOO_LARGE")
    assert r.headers.get("Connection") != "close"
    assert session.get(weir.url("/health")).status_code == 200


def test_every_answer_has_a_current_date_and_a_whole_body(weir):
    """The Date header is formatted once a second, and a small body goes out with its head
    (http/server.py): both must still be what HTTP says, answer after answer."""
    host, port = weir.client_url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        reader = sock.makefile("rb")
        for _ in range(3):
            before = time.time()
            sock.sendall(b"GET /_matrix/client/versions HTTP/1.1\r\nHost: weir\r\n\r\n")
            assert reader.readline().startswith(b"HTTP/1.1 200")
            headers = {}
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                headers[name.lower()] = value.strip()
            body = reader.read(int(headers["content-length"]))
            assert b'"versions"' in body
            sent = email.utils.parsedate_to_datetime(headers["date"]).timestamp()
            assert int(before) <= sent <= time.time()
