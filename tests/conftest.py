# Patch first: every socket, lock and thread the tests touch must be cooperative.
from gevent import monkey

monkey.patch_all()

import os  # noqa: E402

import pytest  # noqa: E402

from tests.support.postgres import PostgresCluster, find_pg_bin  # noqa: E402
from tests.support.server import MatrixClient, WeirProcess, base_settings, merge  # noqa: E402
from tests.support.synapse import SynapseServer, synapse_available  # noqa: E402
from tests.support.tls import TestCA  # noqa: E402


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
    """A fresh, empty database on each engine in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/homeserver.db"
    return request.getfixturevalue("pg_cluster").new_database()


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
