"""Serving our media to other servers: /_matrix/federation/v1/media/download|thumbnail, against
the real server process with a TLS federation listener, requests signed by a fake origin (a
real TLS peer whose key we fetch), and the multipart answers read with python-multipart."""

import io
import os
import uuid

import pytest
import requests
from PIL import Image

from tests.media.images import solid
from tests.peers.honest import HonestPeer
from tests.support.federation import tls_weir
from tests.support.multipart import media_file_part
from tests.support.server import MatrixClient

WEIR_IP = "127.43.0.1"
ORIGIN = "127.43.0.2:8448"  # an IP literal: found without DNS
REMOTE = "127.43.0.3:8448"  # a server whose media we cache
FED_MEDIA = "/_matrix/federation/v1/media"


@pytest.fixture(scope="module")
def origin(test_ca):
    with HonestPeer(ORIGIN, test_ca, host="127.43.0.2", port=8448) as peer:
        yield peer


@pytest.fixture(scope="module")
def remote(test_ca):
    with HonestPeer(REMOTE, test_ca, host="127.43.0.3", port=8448) as peer:
        yield peer


@pytest.fixture(scope="module")
def weir(test_ca, tmp_path_factory):
    with tls_weir(test_ca, str(tmp_path_factory.mktemp("weir-fed-media")), WEIR_IP) as proc:
        yield proc


@pytest.fixture(scope="module")
def alice(weir):
    client = MatrixClient(weir.client_url)
    client.register("alice")
    return client


def upload(client, data: bytes, content_type: str, filename: str) -> str:
    r = client.post(
        "/_matrix/media/v3/upload",
        params={"filename": filename},
        data=data,
        headers={"Content-Type": content_type},
    )
    assert r.status_code == 200, r.text
    return r.json()["content_uri"].rsplit("/", 1)[1]


def signed_get(weir, test_ca, origin, target: str) -> requests.Response:
    return requests.get(
        weir.fed_url(target),
        verify=test_ca.ca_path,
        timeout=30,
        headers={"Authorization": origin.sign_request("weir.test", "GET", target)},
    )


def test_download_is_multipart_with_identical_bytes(weir, test_ca, origin, alice):
    data = os.urandom(200_000) + b"\r\n--boundary-like--\r\n"
    media_id = upload(alice, data, "application/pdf", "Résumé final.pdf")
    r = signed_get(weir, test_ca, origin, f"{FED_MEDIA}/download/{media_id}")
    assert r.status_code == 200, r.text
    file_headers, file_data = media_file_part(r.headers["Content-Type"], r.content)
    assert file_headers == {
        "content-type": "application/pdf",
        "content-disposition": "attachment; filename*=utf-8''R%C3%A9sum%C3%A9%20final.pdf",
    }
    assert file_data == data


def test_thumbnail_is_multipart_with_a_made_thumbnail(weir, test_ca, origin, alice):
    media_id = upload(alice, solid(1000, 800), "image/png", "big.png")
    r = signed_get(
        weir, test_ca, origin, f"{FED_MEDIA}/thumbnail/{media_id}?width=96&height=96&method=crop"
    )
    assert r.status_code == 200, r.text
    file_headers, file_data = media_file_part(r.headers["Content-Type"], r.content)
    assert file_headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(file_data)).size == (96, 96)
    r = signed_get(weir, test_ca, origin, f"{FED_MEDIA}/thumbnail/{media_id}?width=96")
    assert (r.status_code, r.json()["errcode"]) == (400, "M_MISSING_PARAM")


@pytest.mark.parametrize("media_id", ["doesNotExist123", "a.b", "a%20b", "x%00y"])
def test_unknown_or_malformed_ids_are_not_found(weir, test_ca, origin, media_id):
    for kind in ("download", "thumbnail"):
        r = signed_get(weir, test_ca, origin, f"{FED_MEDIA}/{kind}/{media_id}?width=8&height=8")
        assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND"), (kind, media_id)


def test_media_not_yet_uploaded_times_out(weir, test_ca, origin, alice):
    media_id = alice.post("/_matrix/media/v1/create").json()["content_uri"].rsplit("/", 1)[1]
    r = signed_get(weir, test_ca, origin, f"{FED_MEDIA}/download/{media_id}?timeout_ms=0")
    assert (r.status_code, r.json()["errcode"]) == (504, "M_NOT_YET_UPLOADED")


def test_unsigned_requests_are_refused(weir, test_ca, alice):
    media_id = upload(alice, b"secret", "text/plain", "a.txt")
    for kind in ("download", "thumbnail"):
        r = requests.get(
            weir.fed_url(f"{FED_MEDIA}/{kind}/{media_id}?width=8&height=8"),
            verify=test_ca.ca_path,
            timeout=30,
        )
        assert (r.status_code, r.json()["errcode"]) == (401, "M_UNAUTHORIZED")


def test_only_our_own_media_is_served(weir, test_ca, origin, remote, alice):
    # Another server's file, in our cache after a client downloaded it: a server asking us
    # for that id gets 404, and nothing is fetched on its behalf.
    media_id = "remote" + uuid.uuid4().hex
    remote.serve_media(media_id, b"theirs", "text/plain", "theirs.txt")
    r = alice.get(f"/_matrix/client/v1/media/download/{REMOTE}/{media_id}")
    assert (r.status_code, r.content) == (200, b"theirs")
    fetches = remote.media_fetches()
    r = signed_get(weir, test_ca, origin, f"{FED_MEDIA}/download/{media_id}")
    assert (r.status_code, r.json()["errcode"]) == (404, "M_NOT_FOUND")
    assert remote.media_fetches() == fetches == 1
