"""A real Synapse on loopback, as a federation peer for interop tests.

Synapse runs from its own venv (``make synapse`` builds ``.venv-synapse``) with a generated
config: SQLite, a TLS federation listener with a certificate from the test CA, our CA in
``federation_custom_ca_list``, loopback allowed for outbound federation, registration by
shared secret, and no notaries (nothing leaves the machine). Its server name is an IP literal
with a port, which both sides resolve without DNS (discovery step 1).

    synapse = SynapseServer(directory, test_ca, ip="127.31.100.1").start()
    token = synapse.register("bob")["access_token"]
    requests.get(synapse.client_url + "/_matrix/client/v3/profile/@alice:...", ...)
    synapse.stop()

The session fixture ``synapse`` (tests/conftest.py) shares one across the test session.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import subprocess

import gevent
import requests

from tests.support.server import REPO, terminate

SYNAPSE_PYTHON = os.path.join(REPO, ".venv-synapse", "bin", "python")
SHARED_SECRET = "synapse-test-shared-secret"
_LISTENING = re.compile(r"Synapse now listening on TCP port (\d+)")


def synapse_available() -> bool:
    return os.path.exists(SYNAPSE_PYTHON)


def _free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class SynapseServer:
    def __init__(
        self, directory: str, test_ca, ip: str = "127.31.100.1", federation_port: int = 8448
    ):
        self.directory = directory
        self.ip = ip
        self.federation_port = federation_port
        self.server_name = f"{ip}:{federation_port}"
        self.client_port = _free_port()
        self.client_url = f"http://127.0.0.1:{self.client_port}"
        self.federation_url = f"https://{ip}:{federation_port}"
        self.log_path = os.path.join(directory, "synapse.log")
        self.config_path = os.path.join(directory, "homeserver.yaml")
        self.proc: subprocess.Popen | None = None
        self._admin_token: str | None = None
        self._write_config(test_ca)

    def _write_config(self, test_ca) -> None:
        os.makedirs(self.directory, exist_ok=True)
        cert = test_ca.issue(self.ip)
        d = self.directory
        log_config = os.path.join(d, "log.yaml")
        # JSON is YAML: written without a YAML library.
        with open(log_config, "w") as f:
            json.dump(
                {
                    "version": 1,
                    "formatters": {
                        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
                    },
                    "handlers": {
                        "stderr": {
                            "class": "logging.StreamHandler",
                            "formatter": "plain",
                            "stream": "ext://sys.stderr",
                        }
                    },
                    "root": {"level": "INFO", "handlers": ["stderr"]},
                    "disable_existing_loggers": False,
                },
                f,
            )
        config = {
            "server_name": self.server_name,
            "pid_file": os.path.join(d, "homeserver.pid"),
            "report_stats": False,
            "signing_key_path": os.path.join(d, "signing.key"),
            "media_store_path": os.path.join(d, "media"),
            "log_config": log_config,
            "database": {"name": "sqlite3", "args": {"database": os.path.join(d, "homeserver.db")}},
            "listeners": [
                {
                    "port": self.federation_port,
                    "bind_addresses": [self.ip],
                    "type": "http",
                    "tls": True,
                    "x_forwarded": False,
                    "resources": [{"names": ["federation"], "compress": False}],
                },
                {
                    "port": self.client_port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "x_forwarded": False,
                    "resources": [{"names": ["client"], "compress": False}],
                },
            ],
            "tls_certificate_path": cert.cert_path,
            "tls_private_key_path": cert.key_path,
            "federation_verify_certificates": True,
            "federation_custom_ca_list": [test_ca.ca_path],
            # 127/8 is in Synapse's default blocklist. Its allowlist does not apply to IP
            # literal server names (the bug the issue mentions), so the blocklist itself is
            # replaced by one without loopback for the test peers.
            "ip_range_blacklist": ["192.0.2.0/24"],
            "ip_range_whitelist": ["127.0.0.0/8"],
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "registration_shared_secret": SHARED_SECRET,
            "enable_registration": False,
            "macaroon_secret_key": "synapse-test-macaroon",
            "form_secret": "synapse-test-form",
            "enable_metrics": False,
            # The room directory over federation, for the directory interop tests.
            "allow_public_rooms_over_federation": True,
            "room_list_publication_rules": [{"action": "allow"}],
            "rc_federation": {
                "window_size": 1000,
                "sleep_limit": 1000,
                "sleep_delay": 0,
                "reject_limit": 1000,
                "concurrent": 100,
            },
            "rc_registration": {"per_second": 100, "burst_count": 100},
            # Tests that build history send dozens of messages in a row.
            "rc_message": {"per_second": 100, "burst_count": 100},
            # The sliding sync comparison's user creates 30 rooms at once.
            "rc_room_creation": {"per_second": 100, "burst_count": 100},
            "rc_login": {
                "address": {"per_second": 100, "burst_count": 100},
                "account": {"per_second": 100, "burst_count": 100},
            },
        }
        with open(self.config_path, "w") as f:
            json.dump(config, f, indent=1)

    def start(self, timeout: float = 120) -> SynapseServer:
        # A restart has its keys already: generating them is a whole Synapse start-up.
        if not os.path.exists(os.path.join(self.directory, "signing.key")):
            subprocess.run(
                [
                    SYNAPSE_PYTHON,
                    "-m",
                    "synapse.app.homeserver",
                    "-c",
                    self.config_path,
                    "--generate-keys",
                ],
                cwd=self.directory,
                check=True,
                capture_output=True,
                timeout=timeout,
            )
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [SYNAPSE_PYTHON, "-m", "synapse.app.homeserver", "-c", self.config_path],
            cwd=self.directory,
            stdout=self._log,
            stderr=subprocess.PIPE,
        )
        # Ready once both listeners say so (read from its log, no polling).
        ports = set()
        with gevent.Timeout(timeout, RuntimeError(f"synapse not ready: {self.log_tail()}")):
            for raw in self.proc.stderr:
                self._log.write(raw)
                match = _LISTENING.search(raw.decode(errors="replace"))
                if match:
                    ports.add(int(match.group(1)))
                    if ports >= {self.federation_port, self.client_port}:
                        break
            else:
                raise RuntimeError(f"synapse exited with {self.proc.wait()}: {self.log_tail()}")
        gevent.spawn(self._copy_log)
        return self

    def _copy_log(self) -> None:
        for raw in self.proc.stderr:
            self._log.write(raw)
            self._log.flush()

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def register(
        self, localpart: str, password: str = "correct horse battery", admin: bool = False
    ) -> dict:
        """Creates a user through the shared-secret admin API; returns the login response."""
        url = self.client_url + "/_synapse/admin/v1/register"
        nonce = requests.get(url, timeout=30).json()["nonce"]
        mac = hmac.new(SHARED_SECRET.encode(), digestmod=hashlib.sha1)
        mac.update(
            b"\x00".join(
                [
                    nonce.encode(),
                    localpart.encode(),
                    password.encode(),
                    b"admin" if admin else b"notadmin",
                ]
            )
        )
        r = requests.post(
            url,
            json={
                "nonce": nonce,
                "username": localpart,
                "password": password,
                "admin": admin,
                "mac": mac.hexdigest(),
            },
            timeout=30,
        )
        r.raise_for_status()
        return r.json()

    def back_off_from(self, destination: str, user_id: str, within: float = 60) -> None:
        """Makes Synapse hold `destination`, which must be down, as down: a key claim for
        `user_id` there fails at once and backs Synapse off from it. Returns once Synapse's
        database says so. A transaction Synapse is still retrying to `destination` then goes
        out as soon as `destination` sends Synapse anything, not at its next retry (up to a
        minute later)."""
        if self._admin_token is None:
            self._admin_token = self.register("backoff_admin", admin=True)["access_token"]
        headers = {"Authorization": f"Bearer {self._admin_token}"}
        claim = {"one_time_keys": {user_id: {"ANYDEVICE": "signed_curve25519"}}}
        r = requests.post(
            self.client_url + "/_matrix/client/v3/keys/claim",
            json=claim,
            headers=headers,
            timeout=30,
        )
        assert r.status_code == 200 and destination in r.json()["failures"], r.text
        url = f"{self.client_url}/_synapse/admin/v1/federation/destinations/{destination}"
        with gevent.Timeout(within, AssertionError(f"Synapse never backed off {destination}")):
            while not requests.get(url, headers=headers, timeout=30).json()["retry_last_ts"]:
                gevent.sleep(0.05)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None:
            return
        terminate(self.proc, timeout)
        self._log.close()
        self.proc = None
