"""A federation worker shard process (homeserver/processes/shards.py says why shards exist
and how main supervises them): its link to main, and its life from start to drain."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket

import gevent
from gevent.event import Event

from homeserver.api.app import FEDERATION
from homeserver.config import Config
from homeserver.core.errors import Codes, MatrixError
from homeserver.federation.errors import KeyResolutionRefused
from homeserver.processes.ipc import FrameConnection, FrameType, IpcError, connect
from homeserver.processes.lifecycle import stop_on_signals, wait_then_drain
from homeserver.processes.listeners import HomeserverServer
from homeserver.processes.shards import RELAY_TIMEOUT_SECONDS, ipc_socket_path
from homeserver.runtime import HomeserverRuntime

log = logging.getLogger(__name__)


class MainLink:
    """A shard's connection to main: relays transactions, answers health checks."""

    def __init__(self, index: int, path: str, stopped: Event):
        self.index = index
        # Set once built: the health report reads it.
        self.runtime: HomeserverRuntime | None = None
        self.connection = self._connect(path, stopped)

    def _connect(self, path: str, stopped: Event) -> FrameConnection:
        # Main created the socket before starting us; a few tries cover a slow start.
        for _ in range(50):
            try:
                return connect(
                    path, {FrameType.HEALTH: self._health}, on_close=lambda _conn: stopped.set()
                )
            except OSError as e:
                error = e
                gevent.sleep(0.1)
        raise RuntimeError(f"cannot reach main at {path}: {error}")

    def hello(self) -> None:
        self.connection.request(
            FrameType.HELLO, {"shard": self.index, "pid": os.getpid()}, RELAY_TIMEOUT_SECONDS
        )

    def relay(
        self,
        origin: str,
        txn_id: str,
        pdus: list,
        results: dict,
        source_ip: str | None,
        edus: list | None = None,
    ) -> dict:
        """Main's answer to a checked transaction (``rooms/transactions.py`` Relay); its EDUs
        are applied in main, where typing lives and syncs wait."""
        body = {"origin": origin, "txn_id": txn_id, "pdus": pdus, "results": results}
        frame = {**body, "source_ip": source_ip, "edus": edus or []}
        return self._ask_main(FrameType.RELAY, frame, origin)

    def membership(self, call: str, args: dict, source_ip: str | None) -> dict:
        """Main's answer to a membership write (``rooms/federation_membership.py``
        MembershipRelay): main checks and stores it, as it does a transaction."""
        frame = {"call": call, "args": args, "source_ip": source_ip}
        return self._ask_main(FrameType.MEMBERSHIP, frame, str(args.get("origin")))

    def _ask_main(self, frame_type: FrameType, body: dict, origin: str) -> dict:
        try:
            reply = self.connection.request(frame_type, body, RELAY_TIMEOUT_SECONDS)
        except IpcError as e:
            # Main may or may not have applied it: a retry gets main's recorded answer.
            log.warning("relaying %s from %s to main: %s", frame_type.name, origin, e)
            raise MatrixError(
                503,
                Codes.UNKNOWN,
                "The request could not be finished now; retry it",
                headers={"Retry-After": "1"},
            ) from None
        error = reply.get("error")
        if isinstance(error, dict) and isinstance(error.get("body"), dict):
            found = error["body"]
            extra = {k: v for k, v in found.items() if k not in ("errcode", "error")}
            raise MatrixError(
                int(error.get("status") or 500),
                str(found.get("errcode") or Codes.UNKNOWN),
                str(found.get("error") or ""),
                **extra,
            )
        refused = reply.get("refused")
        if isinstance(refused, dict):
            raise KeyResolutionRefused(
                str(refused.get("server")),
                int(refused.get("retry_after_ms") or 1000),
                "main's key budget",
            )
        answer = reply.get("answer")
        if not isinstance(answer, dict):
            raise MatrixError(500, Codes.UNKNOWN, "Malformed answer from the main process")
        return answer

    def _health(self, connection: FrameConnection, body: dict) -> dict:
        rt = self.runtime
        return {
            "shard": self.index,
            "pid": os.getpid(),
            "key_resolution_in_flight": rt.key_resolution_budget.in_flight if rt else 0,
        }


def die_with_parent() -> None:
    """Asks Linux to SIGTERM us when our parent dies. Elsewhere this does nothing; the IPC
    connection to main ending stops the shard anyway."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError):
        pass


def run_shard(config: Config, index: int, listen_fd: int, parent_pid: int) -> int:
    """A shard process: federation only, on the listening socket inherited from main."""
    die_with_parent()
    if os.getppid() != parent_pid:
        return 0  # main died before we could ask to follow it
    stopped = stop_on_signals()
    try:
        link = MainLink(index, ipc_socket_path(config), stopped)
    except RuntimeError as e:
        log.error("%s", e)
        return 1
    runtime = HomeserverRuntime(
        config,
        pools=True,
        key_resolution_shards=config.federation.worker.shards,
        transaction_relay=link.relay,
        membership_relay=link.membership,
    )
    link.runtime = runtime
    listener = socket.socket(fileno=listen_fd)
    server = HomeserverServer(runtime, federation_listener=listener, listeners=(FEDERATION,))
    server.federation_server.max_accept = 1  # take one connection per wake-up: spread bursts
    server.start()
    try:
        link.hello()
    except IpcError as e:
        log.error("main did not take our hello: %s", e)
        stopped.set()
    wait_then_drain(stopped, server, runtime, after=[link.connection.close])
    return 0
