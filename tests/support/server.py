"""Runs the real server process (`python app.py --config ...`) on loopback for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import gevent
import requests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY = re.compile(r"^weir ready client=(\S+) federation=(\S+)")


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def write_config(path: str, settings: dict) -> None:
    """Writes nested dicts as TOML tables: {"server": {"http": {"port": 0}}}."""
    lines: list[str] = []

    def table(prefix: str, values: dict) -> None:
        scalars = {k: v for k, v in values.items() if not isinstance(v, dict) or _inline(v)}
        tables = {k: v for k, v in values.items() if isinstance(v, dict) and not _inline(v)}
        if prefix and scalars:
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {toml_value(v)}")
        for k, v in tables.items():
            table(f"{prefix}.{k}" if prefix else k, v)

    table("", settings)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _inline(value: dict) -> bool:
    # Rate settings are written inline, as config.toml writes them.
    return set(value) <= {"max_requests", "per_seconds"} and bool(value)


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def base_settings(data_dir: str, database_url: str | None = None) -> dict:
    settings = {
        "server_name": "weir.test",
        "public_baseurl": "http://127.0.0.1/",
        "data_dir": data_dir,
        "server": {"http": {"port": 0}},
        "federation": {"port": 0},
        "registration": {"enabled": True, "shared_secret": "test-shared-secret"},
        "ratelimiting": {
            "login": {"max_requests": 1000, "per_seconds": 1},
            "registration": {"max_requests": 1000, "per_seconds": 1},
        },
    }
    if database_url:
        settings["database"] = {"url": database_url}
    return settings


class WeirProcess:
    def __init__(
        self,
        directory: str,
        settings: dict,
        env: dict | None = None,
        *,
        repo: str = REPO,
        launcher: tuple[str, ...] = (),
    ):
        """`repo`: the checkout whose app.py runs (a bench may run an earlier build);
        `launcher`: a command it runs under, such as ``("taskset", "-c", "0")``."""
        self.directory = directory
        self.repo = repo
        self.launcher = launcher
        self.config_path = os.path.join(directory, "config.toml")
        write_config(self.config_path, settings)
        self.stderr_path = os.path.join(directory, "stderr.log")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.client_url = ""
        self.federation_url = ""

    def start(self, timeout: float = 60) -> "WeirProcess":
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [*self.launcher, sys.executable, os.path.join(self.repo, "app.py")]
            + ["--config", self.config_path],
            cwd=self.directory,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
        )
        with gevent.Timeout(timeout, RuntimeError(f"server not ready: {self.stderr_tail()}")):
            for raw in self.proc.stdout:
                match = READY.match(raw.decode(errors="replace"))
                if match:
                    self.client_url, self.federation_url = match.groups()
                    break
            else:
                raise RuntimeError(f"server exited with {self.proc.wait()}: {self.stderr_tail()}")
        gevent.spawn(self._drain_stdout)
        return self

    def _drain_stdout(self):
        for _ in self.proc.stdout:
            pass

    def wait_for_log(self, pattern: str, timeout: float = 10) -> str:
        """The first stderr line matching ``pattern`` (a regex), waiting for it to be written.

        The access log line of a request is written when its response is closed, which may
        be just after the client has read the response: tests wait for the line itself.
        """
        regex = re.compile(pattern)
        with gevent.Timeout(timeout, AssertionError(f"no log line matching {pattern!r}")):
            while True:
                with open(self.stderr_path, errors="replace") as f:
                    for line in f:
                        if regex.search(line):
                            return line
                gevent.sleep(0.05)  # the file grows; look again

    def cpu_seconds(self) -> float:
        """CPU time the server has used so far, user and system (from /proc)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> int:
        if self.proc is None:
            return 0
        terminate(self.proc, timeout)
        self._stderr.close()
        return self.proc.returncode

    def url(self, path: str) -> str:
        return self.client_url + path

    def fed_url(self, path: str) -> str:
        return self.federation_url + path

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def terminate(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_app(
    args: list[str], cwd: str, input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "app.py"), *args],
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class MatrixClient:
    """A thin client over requests for driving the client API in tests."""

    def __init__(self, base_url: str, token: str | None = None, headers: dict | None = None):
        self.base_url = base_url
        self.token = token
        self.session = requests.Session()
        self.session.headers.update(headers or {})

    def request(self, method: str, path: str, auth: bool = True, **kw) -> requests.Response:
        headers = kw.pop("headers", {})
        if auth and self.token:
            headers = {"Authorization": f"Bearer {self.token}", **headers}
        kw.setdefault("timeout", 30)
        return self.session.request(method, self.base_url + path, headers=headers, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def put(self, path, **kw):
        return self.request("PUT", path, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    def register(self, username: str, password: str = "correct horse battery") -> dict:
        first = self.post(
            "/_matrix/client/v3/register",
            auth=False,
            json={"username": username, "password": password},
        )
        assert first.status_code == 401, first.text
        second = self.post(
            "/_matrix/client/v3/register",
            auth=False,
            json={
                "username": username,
                "password": password,
                "auth": {"type": "m.login.dummy", "session": first.json()["session"]},
            },
        )
        assert second.status_code == 200, second.text
        body = second.json()
        self.token = body["access_token"]
        return body

    def login(self, username: str, password: str = "correct horse battery") -> dict:
        r = self.post(
            "/_matrix/client/v3/login",
            auth=False,
            json={
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": username},
                "password": password,
            },
        )
        assert r.status_code == 200, r.text
        self.token = r.json()["access_token"]
        return r.json()
