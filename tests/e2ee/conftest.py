"""A real server shared by a test module (SQLite and PostgreSQL, from tests/rooms), and a
client-side device that signs its keys as a real one does (ed25519 over canonical JSON)."""

import itertools
import sqlite3

import pytest
from nacl.signing import SigningKey
from signedjson.key import get_verify_key
from signedjson.sign import sign_json
from unpaddedbase64 import encode_base64

from tests.rooms.conftest import V3, create_room, server, user  # noqa: F401 - shared fixtures

PASSWORD = "correct horse battery"
_keys = itertools.count()


def new_signing_key(version: str):
    key = SigningKey.generate()
    key.version = version
    key.alg = "ed25519"
    return key


def public(key) -> str:
    return encode_base64(get_verify_key(key).encode())


class Device:
    """A client's device: its ed25519 key signs its device keys and one-time keys."""

    def __init__(self, client):
        self.client = client
        self.user_id = client.user_id
        self.device_id = client.get(f"{V3}/account/whoami").json()["device_id"]
        self.key = new_signing_key(self.device_id)

    def device_keys(self, **override) -> dict:
        keys = {
            "user_id": self.user_id,
            "device_id": self.device_id,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {
                f"curve25519:{self.device_id}": encode_base64(b"c" * 32),
                f"ed25519:{self.device_id}": public(self.key),
            },
            **override,
        }
        return sign_json(keys, self.user_id, self.key)

    def one_time_keys(self, count: int, fallback: bool = False) -> dict:
        out = {}
        for _ in range(count):
            n = next(_keys)
            body = {"key": encode_base64(n.to_bytes(32, "big"))}
            if fallback:
                body["fallback"] = True
            out[f"signed_curve25519:AAAA{n}"] = sign_json(body, self.user_id, self.key)
        return out

    def upload(self, **body):
        return self.client.post(f"{V3}/keys/upload", json=body)


def cross_signing_keys(user_id: str):
    """(the device_signing/upload body, master, self-signing and user-signing keys) of a
    fresh set for `user_id`, the other two signed by the master key."""
    master, ssk, usk = (new_signing_key(n) for n in ("m", "s", "u"))
    for key in (master, ssk, usk):
        key.version = public(key)

    def key_body(key, usage):
        return {
            "user_id": user_id,
            "usage": [usage],
            "keys": {f"ed25519:{public(key)}": public(key)},
        }

    body = {
        "master_key": key_body(master, "master"),
        "self_signing_key": sign_json(key_body(ssk, "self_signing"), user_id, master),
        "user_signing_key": sign_json(key_body(usk, "user_signing"), user_id, master),
    }
    return body, master, ssk, usk


def password_auth(client, session: str | None = None) -> dict:
    auth = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": client.user_id},
        "password": PASSWORD,
    }
    if session is not None:
        auth["session"] = session
    return auth


def count_rows(weir, sql: str, params: tuple) -> int:
    """A COUNT(*) read from the database the server writes (`?` placeholders)."""
    url = weir.database_url
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(f"file:{url[len('sqlite:///') :]}?mode=ro", uri=True)
        try:
            return conn.execute(sql, params).fetchone()[0]
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql.replace("?", "%s"), params).fetchone()[0]


@pytest.fixture
def device(user):  # noqa: F811 - the fixture imported above
    def make(prefix: str = "user") -> Device:
        return Device(user(prefix))

    return make
