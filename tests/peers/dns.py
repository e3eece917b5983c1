"""A loopback DNS server for tests: dnspython wire format over UDP, run as a greenlet.

Records are set per test; a name with no records at all answers NXDOMAIN, a name with records
of other types answers NOERROR with no answer. ``blackhole(name)`` makes queries for a name go
unanswered (a resolver timeout). Every query is counted, so tests can assert "answered from
cache: no query".

    with DnsServer("127.0.0.1") as dns:
        dns.add_a("peer.test", "127.10.0.1", ttl=300)
        dns.add_srv("_matrix-fed._tcp.peer.test", "fed.peer.test", 8448)
        ... federation.dns_nameservers = [dns.nameserver] ...
        assert dns.count("peer.test", "A") == 1
"""

from __future__ import annotations

import time
from collections import Counter

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import gevent
from gevent import socket
from gevent.event import Event

__all__ = ["DnsServer"]


def _key(name: str) -> str:
    return name.lower().rstrip(".")


class DnsServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self._records: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self._blackholed: set[str] = set()
        self.queries: Counter = Counter()  # (name, type) -> queries received
        self._sock: socket.socket | None = None
        self._loop: gevent.Greenlet | None = None
        self._changed = Event()

    # -- records ---------------------------------------------------------------------------

    def add(self, name: str, rdtype: str, value: str, ttl: int = 300) -> None:
        self._records.setdefault((_key(name), rdtype.upper()), []).append((value, ttl))

    def add_a(self, name: str, address: str, ttl: int = 300) -> None:
        self.add(name, "A", address, ttl)

    def add_aaaa(self, name: str, address: str, ttl: int = 300) -> None:
        self.add(name, "AAAA", address, ttl)

    def add_srv(
        self, name: str, target: str, port: int, priority: int = 10, weight: int = 5, ttl: int = 300
    ) -> None:
        self.add(name, "SRV", f"{priority} {weight} {port} {target.rstrip('.')}.", ttl)

    def remove(self, name: str, rdtype: str | None = None) -> None:
        for key in [
            k
            for k in self._records
            if k[0] == _key(name) and (rdtype is None or k[1] == rdtype.upper())
        ]:
            del self._records[key]

    def blackhole(self, name: str) -> None:
        """Never answer queries for ``name``."""
        self._blackholed.add(_key(name))

    def count(self, name: str, rdtype: str | None = None) -> int:
        return sum(
            n
            for (qname, qtype), n in self.queries.items()
            if qname == _key(name) and (rdtype is None or qtype == rdtype.upper())
        )

    @property
    def total_queries(self) -> int:
        return sum(self.queries.values())

    @property
    def nameserver(self) -> str:
        """The ``host:port`` to put in ``federation.dns_nameservers``."""
        return f"{self.host}:{self.port}"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> DnsServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((self.host, self.port))
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._loop = gevent.spawn(self._serve)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.kill()
            self._loop = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> DnsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_queries(self, name: str, rdtype: str, n: int, timeout: float = 10) -> bool:
        end = time.monotonic() + timeout
        while self.count(name, rdtype) < n:
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._changed.wait(left)
        return True

    # -- serving ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            data, addr = self._sock.recvfrom(4096)
            try:
                query = dns.message.from_wire(data)
            except Exception:
                continue
            reply = self._answer(query)
            changed, self._changed = self._changed, Event()
            changed.set()
            if reply is not None:
                self._sock.sendto(reply.to_wire(), addr)

    def _answer(self, query: dns.message.Message) -> dns.message.Message | None:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        for question in query.question:
            name = _key(question.name.to_text())
            rdtype = dns.rdatatype.to_text(question.rdtype)
            self.queries[(name, rdtype)] += 1
            if name in self._blackholed:
                return None
            records = self._records.get((name, rdtype))
            if records:
                rrset = dns.rrset.from_text_list(
                    question.name,
                    min(t for _, t in records),
                    dns.rdataclass.IN,
                    rdtype,
                    [v for v, _ in records],
                )
                response.answer.append(rrset)
            elif not any(k[0] == name for k in self._records):
                response.set_rcode(dns.rcode.NXDOMAIN)
        return response
