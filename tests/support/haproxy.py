"""Real HAProxy on loopback in front of real Weir instances, with the configuration from
deploy/.

`render_config` rewrites deploy/haproxy.cfg for loopback: the frontends listen on sockets
the test bound (HAProxy takes them as inherited descriptors, `fd@N`, so there is no race
for a free port), TLS ends with a certificate from the test CA, and each backend's server
lines (deploy/'s weir-1, weir-2, ...) become one line per test instance's listener.
Everything else (timeouts, X-Forwarded-For, routing, balancing, health checks, the /metrics
refusal) is the deployed configuration as it is. Every rewrite must match its lines
exactly: if deploy/haproxy.cfg changes shape, rendering fails loudly rather than testing
something else.

    with HAProxy(directory, test_ca, client=[w.client_url for w in weirs],
                 federation=[w.federation_url for w in weirs]) as lb:
        requests.get(lb.client_url + "/_matrix/client/versions", verify=test_ca.ca_path)
        lb.server("client", "weir-2")["status"]   # "UP", from HAProxy's stats socket

Under CI (CI=true) a missing haproxy binary is a failure; elsewhere the tests skip
(tests/deploy/conftest.py). The Makefile installs it with apt-get where it can.
"""

from __future__ import annotations

import csv
import io
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Self, Sequence
from urllib.parse import urlsplit

import gevent
import requests
from requests.adapters import HTTPAdapter

from tests.support.server import REPO

DEPLOY_CONFIG = os.path.join(REPO, "deploy", "haproxy.cfg")
CERTS_IN_IMAGE = "/usr/local/etc/haproxy/certs/"


class RenderError(AssertionError):
    """deploy/haproxy.cfg no longer has the shape the rendering expects."""


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None
    )


def haproxy_version(binary: str) -> str:
    """ "2.6.12-1+deb12u4", from `haproxy -v`."""
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"version (\S+)", out)
    return match.group(1) if match else out.strip()


def _replace_once(text: str, pattern: str, replacement, what: str) -> str:
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if count != 1:
        raise RenderError(
            f"deploy/haproxy.cfg: expected exactly one {what} (/{pattern}/), found {count}"
        )
    return new


def render_config(
    source: str,
    *,
    client_bind: str,
    federation_bind: str,
    client_servers: Sequence[str],
    federation_servers: Sequence[str],
    certs: str,
    stats_socket: str,
    max_fds: int | None = None,
    check_inter: str | None = None,
) -> str:
    """deploy/haproxy.cfg (``source``) for loopback.

    ``client_bind``/``federation_bind`` replace ``:443``/``:8448`` (e.g. ``fd@3``).
    ``client_servers``/``federation_servers`` (``host:port`` each) replace each backend's
    ``server weir-N weir-N:8008``/``:8448`` lines: one line each, named ``weir-1``,
    ``weir-2``, ... in that order, whatever number deploy/ has. ``certs`` replaces the
    image's certificate folder. A stats socket is added to ``global``: the tests read
    server states from it. ``max_fds`` lowers the global ``maxconn`` so that it fits that
    many descriptors (two per proxied connection): HAProxy refuses to start when the hard
    RLIMIT_NOFILE is below what ``maxconn`` needs, and a test machine's may be (the compose
    file gives the balancer enough). ``check_inter`` (e.g. ``"200ms"``) replaces the
    ``default-server`` lines' health-check intervals (``inter``, ``fastinter``), so that a
    test sees a server go down in well under a second rather than in the deployed 3 s; with
    ``maxconn`` it is the only behaviour the rendering changes.
    """
    certs = certs.rstrip("/") + "/"
    text = source
    text = _replace_once(
        text,
        r"^global[ \t]*$",
        lambda m: f"global\n    stats socket {stats_socket} mode 600 level admin",
        "global section",
    )
    for port, bind in ((443, client_bind), (8448, federation_bind)):
        text = _replace_once(
            text,
            rf"^(\s*bind )\:{port}( ssl crt ){re.escape(CERTS_IN_IMAGE)}( |$)",
            lambda m, bind=bind: f"{m.group(1)}{bind}{m.group(2)}{certs}{m.group(3)}",
            f"'bind :{port} ssl crt {CERTS_IN_IMAGE}' line",
        )
    if max_fds is not None:
        text = _replace_once(
            text,
            r"^(\s*maxconn )(\d+)[ \t]*$",
            lambda m: f"{m.group(1)}{min(int(m.group(2)), (max_fds - 200) // 2)}",
            "global 'maxconn N' line",
        )
    odd = re.findall(r"^\s*server (?!weir-\d+ weir-\d+:(?:8008|8448)[ \t]*$).*$", text, re.M)
    if odd:
        raise RenderError(f"deploy/haproxy.cfg: a server line of another shape: {odd[0]!r}")
    for port, servers in ((8008, client_servers), (8448, federation_servers)):
        text = _servers(text, port, servers)
    if check_inter is not None:
        text, count = re.subn(
            r"^(\s*default-server )(.*)$",
            lambda m: m.group(1) + _intervals(m.group(2), check_inter),
            text,
            flags=re.MULTILINE,
        )
        backends = len(re.findall(r"^backend ", text, flags=re.MULTILINE))
        if count != backends:
            raise RenderError(
                f"deploy/haproxy.cfg: {backends} backends, {count} default-server lines"
            )
    return text


def _servers(text: str, port: int, servers: Sequence[str]) -> str:
    """``text`` with each backend's ``server weir-N weir-N:<port>`` lines replaced by one
    line per address in ``servers``, where the first of them was."""
    pattern = rf"^(\s*)server weir-\d+ weir-\d+:{port}[ \t]*\n"
    sections = re.split(r"(?m)^(?=\S)", text)  # at each unindented line: a section's head
    rendered, backends = [], 0
    for section in sections:
        found = re.search(pattern, section, flags=re.MULTILINE)
        if found is not None and servers:
            backends += 1
            indent = found.group(1)
            lines = "".join(f"{indent}server weir-{n} {a}\n" for n, a in enumerate(servers, 1))
            tail = re.sub(pattern, "", section[found.start() :], flags=re.MULTILINE)
            section = section[: found.start()] + lines + tail
        rendered.append(section)
    if backends == 0:
        raise RenderError(
            f"deploy/haproxy.cfg: expected 'server weir-N weir-N:{port}' lines, found none"
        )
    return "".join(rendered)


def _intervals(params: str, check_inter: str) -> str:
    """A default-server line's parameters with its check intervals (inter, fastinter) set
    to ``check_inter``."""
    params, count = re.subn(r"\b((?:fast)?inter) \S+", rf"\g<1> {check_inter}", params)
    if count == 0:
        raise RenderError(f"deploy/haproxy.cfg: a default-server line has no 'inter': {params!r}")
    return params


def write_cert_folder(test_ca, directory: str, *names: str) -> str:
    """A folder like deploy/certs/: one PEM with the chain and the key, for ``names``."""
    os.makedirs(directory, exist_ok=True)
    files = test_ca.issue(*names)
    with open(os.path.join(directory, "weir.pem"), "w") as out:
        for path in (files.cert_path, files.key_path):
            with open(path) as f:
                out.write(f.read())
    return directory


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def _urls(urls: str | Sequence[str]) -> list[str]:
    return [urls] if isinstance(urls, str) else list(urls)


def _listen(host: str, port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


class HAProxy:
    """`haproxy -db` with deploy/haproxy.cfg rendered for loopback, in front of one Weir
    instance or several (a URL, or a list of them, per listener)."""

    def __init__(
        self,
        directory: str,
        test_ca,
        *,
        client: str | Sequence[str],
        federation: str | Sequence[str],
        host: str = "127.0.0.1",
        federation_port: int = 0,
        check_inter: str | None = None,
        binary: str | None = None,
    ):
        """``federation_port``: a fixed port for the federation frontend (on ``host``), for
        a server name that other servers reach without discovery (``host:port``)."""
        self.binary = binary or haproxy_binary()
        if self.binary is None:
            raise RuntimeError("haproxy not found")
        self.directory = directory
        self.host = host
        # The stats socket's path must fit in sun_path (108 bytes): pytest's folders may not.
        self._sock_dir = tempfile.mkdtemp(prefix="weir-lb-")
        self.stats_path = os.path.join(self._sock_dir, "stats.sock")
        self._listeners = [_listen(host), _listen(host, federation_port)]
        client_sock, federation_sock = self._listeners
        self.client_url = f"https://{host}:{client_sock.getsockname()[1]}"
        self.federation_url = f"https://{host}:{federation_sock.getsockname()[1]}"
        # deploy/'s backends: client requests, long-polls (the client listeners), federation.
        self.names = {
            backend: [f"weir-{n}" for n in range(1, len(_urls(urls)) + 1)]
            for backend, urls in (("client", client), ("sync", client), ("federation", federation))
        }
        certs = write_cert_folder(test_ca, os.path.join(directory, "certs"), "weir.test", host)
        with open(DEPLOY_CONFIG) as f:
            self.config = render_config(
                f.read(),
                client_bind=f"fd@{client_sock.fileno()}",
                federation_bind=f"fd@{federation_sock.fileno()}",
                client_servers=[_host_port(url) for url in _urls(client)],
                federation_servers=[_host_port(url) for url in _urls(federation)],
                certs=certs,
                stats_socket=self.stats_path,
                max_fds=resource.getrlimit(resource.RLIMIT_NOFILE)[1],
                check_inter=check_inter,
            )
        self.config_path = os.path.join(directory, "haproxy.cfg")
        with open(self.config_path, "w") as f:
            f.write(self.config)
        self.log_path = os.path.join(directory, "haproxy.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Self:
        check = subprocess.run(
            [self.binary, "-c", "-q", "-f", self.config_path],
            capture_output=True,
            text=True,
            check=False,
            pass_fds=[s.fileno() for s in self._listeners],
        )
        if check.returncode != 0:
            raise RuntimeError(
                f"haproxy -c refused the rendered config:\n{check.stdout}{check.stderr}"
            )
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "-db", "-f", self.config_path],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            pass_fds=[s.fileno() for s in self._listeners],
        )
        # Up means: every server of both backends passed a real health check (GET /health).
        self.wait_for(self.all_up, timeout, "HAProxy's servers never came UP")
        return self

    def all_up(self) -> bool:
        return all(
            self.server(backend, name).get("check_status") == "L7OK"
            and self.server(backend, name).get("status") == "UP"
            for backend, names in self.names.items()
            for name in names
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # hard stop: close everything now
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self._log.close()
        for sock in self._listeners:
            sock.close()
        shutil.rmtree(self._sock_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the stats socket ----------------------------------------------------------------

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(self.stats_path)
            s.sendall(line.encode() + b"\n")
            chunks = []
            while data := s.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode()

    def stats(self) -> list[dict]:
        """`show stat`: one dict per frontend, backend and server."""
        text = self.command("show stat")
        if not text.startswith("# "):
            raise RuntimeError(f"unexpected stats answer: {text[:200]!r}")
        return list(csv.DictReader(io.StringIO(text[2:])))

    def server(self, backend: str, name: str = "weir-1") -> dict:
        """The stats row of server ``name`` in ``backend`` ({} while HAProxy is starting)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            rows = self.stats()
        except OSError:
            return {}  # the socket is not there yet
        return next((r for r in rows if r["pxname"] == backend and r["svname"] == name), {})

    def requests_served(self, backend: str) -> dict[str, int]:
        """Requests each server of ``backend`` has been sent so far (health checks aside)."""
        return {
            row["svname"]: int(row["req_tot"] or 0)
            for row in self.stats()
            if row["pxname"] == backend and row["svname"] in self.names[backend]
        }

    def wait_for(self, predicate, timeout: float, message: str) -> float:
        """Seconds until ``predicate()`` held. HAProxy has no event to wait on from outside:
        this reads its stats socket every 20 ms, for at most ``timeout``."""
        started = time.monotonic()
        with gevent.Timeout(timeout, AssertionError(f"{message}: {self.log_tail()}")):
            while not predicate():
                gevent.sleep(0.02)
        return time.monotonic() - started

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


class SourceAddressAdapter(HTTPAdapter):
    """A requests transport whose connections come from one local address: a client of its
    own, to anything that keys on the peer address."""

    def __init__(self, source_ip: str, **kw):
        self.source_ip = source_ip
        super().__init__(**kw)

    def init_poolmanager(self, *args, **kw):
        kw["source_address"] = (self.source_ip, 0)
        super().init_poolmanager(*args, **kw)


def client_from(source_ip: str, ca_path: str) -> requests.Session:
    """A session whose every connection comes from ``source_ip``, trusting the test CA."""
    session = requests.Session()
    adapter = SourceAddressAdapter(source_ip)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    session.verify = ca_path
    # Not the environment's CA bundle or proxies (REQUESTS_CA_BUNDLE would win over verify).
    session.trust_env = False
    return session
