"""The client key that budgets and rate limiters count by.

The key is the client's address, normalised so that one client cannot spread
itself over many keys cheaply: IPv6 is grouped by prefix (an ISP hands a
customer a whole /64, or more), IPv4-mapped IPv6 counts as the IPv4 address.
X-Forwarded-For is believed only when the direct peer is a trusted proxy,
otherwise anyone could pick their own key.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Iterable, Union

__all__ = ["client_key", "parse_networks"]

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
_NETWORK_TYPES = (ipaddress.IPv4Network, ipaddress.IPv6Network)


@functools.lru_cache(maxsize=1024)
def _parse_network(text: str) -> Network:
    # strict=False: "10.1.2.3/8" means 10.0.0.0/8, which is what an operator meant.
    return ipaddress.ip_network(text.strip(), strict=False)


def parse_networks(cidrs: Iterable[str | Network]) -> tuple[Network, ...]:
    """Parse CIDR strings (or pass networks through) once, for ``client_key``.

    A bare address is a /32 or /128. Raises ValueError naming the bad entry.
    """
    if isinstance(cidrs, (str, *_NETWORK_TYPES)):
        cidrs = (cidrs,)
    out = []
    for c in cidrs:
        if isinstance(c, _NETWORK_TYPES):
            out.append(c)
            continue
        try:
            out.append(_parse_network(c))
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"not an IP network: {c!r}") from None
    return tuple(out)


def _networks(trusted: Iterable[str | Network]) -> tuple[Network, ...]:
    # Hot path: callers pass the tuple parse_networks gave them; accept it as is.
    if type(trusted) is tuple and all(type(n) in _NETWORK_TYPES for n in trusted):
        return trusted
    if not trusted:
        return ()
    return parse_networks(trusted)


def _parse_hop(text: str) -> Address | None:
    """One address as found in a peer address or an X-Forwarded-For entry.

    Accepts ``v4``, ``v4:port``, ``v6``, ``[v6]``, ``[v6]:port``, with
    surrounding whitespace and an optional zone id. Anything else is None.
    """
    host = text.strip()
    if not host:
        return None
    if host[0] == "[":
        end = host.find("]")
        if end < 0:
            return None
        rest = host[end + 1 :]
        if rest and not (rest[0] == ":" and rest[1:].isdigit()):
            return None
        host = host[1:end]
    elif host.count(":") == 1:
        # v4:port (a bare IPv6 address has at least two colons).
        host, _, port = host.partition(":")
        if not port.isdigit():
            return None
    try:
        if ":" not in host:
            # Straight to the class: ip_address() would try IPv4 first anyway.
            return ipaddress.IPv4Address(host)
        # Zone ids ("fe80::1%eth0") name a local interface; they say nothing of who the client is.
        addr = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return None
    mapped = addr.ipv4_mapped
    # ::ffff:1.2.3.4 is an IPv4 client on a dual-stack socket.
    return addr if mapped is None else mapped


def _key_of(addr: Address, ipv6_prefix: int) -> str:
    if addr.version == 4:
        return str(addr)
    # Same text as str(IPv6Network((addr, prefix), strict=False)), without
    # building the network object (several times slower).
    host_bits = 128 - ipv6_prefix
    return f"{ipaddress.IPv6Address(int(addr) >> host_bits << host_bits)}/{ipv6_prefix}"


@functools.lru_cache(maxsize=8192)
def _resolve(text: str, ipv6_prefix: int) -> tuple[Address, str] | None:
    # The address (for trust checks) and its key, or None for junk. Cached:
    # the same addresses arrive over and over, and parsing is the slow part.
    # Bounded, so a flood of distinct addresses only costs cache misses.
    addr = _parse_hop(text)
    return None if addr is None else (addr, _key_of(addr, ipv6_prefix))


def _trusted(addr: Address, networks: tuple[Network, ...]) -> bool:
    for net in networks:
        if addr in net:  # False across IP versions, never an error
            return True
    return False


def client_key(
    remote_addr: str,
    forwarded_for: str | None,
    trusted_proxies: Iterable[str | Network],
    ipv6_prefix: int = 64,
) -> str:
    """The key to count a request by.

    - If the direct peer (``remote_addr``) is in ``trusted_proxies``, walk
      ``forwarded_for`` from the right and take the first hop that is not a
      trusted proxy; if every hop is trusted, the leftmost. A hop that does
      not parse stops the walk and the peer is used: junk is not believed.
    - Otherwise the peer, and the header is ignored (it is the client's to forge).
    - IPv4 is returned as is (``"203.0.113.7"``), IPv6 as its
      ``/ipv6_prefix`` network (``"2001:db8:1:2::/64"``), IPv4-mapped IPv6
      as IPv4. An unparseable ``remote_addr`` (a Unix socket path, "") is
      returned stripped.

    Pass ``trusted_proxies`` through :func:`parse_networks` once at start-up;
    strings work too but are parsed (with a cache) on every call.
    """
    if not 0 <= ipv6_prefix <= 128:
        raise ValueError(f"ipv6_prefix must be 0..128, got {ipv6_prefix!r}")
    peer = _resolve(remote_addr, ipv6_prefix) if remote_addr else None
    if peer is None:
        return (remote_addr or "").strip()
    if not forwarded_for or not trusted_proxies:
        return peer[1]
    networks = _networks(trusted_proxies)
    if not _trusted(peer[0], networks):
        return peer[1]

    leftmost = None
    for hop in reversed(forwarded_for.split(",")):
        if not hop.strip():
            # Empty list elements are allowed by HTTP's list syntax; skip them.
            continue
        resolved = _resolve(hop, ipv6_prefix)
        if resolved is None:
            return peer[1]
        if not _trusted(resolved[0], networks):
            return resolved[1]
        leftmost = resolved
    # Every hop was a trusted proxy (or there was none): the leftmost is the
    # nearest thing to a client we have.
    return (leftmost or peer)[1]
