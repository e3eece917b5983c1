"""Interop with a real Synapse 1.163 on loopback, TLS on both sides.

- Synapse fetches our key (from the real Weir process) and accepts a request we sign.
- We fetch Synapse's key and accept a request Synapse signs (Synapse is driven through its
  client API to query a profile on our server).
"""

import os
import re

import pytest
import requests
from signedjson.key import generate_signing_key, read_signing_keys

from homeserver.federation.errors import RemoteError
from tests.support.federation import make_client, tls_weir
from tests.support.server import MatrixClient

pytestmark = pytest.mark.synapse

WEIR_IP = "127.30.1.1"
WEIR_NAME = f"{WEIR_IP}:8448"


@pytest.fixture(scope="module")
def weir(test_ca, synapse, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("weir-interop"))
    with tls_weir(test_ca, directory, WEIR_IP, WEIR_NAME) as proc:
        yield proc


def test_synapse_accepts_a_request_we_sign(weir, synapse, test_ca):
    synapse.register("bob")
    with open(os.path.join(weir.directory, "data", "signing.key")) as f:
        key = read_signing_keys(f)[0]
    with make_client(test_ca, server_name=WEIR_NAME, signing_key=key) as client:
        profile = client.get_json(
            synapse.server_name,
            "/_matrix/federation/v1/query/profile",
            {"user_id": f"@bob:{synapse.server_name}"},
        )
        assert profile.get("displayname") == "bob"
        # Synapse fetched our key from the Weir process to check that signature.
        weir.wait_for_log(r"GET /_matrix/key/v2/server(/\S*)? 200")
        # And it does check: the same request signed by a key that is not ours is refused.
    with make_client(
        test_ca, server_name=WEIR_NAME, signing_key=generate_signing_key(key.version)
    ) as impostor:
        with pytest.raises(RemoteError) as e:
            impostor.get_json(
                synapse.server_name,
                "/_matrix/federation/v1/query/profile",
                {"user_id": f"@bob:{synapse.server_name}"},
            )
        assert (e.value.status, e.value.errcode) == (401, "M_UNAUTHORIZED")


def test_we_accept_a_request_synapse_signs(weir, synapse):
    MatrixClient(weir.client_url).register("alice")
    token = synapse.register("carol")["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    r = requests.get(
        f"{synapse.client_url}/_matrix/client/v3/profile/@alice:{WEIR_NAME}",
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = requests.get(
        f"{synapse.client_url}/_matrix/client/v3/profile/@nobody:{WEIR_NAME}",
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 404, r.text
    # Our guard verified both with the key it fetched from Synapse: the handler answered
    # (200, then 404 M_NOT_FOUND), and the access log names the verified origin.
    for user, status in (("alice", 200), ("nobody", 404)):
        weir.wait_for_log(
            rf"GET /_matrix/federation/v1/query/profile\?user_id=%40{user}\S* "
            rf"{status} .* origin={re.escape(synapse.server_name)}$"
        )
