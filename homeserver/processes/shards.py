"""Federation worker shards, as main supervises them (docs/architecture.md, "Processes").

gevent runs on one core per process, so with ``federation.worker.shards = N > 0`` main binds
the federation listener once and starts N shard processes (``app.py federation-shard``) that
all accept on that one socket, inherited through ``pass_fds``. We chose an inherited socket
over ``SO_REUSEPORT``: there is one accept queue, so a connection waiting in it is taken by
whichever shard is free, and one that a shard has not accepted yet survives that shard's
death (with SO_REUSEPORT each shard has its own queue, and Linux resets the connections
queued on a socket that closes unless net.ipv4.tcp_migrate_req is set); the port is bound
once, so a restarted shard never races a bind, and no other process of the same user can
bind it too and take a share of the connections. Each shard accepts one
connection per wake-up, so a burst spreads over the shards instead of going to the first
one awake.

A shard serves every ``/_matrix/federation/*`` and ``/_matrix/key/*`` route with a runtime
built with ``key_resolution_shards=N`` (its share of its instance's key budget, which is
itself the configured one divided by ``cluster.instances``); main serves the client API and
keeps its instance's whole share for re-verifying the PDUs shards relay to it.

Supervision: a shard that dies is restarted after a backoff (doubling from
``RESTART_BACKOFF_SECONDS`` up to ``RESTART_BACKOFF_MAX_SECONDS``, reset once a shard has
run ``STABLE_SECONDS``) and the exit is logged. A shard exits when main does: it asks the
kernel for SIGTERM on its parent's death (``prctl(PR_SET_PDEATHSIG)``, Linux), and on any
system it stops when its IPC connection to main ends. SIGTERM to main stops every shard
gracefully (they drain in-flight requests, whose relays main still answers), then main.

IPC (``processes/ipc.py``): a Unix socket in ``data_dir/ipc/`` carries HELLO (a shard is
serving), HEALTH (main checks each shard every ``HEALTH_INTERVAL_SECONDS``; the number
alive is the ``weir_federation_shards_alive`` gauge) and RELAY (a transaction's checked
PDUs, and main's answer). Keys need no cache invalidation: every process reads and writes
the one key cache in the database.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import gevent
from gevent.event import Event

from homeserver.config import Config
from homeserver.core.errors import MatrixError
from homeserver.federation.errors import KeyResolutionRefused
from homeserver.processes.ipc import FrameConnection, FrameType, IpcError, IpcServer
from homeserver.processes.listeners import SHUTDOWN_GRACE_SECONDS

log = logging.getLogger(__name__)

APP_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "app.py"
)

RESTART_BACKOFF_SECONDS = 0.5
RESTART_BACKOFF_MAX_SECONDS = 30.0
STABLE_SECONDS = 60.0
HEALTH_INTERVAL_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 60.0
# A shard waits this long for main's answer to a relayed transaction: main may first fetch
# keys (at most the keyring's 10 s) and then store up to 50 events.
RELAY_TIMEOUT_SECONDS = 60.0
LISTEN_BACKLOG = 1024
# sockaddr_un.sun_path holds 108 bytes, the final NUL included.
_MAX_SOCKET_PATH = 107


def ipc_socket_path(config: Config) -> str:
    path = os.path.join(config.data_dir, "ipc", "shards.sock")
    if len(path.encode()) > _MAX_SOCKET_PATH:
        raise RuntimeError(
            f"data_dir is too long for the shard IPC socket ({path}): "
            f"a Unix socket path may have at most {_MAX_SOCKET_PATH} bytes"
        )
    return path


def _bind_listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class _Shard:
    index: int
    process: subprocess.Popen | None = None
    connection: FrameConnection | None = None
    last_seen: float = 0.0
    health: dict = field(default_factory=dict)
    restarts: int = 0


class FederationShards:
    """Main's side: the listener, the shard processes, their supervision and their IPC."""

    def __init__(self, runtime, config_path: str):
        self.runtime = runtime
        self.config = runtime.config
        self.config_path = os.path.abspath(config_path)
        self.count = self.config.federation.worker.shards
        self.shards = [_Shard(i) for i in range(1, self.count + 1)]
        self.listener: socket.socket | None = None
        self.ipc: IpcServer | None = None
        self._greenlets: list[gevent.Greenlet] = []
        self._stopping = Event()
        self._changed = Event()
        metrics = runtime.metrics
        metrics.track_gauge(
            "weir_federation_shards_alive",
            "Federation worker shards running and answering health checks",
            self.alive,
        )
        metrics.track_counter(
            "weir_federation_shard_restarts",
            "Federation worker shards restarted after dying",
            lambda: sum(s.restarts for s in self.shards),
        )
        metrics.track_gauge(
            "weir_federation_shards_key_resolution_in_flight",
            "Key fetches in flight in all shards, at their last health check",
            lambda: sum(
                s.health.get("key_resolution_in_flight", 0)
                for s in self.shards
                if s.connection is not None
            ),
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, cancelled: Event, ready_timeout: float = READY_TIMEOUT_SECONDS) -> str:
        """Binds the listener, starts the shards and waits until each one serves. Returns
        the federation URL. Raises RuntimeError if they do not all come up in time, or if
        ``cancelled`` is set first (a SIGTERM while starting)."""
        fed = self.config.federation
        self.ipc = IpcServer(
            ipc_socket_path(self.config),
            {
                FrameType.HELLO: self._hello,
                FrameType.RELAY: self._relay,
                FrameType.MEMBERSHIP: self._membership,
            },
            on_close=self._disconnected,
        ).start()
        try:
            self.listener = _bind_listener(fed.bind_address, fed.port)
        except OSError as e:
            raise RuntimeError(f"cannot listen on {fed.bind_address}:{fed.port}: {e}") from None
        self._greenlets = [gevent.spawn(self._supervise, shard) for shard in self.shards]
        self._greenlets.append(gevent.spawn(self._check_health))
        end = time.monotonic() + ready_timeout
        while not all(s.connection is not None for s in self.shards):
            left = end - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"federation shards not serving after {ready_timeout:.0f}s")
            if cancelled.is_set():
                raise RuntimeError("stopped while the federation shards were starting")
            gevent.wait([self._changed, cancelled], timeout=left, count=1)
        host, port = self.listener.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if fed.tls_certificate else 'http'}://{host}:{port}"

    def stop(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """SIGTERM to every shard; after server.http.shutdown_drain_delay they drain within
        ``grace`` (their relays still answered), and one still running a little after that
        is killed."""
        self._stopping.set()
        gevent.killall(self._greenlets)
        running = [
            s.process for s in self.shards if s.process is not None and s.process.poll() is None
        ]
        for process in running:
            process.send_signal(signal.SIGTERM)
        end = time.monotonic() + self.config.server.http.shutdown_drain_delay + grace + 5
        for process in running:
            try:
                process.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("federation shard pid %d did not stop; killing it", process.pid)
                process.kill()
                process.wait()
        if self.ipc is not None:
            self.ipc.stop()
        if self.listener is not None:
            self.listener.close()
        log.info("federation shards stopped")

    def alive(self) -> int:
        """Shards whose process runs and that answered a health check lately."""
        recent = time.monotonic() - 3 * HEALTH_INTERVAL_SECONDS
        return sum(
            1
            for s in self.shards
            if s.process is not None
            and s.process.poll() is None
            and s.connection is not None
            and s.last_seen >= recent
        )

    # -- supervision -----------------------------------------------------------------------

    def _supervise(self, shard: _Shard) -> None:
        backoff = RESTART_BACKOFF_SECONDS
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                shard.process = self._spawn(shard)
            except OSError as e:
                # Out of descriptors or processes for now: try again later, rather than end
                # this shard's supervision for the life of the server.
                log.error(
                    "federation shard %d could not be started: %s; retrying in %.1fs",
                    shard.index,
                    e,
                    backoff,
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, RESTART_BACKOFF_MAX_SECONDS)
                continue
            log.info("federation shard %d started (pid %d)", shard.index, shard.process.pid)
            code = shard.process.wait()
            if self._stopping.is_set():
                return
            ran = time.monotonic() - started
            if ran >= STABLE_SECONDS:
                backoff = RESTART_BACKOFF_SECONDS
            how = f"signal {-code}" if code < 0 else f"status {code}"
            log.warning(
                "federation shard %d (pid %d) exited with %s after %.1fs; restarting in %.1fs",
                shard.index,
                shard.process.pid,
                how,
                ran,
                backoff,
            )
            shard.restarts += 1
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_SECONDS)

    def _spawn(self, shard: _Shard) -> subprocess.Popen:
        if self.listener is None:
            raise RuntimeError(
                "federation shards are spawned only once start() has bound the listener"
            )
        fd = self.listener.fileno()
        return subprocess.Popen(
            [
                sys.executable,
                APP_PATH,
                "--config",
                self.config_path,
                "federation-shard",
                "--index",
                str(shard.index),
                "--listen-fd",
                str(fd),
                "--parent-pid",
                str(os.getpid()),
            ],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )

    def _check_health(self) -> None:
        while True:
            self._stopping.wait(HEALTH_INTERVAL_SECONDS)
            jobs = [
                gevent.spawn(self._check_one, s) for s in self.shards if s.connection is not None
            ]
            gevent.joinall(jobs)

    def _check_one(self, shard: _Shard) -> None:
        connection = shard.connection
        if connection is None:
            return  # it disconnected after this check was scheduled: nothing to ask
        try:
            shard.health = connection.request(FrameType.HEALTH, {}, HEALTH_INTERVAL_SECONDS)
            shard.last_seen = time.monotonic()
        except IpcError as e:
            if not connection.closed:  # a closed one is a shard that stopped: logged there
                log.warning("federation shard %d failed its health check: %s", shard.index, e)

    def _notify(self) -> None:
        changed, self._changed = self._changed, Event()
        changed.set()

    # -- IPC handlers ----------------------------------------------------------------------

    def _hello(self, connection: FrameConnection, body: dict) -> dict:
        index, pid = body.get("shard"), body.get("pid")
        shard = next((s for s in self.shards if s.index == index), None)
        if shard is None or shard.process is None or shard.process.pid != pid:
            raise ValueError(f"no shard {index!r} with pid {pid!r} was started")
        connection.name = f"shard {index}"
        shard.connection = connection
        shard.last_seen = time.monotonic()
        log.info("federation shard %d (pid %d) is serving", index, pid)
        self._notify()
        return {}

    def _disconnected(self, connection: FrameConnection) -> None:
        for shard in self.shards:
            if shard.connection is connection:
                shard.connection = None
                self._notify()

    def _relay(self, connection: FrameConnection, body: dict) -> dict:
        return answer_relay(self.runtime.inbound_transactions, body)

    def _membership(self, connection: FrameConnection, body: dict) -> dict:
        return answer_membership(self.runtime.federation_membership, body)


# The membership writes a shard hands main, and their arguments' types.
_MEMBERSHIP_CALLS = {
    "send_membership": {
        "origin": str,
        "room_id": str,
        "event_id": str,
        "pdu": dict,
        "membership": str,
    },
    "receive_invite": {"origin": str, "room_id": str, "event_id": str, "body": dict},
}


def answer_membership(membership, body: dict) -> dict:
    """Main's answer to a MEMBERSHIP frame: main checks and stores the event itself
    (rooms/federation_membership.py), as for a relayed transaction."""
    call, args, source_ip = body.get("call"), body.get("args"), body.get("source_ip")
    types = _MEMBERSHIP_CALLS.get(call) if isinstance(call, str) else None
    if (
        not isinstance(call, str)
        or types is None
        or not isinstance(args, dict)
        or set(args) != set(types)
        or not all(isinstance(args[k], t) for k, t in types.items())
        or not (source_ip is None or isinstance(source_ip, str))
    ):
        raise ValueError("malformed membership relay")
    try:
        return {"answer": getattr(membership, call)(**args, source_ip=source_ip)}
    except KeyResolutionRefused as e:
        return {"refused": {"server": e.destination, "retry_after_ms": e.retry_after_ms}}
    except MatrixError as e:
        return {"error": {"status": e.status, "body": e.to_json()}}


def answer_relay(processor, body: dict) -> dict:
    """Main's answer to a RELAY frame: it checks the PDUs again under its own budget,
    authorises and stores them, then applies the EDUs (``TransactionProcessor.receive``)."""
    origin, txn_id = body.get("origin"), body.get("txn_id")
    pdus, results = body.get("pdus"), body.get("results")
    source_ip, edus = body.get("source_ip"), body.get("edus", [])
    if not (
        isinstance(origin, str)
        and isinstance(txn_id, str)
        and isinstance(pdus, list)
        and all(isinstance(p, dict) for p in pdus)
        and isinstance(results, dict)
        and (source_ip is None or isinstance(source_ip, str))
        and isinstance(edus, list)
    ):
        raise ValueError("malformed relay")
    try:
        answer = processor.receive(origin, txn_id, pdus, source_ip, results, edus)
    except KeyResolutionRefused as e:
        return {"refused": {"server": e.destination, "retry_after_ms": e.retry_after_ms}}
    except MatrixError as e:  # too many of the origin's transactions at once
        return {"error": {"status": e.status, "body": e.to_json()}}
    return {"answer": answer}
