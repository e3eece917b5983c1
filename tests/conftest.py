# Patch first: every socket, lock and thread the tests touch must be cooperative.
from gevent import monkey

monkey.patch_all()

import os

import pytest

from tests.peers.dns import DnsServer
from tests.peers.honest import HonestPeer
from tests.peers.tarpit import Tarpit
from tests.support.federation import DENIED_IP
from tests.support.postgres import PostgresCluster, find_pg_bin
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge
from tests.support.synapse import SynapseServer, synapse_available
from tests.support.tls import TestCA


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory):
    """The session's test certificate authority (trustme); `test_ca.ca_path` is its PEM."""
    return TestCA(str(tmp_path_factory.mktemp("ca")))


@pytest.fixture(scope="session")
def pg_cluster():
    bindir = find_pg_bin()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL binaries not found, and CI requires the PostgreSQL tests")
        pytest.skip("PostgreSQL binaries not found")
    cluster = PostgresCluster(bindir).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def synapse(test_ca, tmp_path_factory):
    """A real Synapse 1.163 on loopback (TLS federation on 127.31.100.1:8448), shared by the
    session. Needs `make synapse`; under CI its absence is a failure, not a skip."""
    if not synapse_available():
        if os.environ.get("CI") == "true":
            pytest.fail("Synapse venv missing: `make synapse` (make test depends on it)")
        pytest.skip("Synapse venv missing: run `make synapse`")
    # WEIR_TEST_SYNAPSE_IP moves it, so that two test runs on one machine do not collide.
    ip = os.environ.get("WEIR_TEST_SYNAPSE_IP", "127.31.100.1")
    server = SynapseServer(str(tmp_path_factory.mktemp("synapse")), test_ca, ip=ip).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path):
    """A fresh database on each engine in turn: a new SQLite file, or a PostgreSQL database
    already migrated (`PostgresCluster.new_database`), where `migrate` has nothing to do."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/homeserver.db"
    return request.getfixturevalue("pg_cluster").new_database()


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request, tmp_path):
    """A fresh, empty database on each engine in turn: for a test of the migrations."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/homeserver.db"
    return request.getfixturevalue("pg_cluster").new_database(empty=True)


@pytest.fixture
def start_weir(tmp_path):
    """Starts real server processes: start_weir({...settings overrides...})."""
    started: list[WeirProcess] = []

    def start(overrides: dict | None = None, name: str = "weir", env: dict | None = None):
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        settings = merge(base_settings(str(directory / "data")), overrides or {})
        proc = WeirProcess(str(directory), settings, env=env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def weir(start_weir):
    """One server process with default test settings."""
    return start_weir()


@pytest.fixture
def client(weir):
    return MatrixClient(weir.client_url)


# Remote servers for every package that federates (federation, rooms, processes, directory,
# media): a loopback DNS server, TLS peers, and listeners on the denied address.


@pytest.fixture(scope="module")
def dns():
    """One DNS server per module; tests use names of their own."""
    with DnsServer("127.0.0.1") as server:
        yield server


@pytest.fixture
def start_peer(test_ca):
    """start_peer(server_name, ip, port=8448, cls=HonestPeer, **kw): a running TLS peer,
    stopped after the test."""
    started = []

    def start(server_name, ip, port=8448, cls=HonestPeer, **kw):
        peer = cls(server_name, test_ca, host=ip, port=port, **kw).start()
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.stop()


@pytest.fixture
def denied_listeners():
    """Listeners on the denied address, on the ports discovery would use (443, 8448): they
    count accepts, and SSRF tests assert there are none."""
    listeners = [Tarpit(DENIED_IP, port).start() for port in (443, 8448)]
    yield listeners
    for listener in listeners:
        listener.stop()
