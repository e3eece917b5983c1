"""Which addresses outbound federation may connect to (SSRF protection).

Checked on every resolved address right before connecting, and on IP literals too, so that
neither a server name, an SRV record, a well-known delegation, a redirect nor a DNS answer
that changes between look-ups (rebinding) can make us connect to a denied address.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable

from budget import parse_networks


class IpFilter:
    """``allows(ip)``: not in ``denylist``, unless in ``allowlist`` (the allowlist wins)."""

    def __init__(self, denylist: Iterable[str], allowlist: Iterable[str] = ()):
        self.denylist = parse_networks(tuple(denylist))
        self.allowlist = parse_networks(tuple(allowlist))

    def allows(self, ip: str) -> bool:
        try:
            addr = ipaddress.ip_address(ip.partition("%")[0])
        except ValueError:
            return False  # not an address at all: never connect to it
        if addr.version == 6 and addr.ipv4_mapped is not None:
            # ::ffff:127.0.0.1 reaches 127.0.0.1: judge it as what it reaches.
            addr = addr.ipv4_mapped
        if any(addr in net for net in self.allowlist):
            return True
        return not any(addr in net for net in self.denylist)

    def __repr__(self) -> str:
        return f"<IpFilter deny={len(self.denylist)} allow={len(self.allowlist)}>"
