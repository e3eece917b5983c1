"""A /keys/query that names a user on a server that never answers (a tarpit) answers within
its deadline, with that server in `failures` and our own user's keys there; the
client_outbound slot is freed and our connection to the tarpit closed. The real server
process; `remote_timeout = 2` cuts the 10 s keys deadline to 2 s."""

import time

import requests

from tests.e2ee.conftest import Device
from tests.peers.tarpit import Tarpit
from tests.support.federation import federation_settings
from tests.support.metrics import in_flight
from tests.support.server import MatrixClient

V3 = "/_matrix/client/v3"
DEADLINE = 2
TARPIT_IP = "127.31.112.3"


def test_a_key_query_naming_a_silent_server_answers_within_its_deadline(start_weir, dns, test_ca):
    with Tarpit(TARPIT_IP, 0) as tarpit:
        dns.add_a("silent.test", TARPIT_IP)
        weir = start_weir(
            {"federation": federation_settings(test_ca, dns, remote_timeout=DEADLINE)}
        )
        client = MatrixClient(weir.client_url)
        client.user_id = client.register("alice")["user_id"]
        alice = Device(client)
        assert alice.upload(device_keys=alice.device_keys()).status_code == 200
        silent = f"silent.test:{tarpit.port}"
        started = time.monotonic()
        r = requests.post(
            weir.url(f"{V3}/keys/query"),
            headers={"Authorization": f"Bearer {client.token}"},
            json={"device_keys": {alice.user_id: [], f"@bob:{silent}": []}},
            timeout=60,
        )
        elapsed = time.monotonic() - started
        assert r.status_code == 200, r.text
        body = r.json()
        assert silent in body["failures"]
        assert body["failures"][silent]["status"] == 503
        assert f"@bob:{silent}" not in body["device_keys"]
        assert alice.device_id in body["device_keys"][alice.user_id]
        assert DEADLINE - 0.5 <= elapsed < DEADLINE + 3
        assert tarpit.accepted >= 1  # we did try it
        assert tarpit.wait_current(0, timeout=5)  # and hung up
        assert in_flight(weir.client_url, "client_outbound") == 0
