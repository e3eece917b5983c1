"""This server's ed25519 signing key, and the key document other servers fetch."""

from __future__ import annotations

import os
import secrets
import string
import time

from signedjson.key import (
    encode_verify_key_base64,
    generate_signing_key,
    get_verify_key,
    read_signing_keys,
    write_signing_keys,
)
from signedjson.sign import sign_json

KEY_FILE = "signing.key"
# How long others may cache our key document: the spec suggests days, Synapse uses 7.
KEY_DOCUMENT_VALIDITY_MS = 7 * 24 * 3600 * 1000


def load_or_create_signing_key(data_dir: str):
    """Reads `data_dir/signing.key`, creating it (mode 0600) on first start."""
    path = os.path.join(data_dir, KEY_FILE)
    if os.path.exists(path):
        with open(path) as f:
            keys = read_signing_keys(f)
        if not keys:
            raise RuntimeError(f"{path} holds no signing key")
        return keys[0]
    os.makedirs(data_dir, exist_ok=True)
    version = "a_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(4))
    key = generate_signing_key(version)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        write_signing_keys(f, [key])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return key


def key_id(signing_key) -> str:
    return f"{signing_key.alg}:{signing_key.version}"


def own_key_document(server_name: str, signing_key, now_ms: int | None = None) -> dict:
    """The self-signed `/_matrix/key/v2/server` response."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    doc = {
        "server_name": server_name,
        "verify_keys": {
            key_id(signing_key): {"key": encode_verify_key_base64(get_verify_key(signing_key))}
        },
        "old_verify_keys": {},
        "valid_until_ts": now_ms + KEY_DOCUMENT_VALIDITY_MS,
    }
    return sign_json(doc, server_name, signing_key)
