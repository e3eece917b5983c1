"""A private PostgreSQL cluster for the test session (initdb + pg_ctl in a temp dir).

Sessions and CI run as root and initdb refuses root, so the cluster runs as the `postgres`
user when we are root. Under CI a missing PostgreSQL is a failure, not a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile


def find_pg_bin() -> str | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    found = shutil.which("initdb")
    return os.path.dirname(found) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresCluster:
    def __init__(self, bindir: str, settings: dict[str, str] | None = None):
        """`settings`: server settings over the defaults below (a bench that wants
        `fsync=on`, as in production)."""
        self.bindir = bindir
        self.settings = settings or {}
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="weir-pg-")
        self.run_as = None
        if os.geteuid() == 0:
            self.run_as = "postgres"
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.datadir = os.path.join(self.dir, "data")
        self._template: str | None = None
        self._counter = 0

    def _cmd(self, *args: str) -> list[str]:
        cmd = [os.path.join(self.bindir, args[0]), *args[1:]]
        return ["runuser", "-u", self.run_as, "--", *cmd] if self.run_as else cmd

    def start(self) -> "PostgresCluster":
        subprocess.run(
            self._cmd(
                "initdb",
                "-D",
                self.datadir,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ),
            check=True,
            capture_output=True,
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories="
            f"{self.dir} -c fsync=off -c max_connections=300"
        )
        opts += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        subprocess.run(
            self._cmd(
                "pg_ctl",
                "-D",
                self.datadir,
                "-o",
                opts,
                "-w",
                "-l",
                os.path.join(self.dir, "log"),
                "start",
            ),
            check=True,
            capture_output=True,
        )
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, empty: bool = False) -> str:
        """A fresh database; its URL. A copy of one migrated to the newest schema, as a
        server's first start leaves it: copying takes 0.3 s, the migrations 0.5-0.8 s, and
        the suite makes hundreds. `empty`: nothing in it, for a test of the migrations."""
        import psycopg

        template = "" if empty else f' TEMPLATE "{self._migrated()}" STRATEGY = FILE_COPY'
        self._counter += 1
        name = f"weir_test_{os.getpid()}_{self._counter}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{template}')
        return self.url(name)

    def _migrated(self) -> str:
        """The template the migrated databases are copied from, made once; nothing stays
        connected to it (a copy needs that)."""
        if self._template is None:
            from homeserver.storage.database import open_database
            from homeserver.storage.migrations import migrate

            url = self.new_database(empty=True)
            db = open_database(url)
            try:
                migrate(db)
            finally:
                db.close()
            self._template = url.rsplit("/", 1)[1]
        return self._template

    def stop(self) -> None:
        subprocess.run(
            self._cmd("pg_ctl", "-D", self.datadir, "-m", "immediate", "stop"), capture_output=True
        )
        # By a suite's end its data is gigabytes (hundreds of databases, 10 MB each):
        # removing it takes 10-20 s, which nothing needs to wait for.
        subprocess.Popen(
            ["rm", "-rf", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
