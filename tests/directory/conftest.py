# The federation test fixtures (loopback DNS server, TLS peers), shared with this package.
from tests.federation.conftest import denied_listeners, dns, start_peer  # noqa: F401
