"""A server admin for tests: registered through Synapse's shared-secret API, as an
operator's provisioning tool would (the test settings' secret, tests/support/server.py)."""

from __future__ import annotations

import hashlib
import hmac

from tests.support.server import MatrixClient

SECRET = b"test-shared-secret"


def register_admin(base_url: str, username: str, password: str = "admin pw") -> MatrixClient:
    client = MatrixClient(base_url)
    nonce = client.get("/_synapse/admin/v1/register", auth=False).json()["nonce"]
    mac = hmac.new(
        SECRET,
        b"\x00".join([nonce.encode(), username.encode(), password.encode(), b"admin"]),
        hashlib.sha1,
    ).hexdigest()
    r = client.post(
        "/_synapse/admin/v1/register",
        auth=False,
        json={
            "nonce": nonce,
            "username": username,
            "password": password,
            "admin": True,
            "mac": mac,
        },
    )
    assert r.status_code == 200, r.text
    client.token = r.json()["access_token"]
    client.user_id = r.json()["user_id"]
    return client
