"""Media interop with a real Synapse 1.163 on loopback, TLS on both sides.

- Synapse downloads a file from us over federation (its own client API's
  /_matrix/client/v1/media/download/<our server>/<id>), and gets identical bytes.
- We download a file uploaded to Synapse, and its thumbnail, through our /client/v1 API:
  one fetch over federation, the thumbnail made here from the cached original.
"""

import io
import os
import re

import pytest
import requests
from PIL import Image

from tests.media.images import solid
from tests.support.federation import tls_weir
from tests.support.metrics import metric
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.30.3.1"
WEIR_NAME = f"{WEIR_IP}:8448"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-media-interop"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def test_synapse_downloads_our_media(weir, synapse):
    alice = MatrixClient(weir.client_url)
    alice.register("alice")
    data = os.urandom(300_000)
    r = alice.post(
        "/_matrix/media/v3/upload",
        params={"filename": "blob.bin"},
        data=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    media_id = r.json()["content_uri"].rsplit("/", 1)[1]

    token = synapse.register("media_bob")["access_token"]
    r = requests.get(
        f"{synapse.client_url}/_matrix/client/v1/media/download/{WEIR_NAME}/{media_id}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.content == data
    # It came over our federation endpoint, from Synapse, verified.
    weir.wait_for_log(
        rf"GET /_matrix/federation/v1/media/download/{media_id}\S* 200 .* "
        rf"origin={re.escape(synapse.server_name)}$"
    )


def test_we_download_synapse_media_and_thumbnail_it(weir, synapse):
    token = synapse.register("media_carol")["access_token"]
    image = solid(640, 480, "PNG", color="green")
    r = requests.post(
        f"{synapse.client_url}/_matrix/media/v3/upload",
        params={"filename": "green.png"},
        data=image,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "image/png"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    mxc = r.json()["content_uri"][len("mxc://") :]
    assert mxc.startswith(synapse.server_name + "/")

    dave = MatrixClient(weir.client_url)
    dave.register("dave")
    r = dave.get(f"/_matrix/client/v1/media/download/{mxc}")
    assert r.status_code == 200, r.text
    assert r.content == image
    assert r.headers["Content-Type"] == "image/png"
    assert r.headers["Content-Disposition"] == "inline; filename=green.png"
    r = dave.get(
        f"/_matrix/client/v1/media/thumbnail/{mxc}",
        params={"width": 320, "height": 240, "method": "scale"},
    )
    assert r.status_code == 200, r.text
    assert Image.open(io.BytesIO(r.content)).size == (320, 240)
    # One fetch from Synapse for both.
    assert (
        metric(weir.client_url, "weir_outbound_calls_total", call="remote_media", outcome="ok") == 1
    )
