"""Running Weir with federation worker shards in tests: settings, the shard processes, and
which process logged what."""

from __future__ import annotations

import os
import re

import gevent
import psutil

from tests.support.federation import federation_settings, tls_listener_settings
from tests.support.server import WeirProcess, base_settings, merge


def sharded_settings(
    test_ca, dns, directory: str, ip: str, shards: int, remote_timeout: float = 3, **security
) -> dict:
    """A TLS federation listener on ``ip`` served by ``shards`` worker shards, talking to
    test peers; ``security`` goes to ``[security.federation]``."""
    fed = federation_settings(test_ca, dns, remote_timeout=remote_timeout)
    fed.update(tls_listener_settings(test_ca, "weir.test", ip, port=0))
    fed["worker"] = {"shards": shards}
    settings = merge(base_settings(os.path.join(directory, "data")), {"federation": fed})
    if security:
        settings["security"] = {"federation": security}
    return settings


def start_sharded(directory: str, settings: dict) -> WeirProcess:
    os.makedirs(directory, exist_ok=True)
    return WeirProcess(directory, settings).start()


def shard_processes(weir: WeirProcess) -> dict[int, psutil.Process]:
    """The running shard processes of a server, by shard index."""
    found = {}
    for child in psutil.Process(weir.proc.pid).children():
        try:
            cmdline = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "federation-shard" in cmdline:
            found[int(cmdline[cmdline.index("--index") + 1])] = child
    return found


def shard_holding_connection(weir: WeirProcess, local_port: int) -> int | None:
    """The index of the shard with an open TCP connection from ``local_port``."""
    for index, process in shard_processes(weir).items():
        if any(c.laddr and c.laddr.port == local_port for c in process.net_connections(kind="tcp")):
            return index
    return None


def access_lines(
    weir: WeirProcess, path_part: str, at_least: int = 1, timeout: float = 5.0
) -> list[tuple[str, str]]:
    """(process label or "main", status) of each access log line whose path has
    ``path_part``, once there are ``at_least`` of them. A line is written after its response
    is sent, and by another process, so the file is re-read until it has them."""
    with gevent.Timeout(timeout, AssertionError(f"fewer than {at_least} lines for {path_part}")):
        while len(lines := _access_lines(weir, path_part)) < at_least:
            gevent.sleep(0.02)
    return lines


def _access_lines(weir: WeirProcess, path_part: str) -> list[tuple[str, str]]:
    out = []
    with open(weir.stderr_path, errors="replace") as f:
        for line in f:
            # "... INFO [shard 1] weir.access [request id]: METHOD PATH STATUS ..."
            match = re.search(
                r"INFO (\[[^\]]+\] )?weir\.access(?: \[\w+\])?: \S+ (\S+) (\d{3}) ", line
            )
            if match and path_part in match.group(2):
                out.append(((match.group(1) or "main").strip(" []"), match.group(3)))
    return out
