"""The hostile-input corpus, replayed against the real server process on both listeners.

Every input is refused with a Matrix error (never a 5xx), logs no traceback, and stores
nothing: afterwards every user's /sync still answers 200, the account data and the room hold
only what honest requests put there, and the media store holds no partial file. The rules
live in homeserver/core/strict_json.py (encoding, surrogates, depth), rooms/pdu_checks.py (a
PDU too deep), api/auth.py (where a token may come from), http/middleware.py and logs.py
(what a log line may show), core/identifiers.py (server names) and the media service.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import time
from urllib.parse import quote

import pytest
import requests

from tests.media.images import bomb_png
from tests.peers.origins import OriginKeyServer, send_transaction
from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.remote_room import room_joined_by
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

V3 = "/_matrix/client/v3"
SEND = "/_matrix/federation/v1/send/"
SECRET = "s3cr3t-query-token"


def nested(depth: int, leaf: bytes = b"1") -> bytes:
    """An object `depth` levels deep: {"a":{"a":...}}."""
    return b'{"a":' * depth + leaf + b"}" * depth


def nested_value(depth: int) -> dict:
    return json.loads(nested(depth))


@pytest.fixture(scope="module")
def keys(test_ca, dns):
    with OriginKeyServer("hostile.test", test_ca, dns, host="127.31.101.3") as server:
        yield server


@pytest.fixture(scope="module")
def weir(test_ca, dns, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("hostile"))
    fed = federation_settings(test_ca, dns, remote_timeout=5)
    fed.update(tls_listener_settings(test_ca, "weir.test", "127.31.101.2", port=0))
    settings = merge(
        base_settings(os.path.join(directory, "data")),
        {
            "federation": fed,
            # The origin's own key fetch fits; a notary query for more servers does not.
            "security": {
                "federation": {
                    "key_resolution_per_ip_rate": {"max_requests": 2, "per_seconds": 3600}
                }
            },
        },
    )
    proc = WeirProcess(directory, settings).start()
    proc.data_dir = os.path.join(directory, "data")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def origin(keys):
    return keys.add_origin("o1")


def raw(url: str, method: str, body: bytes, verify=None, **headers) -> requests.Response:
    return requests.request(
        method,
        url,
        data=body,
        headers={"Content-Type": "application/json", **headers},
        verify=verify,
        timeout=30,
    )


def assert_error(r: requests.Response, status: int, errcode: str, what: str) -> None:
    assert (r.status_code, r.json().get("errcode")) == (status, errcode), (what, r.text)


SURROGATE_BODIES = {
    "raw UTF-8 lone surrogate": b'{"body": "a\xed\xa0\x80b", "msgtype": "m.text"}',
    "escaped lone surrogate": b'{"body": "a\\ud800b", "msgtype": "m.text"}',
    "UTF-16 with BOM": json.dumps({"body": "x", "msgtype": "m.text"}).encode("utf-16"),
    "UTF-16LE": json.dumps({"body": "x", "msgtype": "m.text"}).encode("utf-16-le"),
    "UTF-32": json.dumps({"body": "x", "msgtype": "m.text"}).encode("utf-32"),
    "UTF-8 BOM": b'\xef\xbb\xbf{"body": "x", "msgtype": "m.text"}',
}


def client_corpus(weir, alice, room_id: str):
    """(what, response, status, errcode) for every hostile input on the client listener."""
    me = quote(alice.user_id, safe="")
    room = quote(room_id, safe="")
    auth = {"Authorization": f"Bearer {alice.token}"}
    targets = {
        "account data": f"{V3}/user/{me}/account_data/x.hostile",
        "room account data": f"{V3}/user/{me}/rooms/{room}/account_data/x.hostile",
        "message": f"{V3}/rooms/{room}/send/m.room.message/",
        "state": f"{V3}/rooms/{room}/state/x.hostile/",
        "profile": f"{V3}/profile/{me}/displayname",
    }
    n = 0
    for target, path in targets.items():
        for what, body in SURROGATE_BODIES.items():
            n += 1
            url = weir.url(path + (f"t{n}" if path.endswith("/") else ""))
            yield f"{target}: {what}", raw(url, "PUT", body, **auth), 400, "M_NOT_JSON"
        for depth in (101, 150, 5000):
            n += 1
            url = weir.url(path + (f"t{n}" if path.endswith("/") else ""))
            yield (
                f"{target}: {depth} deep",
                raw(url, "PUT", nested(depth), **auth),
                400,
                ("M_BAD_JSON"),
            )
    for what, body in SURROGATE_BODIES.items():
        r = raw(weir.url(f"{V3}/register"), "POST", body)
        yield f"register: {what}", r, 400, "M_NOT_JSON"
    yield from admin_register_corpus(weir)
    yield from token_corpus(weir, alice)
    for name in ("..", "a..b", ".a", "a.", "a..b:8448"):
        alias = quote(f"#x:{name}", safe="")
        r = requests.get(weir.url(f"{V3}/directory/room/{alias}"))
        yield f"alias on server {name!r}", r, 400, "M_INVALID_PARAM"


def admin_register_corpus(weir):
    url = weir.url("/_synapse/admin/v1/register")
    for mac in ("é" * 40, "zz" * 20, "00" * 20 + "\n", "\ud83d\ude00"):
        nonce = requests.get(url).json()["nonce"]
        body = {"nonce": nonce, "username": "mallory", "password": "pw", "mac": mac}
        yield f"admin register mac {mac!r}", requests.post(url, json=body), 400, "M_INVALID_PARAM"


def token_corpus(weir, alice):
    whoami = weir.url(f"{V3}/account/whoami")
    auth = {"Authorization": f"Bearer {alice.token}"}
    r = requests.get(whoami, params={"access_token": alice.token}, headers=auth)
    yield "token in header and query", r, 401, "M_MISSING_TOKEN"
    r = requests.get(f"{whoami}?access_token={alice.token}&access_token={alice.token}")
    yield "two tokens in the query", r, 401, "M_MISSING_TOKEN"
    r = two_headers(weir.client_url, f"{V3}/account/whoami", "Authorization", auth["Authorization"])
    yield "two Authorization headers", r, 401, "M_MISSING_TOKEN"


class _Answer:
    """What assert_error reads of a response, from http.client."""

    def __init__(self, status: int, body: bytes):
        self.status_code = status
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.text)


def two_headers(base_url: str, path: str, name: str, value: str) -> _Answer:
    """A GET carrying the header twice, which `requests` cannot send."""
    host, port = base_url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", path)
        conn.putheader(name, value)
        conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return _Answer(response.status, response.read())
    finally:
        conn.close()


def federation_corpus(weir, test_ca, origin):
    verify = test_ca.ca_path
    # Parsed before the signature is checked: no signature makes these any less refused.
    auth = {"Authorization": origin.sign_request("weir.test", "PUT", f"{SEND}x", {})}
    for n, (what, body) in enumerate(SURROGATE_BODIES.items()):
        envelope = b'{"origin": "x", "pdus": [' + body + b"]}"
        if not what.startswith(("raw", "escaped")):
            envelope = json.dumps({"pdus": [json.loads(body.decode(_encoding(what)))]}).encode(
                _encoding(what)
            )
        r = raw(weir.fed_url(f"{SEND}s{n}"), "PUT", envelope, verify, **auth)
        yield f"/send: {what}", r, 400, "M_NOT_JSON"
    for depth in (201, 5000):
        r = raw(weir.fed_url(f"{SEND}d{depth}"), "PUT", nested(depth), verify, **auth)
        yield f"/send: body {depth} deep", r, 400, "M_BAD_JSON"
    r = raw(weir.fed_url("/_matrix/key/v2/query"), "POST", nested(5000), verify)
    yield "notary query: 5000 deep", r, 400, "M_BAD_JSON"
    r = raw(weir.fed_url("/_matrix/key/v2/query"), "POST", SURROGATE_BODIES["UTF-16LE"], verify)
    yield "notary query: UTF-16", r, 400, "M_NOT_JSON"
    servers = {f"nowhere{i}.hostile.test": {} for i in range(4)}
    r = requests.post(
        weir.fed_url("/_matrix/key/v2/query"), json={"server_keys": servers}, verify=verify
    )
    yield "notary over its rate", r, 429, "M_LIMIT_EXCEEDED"


def _encoding(what: str) -> str:
    return {"UTF-16 with BOM": "utf-16", "UTF-16LE": "utf-16-le", "UTF-32": "utf-32"}.get(
        what, "utf-8-sig"
    )


def abort_upload(weir, token: str) -> None:
    """Starts a 1 MB upload, sends 64 kB of it, and hangs up."""
    host, port = weir.client_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /_matrix/media/v3/upload?filename=half HTTP/1.1\r\n"
            b"Host: weir\r\nContent-Type: application/octet-stream\r\n"
            + f"Authorization: Bearer {token}\r\n".encode()
            + b"Content-Length: 1048576\r\n\r\n"
            + b"x" * 65536
        )
    weir.wait_for_log(r"POST /_matrix/media/v3/upload\?filename=half ")


def thumbnail_corpus(alice):
    def upload(data: bytes, content_type: str) -> str:
        r = alice.post(
            "/_matrix/media/v3/upload", data=data, headers={"Content-Type": content_type}
        )
        assert r.status_code == 200, r.text
        return r.json()["content_uri"].removeprefix("mxc://")

    for what, data, status, errcode in (
        ("not an image", b"plain text, said to be a PNG", 400, "M_UNKNOWN"),
        ("too large", bomb_png(8000, 8000), 413, "M_TOO_LARGE"),
    ):
        media = upload(data, "image/png")
        r = alice.get(
            f"/_matrix/client/v1/media/thumbnail/{media}",
            params={"width": 32, "height": 32, "method": "crop"},
        )
        yield f"thumbnail: {what}", r, status, errcode


def test_the_hostile_corpus_leaves_no_trace(weir, test_ca, origin):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    alice.user_id = alice.get(f"{V3}/account/whoami").json()["user_id"]
    bob = MatrixClient(weir.client_url)
    bob.register("bob")
    room, join_id = room_joined_by(weir, test_ca, alice, origin)
    before = [e["event_id"] for e in room.timeline()]

    for what, r, status, errcode in [
        *client_corpus(weir, alice, room.room_id),
        *federation_corpus(weir, test_ca, origin),
        *thumbnail_corpus(alice),
    ]:
        assert_error(r, status, errcode, what)

    # A PDU too deep is refused alone; its transaction and the PDU beside it go through.
    ids, pdus = room.messages(origin, "bob", ["fine"], prev=join_id)
    deep_id, deep = origin.pdu(
        room.room_id,
        origin.user("bob"),
        "m.room.message",
        {"msgtype": "m.text", "body": "deep", "x": nested_value(120)},
        prev_events=[join_id],
        auth_events=room.auth_for(origin.user("bob")),
        depth=room._next_depth(),
    )
    r = send_transaction(
        weir.federation_url, origin, "weir.test", "deep-pdu", [deep, *pdus], test_ca
    )
    assert r.status_code == 200, r.text
    answer = r.json()["pdus"]
    assert answer[ids[0]] == {}
    assert "nested deeper than" in answer[deep_id]["error"]

    abort_upload(weir, alice.token)

    # Nothing stored: the room holds the join and the one honest message, account data and
    # profile are as they were, and no partial upload is left behind.
    assert [e["event_id"] for e in room.timeline()] == [*before, ids[0]]
    for path in (
        f"{V3}/user/{quote(alice.user_id)}/account_data/x.hostile",
        f"{V3}/user/{quote(alice.user_id)}/rooms/{quote(room.room_id)}/account_data/x.hostile",
        f"{V3}/rooms/{quote(room.room_id)}/state/x.hostile/",
        f"{V3}/profile/{quote(alice.user_id)}/displayname",
    ):
        assert alice.get(path).status_code == 404, path
    assert os.listdir(os.path.join(weir.data_dir, "media", "tmp")) == []
    for user in (alice, bob):
        assert user.get(f"{V3}/sync").status_code == 200

    assert_log_clean(weir)


def assert_log_clean(weir) -> None:
    with open(weir.stderr_path, errors="replace") as f:
        log = f.read()
    assert "Traceback" not in log, log[log.find("Traceback") - 2000 :][:6000]
    statuses = re.findall(r"weir\.access(?: \[\w+\])?: [A-Z]+ \S+ (\d{3}|\w+) ", log)
    assert statuses and not [s for s in statuses if s.startswith("5")], statuses
    upload_lines = [line for line in log.splitlines() if "filename=half" in line]
    assert len(upload_lines) == 1, upload_lines


def test_more_than_100_headers_are_one_log_line(weir):
    # Both listeners serve through the same WeirHandler (homeserver/http/server.py).
    headers = "".join(f"X-H{i}: v\r\n" for i in range(120)).encode()
    request = b"GET /_matrix/client/versions HTTP/1.1\r\nHost: weir\r\n" + headers + b"\r\n"
    host, port = weir.client_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        head = sock.recv(65536)
    assert head.split(b" ")[1] in (b"400", b"431"), head
    time.sleep(0.5)  # nothing to wait on: the point is a line that must not appear
    with open(weir.stderr_path, errors="replace") as f:
        assert "Traceback" not in f.read()


def test_logs_cannot_be_forged_and_never_show_a_token(weir):
    alice = MatrixClient(weir.client_url)
    alice.register(f"carol{int(time.time() * 1000)}")
    forged = "%0a2099-01-01 00:00:00,000 INFO weir.access: GET /forged 200"
    requests.get(weir.url(f"/_matrix/client/v3/nothing{forged}%1b[31m"))
    line = weir.wait_for_log(r"/_matrix/client/v3/nothing")
    assert "\\n2099-01-01" in line and "\\x1b[31m" in line
    with open(weir.stderr_path, errors="replace") as f:
        assert not [x for x in f if x.startswith("2099-01-01")]

    # http.client sends the query as written (requests would decode %5F to _ first).
    host, port = weir.client_url.removeprefix("http://").rsplit(":", 1)
    for n, key in enumerate(("access_token", "access%5Ftoken", "%61ccess_token", "access%5ftoken")):
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", f"{V3}/account/whoami?{key}={alice.token}&marker=m{n}")
        status = conn.getresponse().status
        conn.close()
        assert status == 200, key
        line = weir.wait_for_log(f"marker=m{n} ")
        assert alice.token not in line and "<redacted>" in line, line
