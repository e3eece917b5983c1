"""Password hashing with scrypt, off the gevent hub.

scrypt costs ~75 ms of CPU and 16 MiB by design; hashlib releases the GIL while it runs, so
doing it on the hub's native threadpool keeps every other greenlet running meanwhile.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import gevent

# n=2**14, r=8, p=1: the interactive-login parameters recommended for scrypt.
_N, _R, _P = 2**14, 8, 1
_MAXMEM = 64 * 1024 * 1024


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32
    )


def hash_password(password: str) -> str:
    salt = os.urandom(16)
    digest = gevent.get_hub().threadpool.apply(_scrypt, (password, salt, _N, _R, _P))
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def check_password(password: str, stored: str | None) -> bool:
    if not stored:
        return False
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = gevent.get_hub().threadpool.apply(
            _scrypt, (password, base64.b64decode(salt), int(n), int(r), int(p))
        )
    except ValueError:
        return False
    return hmac.compare_digest(expected, actual)
