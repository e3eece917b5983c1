"""One process per instance name: held for the life of the serving process.

SQLite is served by one process: an exclusive `flock` on `<db>.lock`, beside the database,
which the kernel releases when the process dies, however it dies. On PostgreSQL each
instance holds a session advisory lock keyed by its name on a connection of its own: a
second instance with the same name finds it taken, and the lock ends with the session.
"""

from __future__ import annotations

import fcntl
import os
import re

# The advisory lock's first key: Weir's instance names ("WEIR"), apart from any other use.
LOCK_SPACE = 0x57454952


class InstanceTaken(Exception):
    """Another process already serves this database, or this instance name on it."""


class InstanceLock:
    def __init__(self, release):
        self._release = release

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


def hold_instance(url: str, instance_name: str) -> InstanceLock:
    """Takes the database's or the name's lock, or raises `InstanceTaken`."""
    if url.startswith("sqlite:///"):
        return _hold_sqlite(url[len("sqlite:///") :])
    return _hold_postgres(url, instance_name)


def _hold_sqlite(path: str) -> InstanceLock:
    lock_path = os.path.abspath(path) + ".lock"
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InstanceTaken(
            f"another Weir process serves {path} (it holds {lock_path}); SQLite is one process"
        ) from None
    return InstanceLock(lambda: os.close(fd))


def _hold_postgres(url: str, instance_name: str) -> InstanceLock:
    import psycopg  # after gevent's patching, as storage/database.py does

    conninfo = re.sub(r"^postgres(ql)?://", "postgresql://", url)
    conn = psycopg.connect(
        conninfo, autocommit=True, application_name=f"weir-instance-{instance_name}"
    )
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LOCK_SPACE, instance_name)
    ).fetchone()
    if not row or not row[0]:
        conn.close()
        raise InstanceTaken(
            f"an instance named {instance_name!r} already serves this database:"
            " instance_name must be unique per instance"
        )
    return InstanceLock(conn.close)
