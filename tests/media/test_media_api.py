"""The media repository over HTTP, against real server processes.

Two servers are shared by the module: `frozen`, with the defaults (new media is authenticated,
so the legacy endpoints refuse it), and `legacy`, with authenticated media off and a small
upload cap.
"""

import hashlib
import http.client
import io
import json
import os
import socket
import uuid

import gevent
import pytest
from PIL import Image

from homeserver.media.service import MAX_STORED_THUMBNAILS
from tests.media.images import animated_gif, bomb_png, solid
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge

CLIENT = "/_matrix/client/v1/media"
LEGACY = "/_matrix/media/v3"
LEGACY_CAP = 100_000

CSP = (
    "sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf; "
    "style-src 'unsafe-inline'; object-src 'self';"
)


def _server(tmp_path_factory, name: str, overrides: dict):
    directory = tmp_path_factory.mktemp(name)
    settings = merge(base_settings(str(directory / "data")), overrides)
    proc = WeirProcess(str(directory), settings).start()
    proc.media_root = os.path.join(str(directory), "data", "media")
    return proc


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    proc = _server(tmp_path_factory, "frozen", {})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    proc = _server(
        tmp_path_factory,
        "legacy",
        {"media": {"enable_authenticated_media": False, "max_upload_size": LEGACY_CAP}},
    )
    yield proc
    proc.stop()


def new_user(server) -> MatrixClient:
    client = MatrixClient(server.client_url)
    client.register("u" + uuid.uuid4().hex[:10])
    return client


@pytest.fixture
def alice(frozen):
    return new_user(frozen)


def upload(client, data: bytes, content_type: str, filename: str | None = None) -> str:
    params = {"filename": filename} if filename else {}
    r = client.post(
        f"{LEGACY}/upload", params=params, data=data, headers={"Content-Type": content_type}
    )
    assert r.status_code == 200, r.text
    uri = r.json()["content_uri"]
    assert uri.startswith("mxc://weir.test/")
    return uri[len("mxc://") :]  # "weir.test/<media id>"


def error(response) -> tuple[int, str]:
    return response.status_code, response.json()["errcode"]


def memory_kb(server) -> dict[str, int]:
    with open(f"/proc/{server.proc.pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM")}


def files_under(root: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names
    )


def assert_media_headers(response, content_type: str, disposition: str):
    assert response.headers["Content-Type"] == content_type
    assert response.headers["Content-Disposition"] == disposition
    assert response.headers["Content-Security-Policy"] == CSP
    assert response.headers["Cross-Origin-Resource-Policy"] == "cross-origin"
    assert "max-age=31536000" in response.headers["Cache-Control"]
    assert response.headers["Access-Control-Allow-Origin"] == "*"


# --- upload and download -------------------------------------------------------------------


def test_upload_then_download_through_both_apis(legacy):
    client = new_user(legacy)
    data = b"hello world\n" * 100
    mxc = upload(client, data, "text/plain", "hello.txt")

    authed = client.get(f"{CLIENT}/download/{mxc}")
    anonymous = MatrixClient(legacy.client_url).get(f"{LEGACY}/download/{mxc}")
    for r in (authed, anonymous):
        assert r.status_code == 200 and r.content == data
        assert_media_headers(r, "text/plain; charset=utf-8", "inline; filename=hello.txt")
        assert r.headers["Content-Length"] == str(len(data))

    # The file name in the path wins, RFC 6266-encoded when it is not a plain token.
    renamed = client.get(f"{CLIENT}/download/{mxc}/Résumé 2026.txt")
    assert renamed.content == data
    assert (
        renamed.headers["Content-Disposition"]
        == "inline; filename*=utf-8''R%C3%A9sum%C3%A9%202026.txt"
    )

    # A type off the spec's safe list is an attachment, whatever its name.
    page = upload(client, b"<script>alert(1)</script>", "text/html", "page.html")
    r = MatrixClient(legacy.client_url).get(f"{LEGACY}/download/{page}")
    assert_media_headers(r, "text/html; charset=utf-8", "attachment; filename=page.html")

    # No Content-Type: application/octet-stream, an attachment.
    raw = client.post(f"{LEGACY}/upload", data=b"\x00\x01", headers={"Content-Type": ""})
    r = client.get(f"{CLIENT}/download/{raw.json()['content_uri'][6:]}")
    assert_media_headers(r, "application/octet-stream", "attachment")


def test_legacy_endpoints_refuse_media_stored_after_the_freeze(frozen, alice):
    mxc = upload(alice, solid(100, 100), "image/png", "a.png")
    assert alice.get(f"{CLIENT}/download/{mxc}").status_code == 200
    anonymous = MatrixClient(frozen.client_url)
    assert error(anonymous.get(f"{LEGACY}/download/{mxc}")) == (404, "M_NOT_FOUND")
    assert error(
        anonymous.get(f"{LEGACY}/thumbnail/{mxc}", params={"width": 32, "height": 32})
    ) == (404, "M_NOT_FOUND")
    # Authentication does not unlock the legacy endpoints: the media is frozen out of them.
    assert error(alice.get(f"{LEGACY}/download/{mxc}")) == (404, "M_NOT_FOUND")
    # Not even pending media makes a legacy request wait (the client gives up well before
    # the 60 s the server would otherwise wait).
    pending = alice.post("/_matrix/media/v1/create").json()["content_uri"][len("mxc://") :]
    r = anonymous.get(f"{LEGACY}/download/{pending}", params={"timeout_ms": 60000}, timeout=10)
    assert error(r) == (404, "M_NOT_FOUND")


def test_client_v1_media_needs_authentication(frozen, alice):
    mxc = upload(alice, b"x", "text/plain")
    anonymous = MatrixClient(frozen.client_url)
    for method, path in [
        ("GET", f"{CLIENT}/download/{mxc}"),
        ("GET", f"{CLIENT}/download/{mxc}/x.txt"),
        ("GET", f"{CLIENT}/thumbnail/{mxc}?width=32&height=32"),
        ("GET", f"{CLIENT}/config"),
        ("GET", f"{LEGACY}/config"),
        ("POST", f"{LEGACY}/upload"),
        ("POST", "/_matrix/media/v1/create"),
        ("PUT", f"{LEGACY}/upload/{mxc}"),
    ]:
        r = anonymous.request(method, path, data=b"x")
        assert error(r) == (401, "M_MISSING_TOKEN"), path


def test_config(frozen, legacy, alice):
    assert alice.get(f"{CLIENT}/config").json() == {"m.upload.size": 52428800}
    assert alice.get(f"{LEGACY}/config").json() == {"m.upload.size": 52428800}
    assert new_user(legacy).get(f"{CLIENT}/config").json() == {"m.upload.size": LEGACY_CAP}


def test_range_requests(alice):
    data = os.urandom(1000)
    mxc = upload(alice, data, "video/mp4", "clip.mp4")
    full = alice.get(f"{CLIENT}/download/{mxc}")
    assert full.headers["Accept-Ranges"] == "bytes"

    for header, start, end in [
        ("bytes=100-199", 100, 200),
        ("bytes=-10", 990, 1000),
        ("bytes=990-", 990, 1000),
        ("bytes=0-0", 0, 1),
    ]:
        r = alice.get(f"{CLIENT}/download/{mxc}", headers={"Range": header})
        assert r.status_code == 206, header
        assert r.content == data[start:end]
        assert r.headers["Content-Range"] == f"bytes {start}-{end - 1}/1000"
        assert r.headers["Content-Length"] == str(end - start)
        assert_media_headers(r, "video/mp4", "inline; filename=clip.mp4")

    unsatisfiable = alice.get(f"{CLIENT}/download/{mxc}", headers={"Range": "bytes=5000-6000"})
    assert error(unsatisfiable) == (416, "M_UNKNOWN")
    assert unsatisfiable.headers["Content-Range"] == "bytes */1000"


def test_range_edge_cases_follow_rfc_9110(alice):
    data = os.urandom(1000)
    mxc = upload(alice, data, "video/mp4", "clip.mp4")
    # RFC 9110 §14.1.3: a suffix longer than the file selects the whole file.
    r = alice.get(f"{CLIENT}/download/{mxc}", headers={"Range": "bytes=-5000"})
    assert r.status_code == 206
    assert r.headers["Content-Range"] == "bytes 0-999/1000" and r.content == data
    # §14.2: a range unit the server does not understand MUST be ignored, and a server
    # that does not serve multipart/byteranges may ignore Range: the whole file, 200.
    for header in ("items=0-5", "bytes=0-1,5-6"):
        r = alice.get(f"{CLIENT}/download/{mxc}", headers={"Range": header})
        assert (r.status_code, r.content) == (200, data), header
        assert "Content-Range" not in r.headers
    # A zero-length suffix is unsatisfiable (§14.1.1).
    r = alice.get(f"{CLIENT}/download/{mxc}", headers={"Range": "bytes=-0"})
    assert error(r) == (416, "M_UNKNOWN") and r.headers["Content-Range"] == "bytes */1000"


def test_large_files_stream_through_without_being_held_in_memory(frozen, alice):
    size = 40 * 1024 * 1024
    data = os.urandom(size)
    before = memory_kb(frozen)
    mxc = upload(alice, data, "application/octet-stream")
    digest = hashlib.sha256()
    with alice.get(f"{CLIENT}/download/{mxc}", stream=True) as r:
        assert r.headers["Content-Length"] == str(size)
        for chunk in r.iter_content(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    after = memory_kb(frozen)
    # 40 MB went in and out; the server's peak memory grew by far less.
    assert after["VmHWM"] - before["VmHWM"] < 16 * 1024, (before, after)


# --- async upload --------------------------------------------------------------------------


def test_async_upload(frozen, alice):
    created = alice.post("/_matrix/media/v1/create").json()
    assert created["content_uri"].startswith("mxc://weir.test/")
    assert created["unused_expires_at"] > 0
    mxc = created["content_uri"][len("mxc://") :]

    # Not uploaded yet: the download waits for timeout_ms, then gives up.
    r = alice.get(f"{CLIENT}/download/{mxc}", params={"timeout_ms": 200})
    assert error(r) == (504, "M_NOT_YET_UPLOADED")
    r = alice.get(
        f"{CLIENT}/thumbnail/{mxc}", params={"width": 32, "height": 32, "timeout_ms": 200}
    )
    assert error(r) == (504, "M_NOT_YET_UPLOADED")

    # Only its creator may give it content.
    assert error(new_user(frozen).put(f"{LEGACY}/upload/{mxc}", data=b"x")) == (403, "M_FORBIDDEN")

    # A download waiting on it is answered as soon as the content arrives.
    waiting = gevent.spawn(alice.get, f"{CLIENT}/download/{mxc}", params={"timeout_ms": 30000})
    data = b"late content"
    put = alice.put(
        f"{LEGACY}/upload/{mxc}",
        params={"filename": "late.txt"},
        data=data,
        headers={"Content-Type": "text/plain"},
    )
    assert (put.status_code, put.json()) == (200, {})
    answered = waiting.get(timeout=30)
    assert answered.status_code == 200 and answered.content == data
    assert answered.headers["Content-Disposition"] == "inline; filename=late.txt"

    again = alice.put(f"{LEGACY}/upload/{mxc}", data=b"other")
    assert error(again) == (409, "M_CANNOT_OVERWRITE_MEDIA")
    assert alice.get(f"{CLIENT}/download/{mxc}").content == data

    assert error(alice.put(f"{LEGACY}/upload/weir.test/neverCreated", data=b"x")) == (
        404,
        "M_NOT_FOUND",
    )
    assert error(alice.put(f"{LEGACY}/upload/other.example/{mxc.split('/')[1]}", data=b"x")) == (
        404,
        "M_NOT_FOUND",
    )


def test_pending_uploads_are_limited_per_user(frozen, alice):
    created = [alice.post("/_matrix/media/v1/create") for _ in range(5)]
    assert [r.status_code for r in created] == [200] * 5
    refused = alice.post("/_matrix/media/v1/create")
    assert error(refused) == (429, "M_LIMIT_EXCEEDED")
    # Retry when the oldest pending id expires, a day after it was made.
    assert refused.json()["retry_after_ms"] > 23 * 3600 * 1000
    assert int(refused.headers["Retry-After"]) > 23 * 3600
    # Another user is not affected; content for one pending id frees a place.
    assert new_user(frozen).post("/_matrix/media/v1/create").status_code == 200
    first = created[0].json()["content_uri"][len("mxc://") :]
    assert alice.put(f"{LEGACY}/upload/{first}", data=b"x").status_code == 200
    assert alice.post("/_matrix/media/v1/create").status_code == 200


# --- thumbnails ----------------------------------------------------------------------------


def thumbnail(client, mxc, width, height, method="scale", **params):
    r = client.get(
        f"{CLIENT}/thumbnail/{mxc}",
        params={"width": width, "height": height, "method": method, **params},
    )
    assert r.status_code == 200, r.text
    return r, Image.open(io.BytesIO(r.content))


def test_thumbnail_dimensions(frozen, alice):
    mxc = upload(alice, solid(1000, 500, "JPEG"), "image/jpeg", "wide.jpg")
    cases = [
        ((32, 32, "crop"), (32, 32)),
        ((64, 64, "crop"), (96, 96)),  # the nearest larger pre-generated crop
        ((100, 100, "scale"), (320, 160)),  # the nearest larger pre-generated scale
        ((640, 480, "scale"), (640, 320)),
        ((200, 50, "crop"), (200, 50)),  # made on demand, exact size and aspect
        ((700, 700, "crop"), (500, 500)),  # no upscale: the largest square of the source
        ((5000, 5000, "scale"), (1000, 500)),  # no upscale: the source's own size
    ]
    for (w, h, method), expected in cases:
        r, image = thumbnail(alice, mxc, w, h, method)
        assert image.size == expected, (w, h, method)
        assert image.format == "JPEG"
        assert_media_headers(r, "image/jpeg", "inline; filename=thumbnail.jpg")

    # The on-demand one was kept on disk for the next request.
    media_id = mxc.split("/")[1]
    kept = [f for f in files_under(frozen.media_root) if f"/{media_id}/thumbnails/" in f]
    assert any(f.endswith("/200x50-crop.jpg") for f in kept), kept

    small = upload(alice, solid(20, 10), "image/png")
    assert thumbnail(alice, small, 320, 240, "scale")[1].size == (20, 10)
    assert thumbnail(alice, small, 32, 32, "crop")[1].size == (10, 10)


def test_thumbnail_of_an_animation(alice):
    mxc = upload(alice, animated_gif(frames=3), "image/gif")
    r, moving = thumbnail(alice, mxc, 32, 32, "crop", animated="true")
    assert r.headers["Content-Type"] == "image/webp"
    assert moving.n_frames == 3 and moving.size == (32, 32)
    r, still = thumbnail(alice, mxc, 32, 32, "crop")
    assert r.headers["Content-Type"] == "image/png" and getattr(still, "n_frames", 1) == 1


def test_a_still_request_is_never_served_an_animation_when_thumbnails_are_capped(frozen, alice):
    # Spec (client-server API, GET /_matrix/client/v1/media/thumbnail): when `animated` is
    # false or absent the server MUST NOT return an animated thumbnail. Past the cap of
    # stored thumbnails a request is served a stored one: it must still be a still.
    mxc = upload(alice, animated_gif(frames=3, size=256), "image/gif")
    for size in range(100, 100 + MAX_STORED_THUMBNAILS):  # each larger: each one made
        r, _ = thumbnail(alice, mxc, size, size, "crop", animated="true")
        assert r.headers["Content-Type"] == "image/webp"
    media_id = mxc.split("/")[1]
    kept = [f for f in files_under(frozen.media_root) if f"/{media_id}/thumbnails/" in f]
    assert len(kept) == MAX_STORED_THUMBNAILS  # the cap is reached: nothing new is made
    r, still = thumbnail(alice, mxc, 50, 100, "crop")
    assert r.headers["Content-Type"] == "image/png"
    assert getattr(still, "n_frames", 1) == 1


def test_thumbnail_refusals(alice):
    text = upload(alice, b"just text", "text/plain")
    r = alice.get(f"{CLIENT}/thumbnail/{text}", params={"width": 32, "height": 32})
    assert error(r) == (400, "M_UNKNOWN")
    fake = upload(alice, b"not really a png", "image/png")
    r = alice.get(f"{CLIENT}/thumbnail/{fake}", params={"width": 32, "height": 32})
    assert error(r) == (400, "M_UNKNOWN")

    image = upload(alice, solid(50, 50), "image/png")
    assert error(alice.get(f"{CLIENT}/thumbnail/{image}", params={"width": 32})) == (
        400,
        "M_MISSING_PARAM",
    )
    assert error(alice.get(f"{CLIENT}/thumbnail/{image}", params={"width": 32, "height": 0})) == (
        400,
        "M_INVALID_PARAM",
    )
    assert error(alice.get(f"{CLIENT}/thumbnail/{image}", params={"width": 32, "height": "x"})) == (
        400,
        "M_INVALID_PARAM",
    )
    assert error(
        alice.get(
            f"{CLIENT}/thumbnail/{image}", params={"width": 32, "height": 32, "method": "stretch"}
        )
    ) == (400, "M_INVALID_PARAM")


def test_decompression_bomb_is_refused_without_decoding(frozen, alice):
    bomb = bomb_png(8000, 8000)  # 64 Mpixels, 192 MB as RGB; the limit is 32 Mpixels
    assert len(bomb) < 1_000_000
    before = memory_kb(frozen)
    mxc = upload(alice, bomb, "image/png")  # pre-generating thumbnails refuses it too
    r = alice.get(f"{CLIENT}/thumbnail/{mxc}", params={"width": 32, "height": 32})
    assert error(r) == (413, "M_TOO_LARGE")
    after = memory_kb(frozen)
    assert after["VmHWM"] - before["VmHWM"] < 32 * 1024, (before, after)
    assert after["VmRSS"] - before["VmRSS"] < 32 * 1024, (before, after)


# --- refusals ------------------------------------------------------------------------------


def raw_request(server, method: str, path: str, token: str | None = None, body: bytes = b""):
    host, port = server.client_url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request(method, path, body=body or None, headers=headers)  # the path as written
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_traversal_shaped_ids_are_refused_and_touch_no_file(frozen, alice):
    secret = os.path.join(frozen.media_root, "secret.txt")
    with open(secret, "w") as f:
        f.write("TOP SECRET")
    before = files_under(frozen.media_root)
    ids = [
        "..%2F..%2Fetc%2Fpasswd",
        "..%2Fsecret.txt",
        "..%2F..%2Fmedia%2Fsecret.txt",
        "%2E%2E",
        "..",
        ".",
        "abc.def",
        "abc%00def",
        "abc%0A",
        "%2Fetc%2Fpasswd",
        "ab%5C..%5Csecret",
    ]
    for media_id in ids:
        # A newline does not even match a route (M_UNRECOGNIZED); the rest reach the media
        # id check (M_NOT_FOUND). Either way: 404, and no file is opened.
        expected = (404, "M_UNRECOGNIZED" if "%0A" in media_id else "M_NOT_FOUND")
        for path in [
            f"{CLIENT}/download/weir.test/{media_id}",
            f"{CLIENT}/download/weir.test/{media_id}/x.txt",
            f"{CLIENT}/thumbnail/weir.test/{media_id}?width=32&height=32",
            f"{LEGACY}/download/weir.test/{media_id}",
        ]:
            status, body = raw_request(frozen, "GET", path, alice.token)
            assert (status, json.loads(body)["errcode"]) == expected, path
            assert b"TOP SECRET" not in body and b"root:" not in body
        status, body = raw_request(
            frozen, "PUT", f"{LEGACY}/upload/weir.test/{media_id}", alice.token, b"overwrite?"
        )
        assert (status, json.loads(body)["errcode"]) == expected, media_id
    assert files_under(frozen.media_root) == before


def test_oversize_uploads_are_refused_and_leave_nothing(legacy):
    client = new_user(legacy)
    before = files_under(legacy.media_root)

    over = client.post(f"{LEGACY}/upload", data=b"x" * (LEGACY_CAP + 1))
    assert error(over) == (413, "M_TOO_LARGE")

    def chunked():  # no Content-Length: the cap is found while streaming
        for _ in range(4):
            yield b"y" * 50_000

    assert error(client.post(f"{LEGACY}/upload", data=chunked())) == (413, "M_TOO_LARGE")

    created = client.post("/_matrix/media/v1/create").json()["content_uri"][len("mxc://") :]
    assert error(client.put(f"{LEGACY}/upload/{created}", data=chunked())) == (413, "M_TOO_LARGE")
    assert files_under(legacy.media_root) == before
    # The pending id is still usable after the refusal.
    assert client.put(f"{LEGACY}/upload/{created}", data=b"fits").status_code == 200

    exact = upload(client, b"z" * LEGACY_CAP, "application/octet-stream")
    assert len(client.get(f"{CLIENT}/download/{exact}").content) == LEGACY_CAP


def test_a_refused_upload_is_not_read_to_its_end(legacy):
    """A client announcing 10 GB gets 413 at once, and the connection is closed instead of
    the server reading (or waiting for) the rest."""
    client = new_user(legacy)
    host, port = legacy.client_url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: weir.test\r\n"
            b"Authorization: Bearer " + client.token.encode() + b"\r\n"
            b"Content-Type: application/octet-stream\r\nContent-Length: 10000000000\r\n\r\n"
            + b"x"
            * 1000
        )
        sock.settimeout(30)  # far less than the keep-alive timeout the drain would wait
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 413 ")
    assert b"M_TOO_LARGE" in received and b"Connection: close" in received


# --- both databases ------------------------------------------------------------------------


def test_media_on_each_database(start_weir, database_url):
    server = start_weir({"database": {"url": database_url}})
    client = new_user(server)
    mxc = upload(client, solid(64, 64), "image/png", "dot.png")
    assert client.get(f"{CLIENT}/download/{mxc}").content == solid(64, 64)
    assert thumbnail(client, mxc, 32, 32, "crop")[1].size == (32, 32)
    pending = client.post("/_matrix/media/v1/create").json()["content_uri"][len("mxc://") :]
    assert client.put(f"{LEGACY}/upload/{pending}", data=b"later").status_code == 200
    assert client.get(f"{CLIENT}/download/{pending}").content == b"later"
