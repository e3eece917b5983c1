"""The main process: the client listener, and the federation listener or the shards that
serve it, from start to drain."""

from __future__ import annotations

import gc
import logging
import resource
import sys
from typing import Callable

from homeserver.api.app import CLIENT, FEDERATION
from homeserver.config import Config
from homeserver.core.collector import watch_pauses
from homeserver.core.hub_lateness import HubLateness
from homeserver.processes.lifecycle import stop_on_signals, wait_then_drain
from homeserver.processes.listeners import HomeserverServer
from homeserver.processes.shards import FederationShards
from homeserver.rooms.transactions import TransactionProcessor
from homeserver.runtime import HomeserverRuntime
from homeserver.runtime.queues import QueueWakes
from homeserver.storage.announcements import StreamAnnouncements
from homeserver.storage.instances import InstanceTaken, hold_instance

log = logging.getLogger(__name__)

# Allocations between young collections (the default is 700): see serve().
GC_THRESHOLD = 10_000


def raise_open_files_limit(max_connections: int) -> None:
    """Raises the soft RLIMIT_NOFILE as far as the hard limit allows (shards inherit it):
    every open connection is a descriptor, and the default soft limit (often 1024) is far
    below `max_connections`."""
    # Both listeners may be full, plus the database, peers and log files.
    needed = 2 * max_connections + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the open files limit to %d: %s", target, e)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open files limit %d is under the %d that max_connections = %d may need",
            soft,
            needed,
            max_connections,
        )


def serve(config: Config, config_path: str) -> int:
    """Serves until SIGTERM or SIGINT; 1 if a listener or a shard could not start, 2 if
    another process serves this instance (its name, or the SQLite database)."""
    try:
        lock = hold_instance(config.database.url, config.instance_name)
    except InstanceTaken as e:
        print(f"weir: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        return _serve(config, config_path)
    finally:
        lock.close()


def _listen_to_instances(config: Config, runtime: HomeserverRuntime) -> list[Callable]:
    """With other instances on the database, their writes wake this one's syncs and
    outbound queues; what stops that on drain."""
    if config.cluster.instances < 2:
        return []
    appservices = runtime.appservice_sender
    queues = QueueWakes(
        runtime.federation_sender, appservices, runtime.push_sender, handed_to=appservices
    )

    def heard(positions: dict[str, int]) -> None:
        try:
            runtime.cluster_wakes.on_positions(positions)
        finally:  # each keeps the last position it applied: a batch heard again is safe
            queues.on_positions(positions)

    announcements = StreamAnnouncements(
        config.database.url,
        config.instance_name,
        heard,
        # Destinations whose lease this instance holds, to which others handed EDUs.
        send_to=runtime.federation_sender.wake,
    )
    announcements.start()
    runtime.metrics.track_counter(
        "weir_cluster_queue_wakes",
        "Ranges of other instances' events read to wake this one's outbound queues",
        lambda: queues.wakes,
    )
    runtime.metrics.track_counter(
        "weir_cluster_listen_reconnects",
        "Listening connections for other instances' writes lost and replaced",
        lambda: announcements.reconnects,
    )
    return [announcements.stop]


def _tune_collector(runtime: HomeserverRuntime) -> None:
    # What exists now (modules, the apps, the runtime) lives as long as the process: keep it
    # out of the collector's full passes, whose cost grows with every waiting connection.
    gc.freeze()
    # Collections every 10,000 allocations rather than 700: a wake of 2,000 parked syncs
    # allocates enough to run hundreds of them, the older ones walking what thousands of
    # waiting connections keep. Measured with 4,000 parked and 5,000 idle
    # (loadtests/waiting_bench.py): the wake's p50 1.6 s -> 1.1 s, p99 2.5 s -> 1.7 s.
    gc.set_threshold(GC_THRESHOLD, 10, 10)
    watch_pauses(lambda generation, s: runtime.metrics.gc_pauses.labels(generation).observe(s))


def _start_senders(runtime: HomeserverRuntime) -> None:
    """Main alone sends to other servers, appservices and push gateways; shards only
    receive. Main also resumes the inbound transactions it staged (shards relay to it)."""
    runtime.federation_sender.start()
    runtime.appservice_sender.start()
    runtime.push_sender.start()
    runtime.presence.start()
    inbound = runtime.inbound_transactions
    if isinstance(inbound, TransactionProcessor):
        inbound.resume()


def _serve(config: Config, config_path: str) -> int:
    raise_open_files_limit(config.server.http.max_connections)
    runtime = HomeserverRuntime(config, pools=True)
    runtime.build_all()
    stop_listening = _listen_to_instances(config, runtime)
    # With worker shards, they serve federation and main the client API.
    shards = FederationShards(runtime, config_path) if config.federation.worker.shards else None
    server = HomeserverServer(runtime, listeners=(CLIENT,) if shards else (CLIENT, FEDERATION))
    _tune_collector(runtime)
    try:
        server.start()
    except RuntimeError as e:
        log.error("%s", e)
        runtime.close()
        return 1
    hub_lateness = HubLateness(runtime.metrics.hub_lateness.observe)
    hub_lateness.start()
    stop = stop_on_signals()
    try:
        federation_url = shards.start(stop) if shards else server.federation_url
    except RuntimeError as e:
        log.error("%s", e)
        stop.set()
        federation_url = None
    if federation_url:
        _start_senders(runtime)
        # One parseable line: tests and scripts wait for it instead of polling.
        print(f"weir ready client={server.client_url} federation={federation_url}", flush=True)
        log.info(
            "serving %s: client %s, federation %s",
            config.server_name,
            server.client_url,
            federation_url,
        )
    before = [
        *stop_listening,
        hub_lateness.stop,
        runtime.federation_sender.stop,
        runtime.appservice_sender.stop,
        runtime.push_sender.stop,
        runtime.presence.stop,
        *([shards.stop] if shards else []),
    ]
    wait_then_drain(stop, server, runtime, before=before)
    return 0 if federation_url else 1
