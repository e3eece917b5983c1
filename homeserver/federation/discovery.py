"""Server discovery: which addresses, Host header and TLS name to use for a server name.

Implements the spec v1.16 algorithm ("Resolving server names"), every step:

1. an IP literal, with the given port or 8448;
2. a hostname with an explicit port: its A/AAAA records;
3. ``https://<hostname>/.well-known/matrix/server`` delegating to ``<delegated>[:port]``,
   then for the delegated name: 3.1 IP literal, 3.2 explicit port, 3.3 SRV
   ``_matrix-fed._tcp``, 3.4 the deprecated SRV ``_matrix._tcp``, 3.5 port 8448;
4. (no valid well-known) SRV ``_matrix-fed._tcp.<hostname>``;
5. the deprecated SRV ``_matrix._tcp.<hostname>``;
6. ``<hostname>:8448``.

Every resolved address goes through the IP filter; an empty list after filtering is
``DestinationUnreachable`` with the reason "denied address ..." (for the log: a client is
only told the server cannot be reached). The whole resolution draws from the caller's
``OutboundDeadline``: DNS lifetimes and the well-known fetch get what is left.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable

import dns.exception
import dns.name
import dns.nameserver
import dns.rcode
import dns.resolver

from budget import DeadlineExceeded, OutboundDeadline
from homeserver.core.caching import TtlCache
from homeserver.core.identifiers import is_valid_server_name
from homeserver.federation.errors import (
    DestinationUnreachable,
    FederationError,
    MalformedResponse,
)
from homeserver.federation.ip_filter import IpFilter
from homeserver.federation.transport import (
    Endpoint,
    OutboundTransport,
    discard,
    read_body,
)

log = logging.getLogger(__name__)

DEFAULT_FEDERATION_PORT = 8448
WELL_KNOWN_PATH = "/.well-known/matrix/server"
WELL_KNOWN_MAX_BYTES = 50 * 1024
# Well-known caching (spec recommendation, bounds from the issue).
WELL_KNOWN_DEFAULT_CACHE = 24 * 3600.0
WELL_KNOWN_MIN_CACHE = 5 * 60.0
WELL_KNOWN_MAX_CACHE = 48 * 3600.0
WELL_KNOWN_ERROR_CACHE = 3600.0
# A well-known that does not answer gets at most this, and at most half of what the caller's
# deadline has left, so that SRV and the 8448 fallback still have time. That it timed out is
# remembered for a shorter while than other errors, and only if it had a fair chance
# (WELL_KNOWN_FAIR_WAIT, more than an honest one takes, DNS and TLS included): a call can
# reach a name with little of its deadline left (keys/query behind slow servers, a join
# behind a slow alias server), and what it remembers every lookup of that name, the
# federation sender's included, would use.
WELL_KNOWN_TIMEOUT = 10.0
WELL_KNOWN_FAIR_WAIT = 4.0
WELL_KNOWN_TIMEOUT_CACHE = 120.0
# DNS: a lookup never takes longer than this (nor than the deadline); negative answers
# (NXDOMAIN, no records) are remembered this long.
DNS_TIMEOUT = 5.0
DNS_NEGATIVE_TTL = 60.0
CACHE_ENTRIES = 10_000


@dataclass(frozen=True)
class ResolvedServer:
    """Where to send requests for ``server_name``."""

    server_name: str
    host_header: str  # the Host header value
    tls_server_name: str  # SNI (unless an IP) and the name the certificate must match
    targets: tuple[tuple[str, int], ...]  # (ip, port) in the order to try, already filtered
    expires_at: float  # on the discovery's clock: until then the answer is cached

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.host_header, self.tls_server_name, self.targets)


def split_server_name(server_name: str) -> tuple[str, int | None]:
    """``host[:port]`` -> (host, port or None); IPv6 literals keep their brackets off.
    Raises ValueError for anything that is not a valid server name: the grammar is
    ``identifiers.is_valid_server_name``, the one that validates client input too."""
    if not is_valid_server_name(server_name):
        raise ValueError(f"not a valid server name: {server_name[:300]!r}")
    if server_name.startswith("["):
        end = server_name.index("]")
        host, rest = server_name[1:end], server_name[end + 1 :]
    else:
        host, sep, port = server_name.partition(":")
        rest = sep + port
    return host, int(rest[1:]) if rest else None


def ip_literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _host_with_port(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


class DnsResolver:
    """A/AAAA and SRV look-ups through dnspython, bounded by the deadline, cached with TTLs.

    ``nameservers`` (``"host:port"``) replace the system resolver when given.
    """

    def __init__(
        self, nameservers: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic
    ):
        if nameservers:
            resolver = dns.resolver.Resolver(configure=False)
            resolver.nameservers = [
                dns.nameserver.Do53Nameserver(h.strip("[]"), int(p))
                for h, _, p in (n.rpartition(":") for n in nameservers)
            ]
        else:
            resolver = dns.resolver.Resolver()
        resolver.cache = None  # cached here instead, on our clock, negative answers too
        self._resolver = resolver
        self._clock = clock
        self._cache = TtlCache(clock, CACHE_ENTRIES)

    def _query(self, name: str, rdtype: str, deadline: OutboundDeadline) -> tuple[list, float]:
        """(records, ttl); no records for NXDOMAIN or an empty answer."""
        key = (name.lower().rstrip("."), rdtype)
        cached = self._cache.get(key)
        if cached is not None:
            records, expires_at = cached
            return records, max(0.0, expires_at - self._clock())
        try:
            answer = self._resolver.resolve(
                name, rdtype, search=False, lifetime=deadline.step_timeout(DNS_TIMEOUT)
            )
            if answer.rrset is None:
                # Not with resolve()'s default raise_on_no_answer, which raises NoAnswer:
                # an empty answer all the same.
                records, ttl = [], DNS_NEGATIVE_TTL
            else:
                records, ttl = list(answer), float(answer.rrset.ttl)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            records, ttl = [], DNS_NEGATIVE_TTL
        except dns.exception.Timeout:
            deadline.check()
            raise DestinationUnreachable(name, "DNS timed out") from None
        except dns.exception.DNSException as e:
            raise DestinationUnreachable(name, f"DNS failure: {type(e).__name__}") from None
        self._cache.put(key, (records, self._clock() + ttl), ttl)
        return records, ttl

    def addresses(self, host: str, deadline: OutboundDeadline) -> tuple[list[str], float]:
        """The host's IPv4 then IPv6 addresses, and the shortest TTL among them."""
        found: list[str] = []
        ttls = []
        for rdtype in ("A", "AAAA"):
            records, ttl = self._query(host, rdtype, deadline)
            found += [r.address for r in records]
            if records:
                ttls.append(ttl)
        return found, min(ttls, default=DNS_NEGATIVE_TTL)

    def srv(self, name: str, deadline: OutboundDeadline) -> tuple[list[tuple[str, int]], float]:
        """(target, port) in RFC 2782 order: by priority, weighted-random within one."""
        records, ttl = self._query(name, "SRV", deadline)
        ordered: list[tuple[str, int]] = []
        for priority in sorted({r.priority for r in records}):
            group = [r for r in records if r.priority == priority]
            while group:
                total = sum(r.weight for r in group)
                pick = random.uniform(0, total) if total else 0
                for i, r in enumerate(group):
                    pick -= r.weight
                    if pick <= 0 or i == len(group) - 1:
                        # A target of "." means "no service here" (RFC 2782).
                        target = "" if r.target == dns.name.root else r.target.to_text(True)
                        ordered.append((target, r.port))
                        del group[i]
                        break
        return ordered, ttl

    def clear(self) -> None:
        self._cache.clear()


@dataclass(frozen=True)
class _WellKnown:
    delegated: str | None  # the m.server value, or None when the lookup failed
    error: str = ""


class ServerDiscovery:
    """``resolve(server_name, deadline) -> ResolvedServer``; ``cached(server_name)`` answers
    from memory only (no network), for callers deciding whether a lookup would block."""

    def __init__(
        self,
        transport: OutboundTransport,
        ip_filter: IpFilter,
        dns_resolver: DnsResolver,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.transport = transport
        self.ip_filter = ip_filter
        self.dns = dns_resolver
        self._clock = clock
        self._servers = TtlCache(clock, CACHE_ENTRIES)
        self._well_known = TtlCache(clock, CACHE_ENTRIES)

    def cached(self, server_name: str) -> ResolvedServer | None:
        return self._servers.get(server_name)

    def known_targets(self, server_name: str) -> tuple | None:
        """The addresses of `server_name` if known without touching the network: from the
        cache, or for an IP literal; None when discovery would have to run."""
        hit = self.cached(server_name)
        if hit is not None:
            return hit.targets
        try:
            host, port = split_server_name(server_name)
        except ValueError:
            return None
        literal = ip_literal(host)
        if literal is None or not self.ip_filter.allows(literal):
            return None
        return ((literal, port or DEFAULT_FEDERATION_PORT),)

    def forget(self, server_name: str | None = None) -> None:
        """Drops cached answers (one server's, or all, with DNS and well-known)."""
        if server_name is None:
            self._servers.clear()
            self._well_known.clear()
            self.dns.clear()
        else:
            self._servers.discard(server_name)

    def resolve(self, server_name: str, deadline: OutboundDeadline) -> ResolvedServer:
        """Runs the discovery algorithm (call it inside ``with deadline``)."""
        hit = self.cached(server_name)
        if hit is not None:
            return hit
        try:
            host, port = split_server_name(server_name)
        except ValueError as e:
            raise DestinationUnreachable(server_name, f"invalid server name: {e}") from None
        candidates, host_header, tls_name, ttl = self._discover(server_name, host, port, deadline)
        targets = tuple(t for t in candidates if self.ip_filter.allows(t[0]))
        if not targets:
            if candidates:
                raise DestinationUnreachable(server_name, f"denied address {_shown(candidates)}")
            raise DestinationUnreachable(server_name, "no address")
        resolved = ResolvedServer(
            server_name, host_header, tls_name, tuple(dict.fromkeys(targets)), self._clock() + ttl
        )
        self._servers.put(server_name, resolved, ttl)
        return resolved

    # -- the algorithm ---------------------------------------------------------------------

    def _discover(self, server_name, host, port, deadline):
        """(candidate targets, Host header, TLS name, ttl)."""
        literal = ip_literal(host)
        if literal is not None:  # step 1
            targets = [(literal, port or DEFAULT_FEDERATION_PORT)]
            return targets, server_name, literal, WELL_KNOWN_MAX_CACHE
        if port is not None:  # step 2
            addrs, ttl = self.dns.addresses(host, deadline)
            return [(a, port) for a in addrs], server_name, host, ttl

        well_known, wk_ttl = self._lookup_well_known(host, deadline)  # step 3
        if well_known.delegated is not None:
            try:
                d_host, d_port = split_server_name(well_known.delegated)
            except ValueError:  # validated when fetched; kept defensive
                raise DestinationUnreachable(server_name, "invalid delegated name") from None
            d_literal = ip_literal(d_host)
            if d_literal is not None:  # 3.1
                return (
                    [(d_literal, d_port or DEFAULT_FEDERATION_PORT)],
                    well_known.delegated,
                    d_literal,
                    wk_ttl,
                )
            if d_port is not None:  # 3.2
                addrs, ttl = self.dns.addresses(d_host, deadline)
                return [(a, d_port) for a in addrs], well_known.delegated, d_host, min(ttl, wk_ttl)
            targets, ttl = self._srv_or_default(d_host, deadline)  # 3.3 - 3.5
            return targets, d_host, d_host, min(ttl, wk_ttl)
        targets, ttl = self._srv_or_default(host, deadline)  # steps 4 - 6
        return targets, host, host, min(ttl, wk_ttl)

    def _srv_or_default(self, host: str, deadline: OutboundDeadline):
        for service in ("_matrix-fed._tcp", "_matrix._tcp"):
            records, srv_ttl = self.dns.srv(f"{service}.{host}", deadline)
            if not records:
                continue
            if all(not target for target, _ in records):
                raise DestinationUnreachable(host, "SRV says there is no service")
            targets: list[tuple[str, int]] = []
            ttls = [srv_ttl]
            for target, port in records:
                literal = ip_literal(target)
                if literal is not None:
                    targets.append((literal, port))
                    continue
                addrs, ttl = self.dns.addresses(target, deadline)
                targets += [(a, port) for a in addrs]
                ttls.append(ttl)
            return targets, min(ttls)
        addrs, ttl = self.dns.addresses(host, deadline)
        return [(a, DEFAULT_FEDERATION_PORT) for a in addrs], ttl

    # -- well-known ------------------------------------------------------------------------

    def _lookup_well_known(self, host: str, deadline: OutboundDeadline) -> tuple[_WellKnown, float]:
        cached = self._well_known.get(host)
        if cached is not None:
            result, expires_at = cached
            return result, max(0.0, expires_at - self._clock())
        step = OutboundDeadline(
            min(WELL_KNOWN_TIMEOUT, deadline.remaining() / 2), what=f"well-known of {host}"
        )
        try:
            with step:
                delegated, ttl = self._fetch_well_known(host, step)
            result = _WellKnown(delegated)
        except DeadlineExceeded:
            deadline.check()  # the caller's deadline ran out: nothing learned, nothing cached
            result = _WellKnown(None, f"timed out after {step.seconds:.1f}s")
            ttl = WELL_KNOWN_TIMEOUT_CACHE if step.seconds >= WELL_KNOWN_FAIR_WAIT else 0.0
        except FederationError as e:
            result, ttl = _WellKnown(None, str(e)), WELL_KNOWN_ERROR_CACHE
        if result.delegated is None:
            log.info(
                "well-known of %s: %s; using SRV or port %d",
                host,
                result.error,
                DEFAULT_FEDERATION_PORT,
            )
        if ttl > 0:
            self._well_known.put(host, (result, self._clock() + ttl), ttl)
        return result, ttl  # 0: nor is the server resolved without it cached

    def _fetch_well_known(self, host: str, deadline: OutboundDeadline) -> tuple[str, float]:
        response = self.transport.get_following_redirects(
            f"https://{_host_with_port(host, None)}{WELL_KNOWN_PATH}",
            resolve=self.resolve_host,
            deadline=deadline,
        )
        if response.status != 200:
            discard(response)
            raise MalformedResponse(host, f"well-known answered HTTP {response.status}")
        cache_control = response.headers.get("Cache-Control", "")
        body = read_body(host, response, WELL_KNOWN_MAX_BYTES)
        try:
            delegated = json.loads(body)["m.server"]
            if not isinstance(delegated, str):
                raise TypeError("m.server is not a string")
            split_server_name(delegated)
        except (ValueError, KeyError, TypeError, RecursionError) as e:  # Recursion: too deep
            raise MalformedResponse(host, f"invalid well-known: {e}") from None
        return delegated, _cache_period(cache_control)

    def resolve_host(
        self, host: str, port: int, deadline: OutboundDeadline
    ) -> list[tuple[str, int]]:
        """Plain host resolution for URLs (well-known, media redirects), filtered.
        Raises ``DestinationUnreachable`` for no address or only denied ones."""
        literal = ip_literal(host)
        addrs = [literal] if literal is not None else self.dns.addresses(host, deadline)[0]
        if not addrs:
            raise DestinationUnreachable(host, "no address")
        allowed = [(a, port) for a in addrs if self.ip_filter.allows(a)]
        if not allowed:
            raise DestinationUnreachable(host, f"denied address {_shown((a, port) for a in addrs)}")
        return allowed


def _shown(targets) -> str:
    """Addresses for a reason (a log line; never a client's message: errors.to_client_error)."""
    return ", ".join(_host_with_port(ip, port) for ip, port in targets)


def _cache_period(cache_control: str) -> float:
    """Seconds to cache a valid well-known: max-age within the bounds, else 24 h."""
    directives = {
        d.strip().lower().partition("=")[0]: d.strip().partition("=")[2]
        for d in cache_control.split(",")
        if d.strip()
    }
    if "no-store" in directives or "no-cache" in directives:
        return WELL_KNOWN_MIN_CACHE
    max_age = directives.get("max-age", "").strip('"')
    if max_age.isdigit():
        return min(WELL_KNOWN_MAX_CACHE, max(WELL_KNOWN_MIN_CACHE, float(max_age)))
    return WELL_KNOWN_DEFAULT_CACHE
