"""Password hashing with scrypt, off the gevent hub, on a thread pool of its own.

scrypt costs ~75 ms of CPU and 16 MiB by design; hashlib releases the GIL while it runs, so
a native thread keeps every other greenlet running meanwhile. The pool is its own: on the
hub's pool (or the database's) logins would queue behind database queries under load, and
queries behind logins (docs/operations.md, "Thread pools").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from homeserver.core.threads import CountedThreadPool

# n=2**14, r=8, p=1: the interactive-login parameters recommended for scrypt.
_N, _R, _P = 2**14, 8, 1
_MAXMEM = 64 * 1024 * 1024


def default_threads() -> int:
    # scrypt is all CPU: more threads than cores only makes each hash slower, and a burst of
    # logins then waits in the pool's queue (visible in /metrics) rather than on the cores.
    # Derived, not configured: the right value is the core count wherever Weir runs.
    return max(1, os.cpu_count() or 1)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32
    )


class PasswordHasher:
    def __init__(self, threads: int | None = None):
        self.pool = CountedThreadPool(threads or default_threads())

    def hash(self, password: str) -> str:
        salt = os.urandom(16)
        digest = self.pool.apply(_scrypt, (password, salt, _N, _R, _P))
        b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
        return f"scrypt${_N}${_R}${_P}${b64(salt)}${b64(digest)}"

    def check(self, password: str, stored: str | None) -> bool:
        if not stored:
            return False
        try:
            scheme, n, r, p, salt, digest = stored.split("$")
            if scheme != "scrypt":
                return False
            expected = base64.b64decode(digest)
            actual = self.pool.apply(
                _scrypt, (password, base64.b64decode(salt), int(n), int(r), int(p))
            )
        except ValueError:
            return False
        return hmac.compare_digest(expected, actual)

    def close(self) -> None:
        self.pool.kill()
