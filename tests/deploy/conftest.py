"""Fixtures for the deployment tests: the haproxy binary (DNS is tests/conftest.py's)."""

import os

import pytest

from tests.support.haproxy import haproxy_binary, haproxy_version


@pytest.fixture(scope="session")
def haproxy_bin():
    """The haproxy binary. `make test` installs it (apt-get, as root); where it is missing
    the tests skip, except under CI, where they must run."""
    binary = haproxy_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "haproxy not found, and CI requires the HAProxy tests "
                "(make test installs it with apt-get when run as root)"
            )
        pytest.skip("haproxy not found: `apt-get install haproxy` (make test does, as root)")
    print(f"\nhaproxy {haproxy_version(binary)} ({binary})")
    return binary
