"""Remote media tests use the federation tests' peers and listeners."""

from tests.federation.conftest import denied_listeners, start_peer  # noqa: F401
