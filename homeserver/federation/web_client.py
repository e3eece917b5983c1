"""Plain http(s) requests to any URL a user names: link previews' pages
(media/web_fetch.py) and push gateways (sync/push_gateway.py). Every rule of the federation
transport (federation/transport.py) holds here too, without its discovery or signing:

- the host is resolved here (an IP literal, or A/AAAA through `DnsResolver`) and every
  address is filtered (`IpFilter`) before a connection; the connection goes to that IP
  itself (`connect_pinned`), so a DNS answer naming a denied address reaches nothing;
- TLS is verified against the URL's host;
- redirects are never followed here: a caller that follows them checks each hop like the
  first;
- everything runs inside the caller's one `OutboundDeadline`.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from budget import OutboundDeadline
from homeserver.federation.discovery import DnsResolver, ip_literal
from homeserver.federation.errors import DestinationUnreachable, MalformedResponse
from homeserver.federation.ip_filter import IpFilter
from homeserver.federation.transport import CONNECT_TIMEOUT_CAP, USER_AGENT, connect_pinned


class _PinnedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return connect_pinned(self)


class _PinnedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return connect_pinned(self)


class _PinnedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class WebClient:
    def __init__(
        self,
        dns: DnsResolver,
        ip_filter: IpFilter,
        ssl_context: ssl.SSLContext,
        *,
        verify_tls: bool = True,
    ):
        self._dns = dns
        self.ip_filter = ip_filter
        self._ssl_context = ssl_context
        self._verify_tls = verify_tls

    def request(
        self,
        method: str,
        url: str,
        deadline: OutboundDeadline,
        headers: dict[str, str],
        body: bytes | None = None,
    ):
        """The response head from the first allowed address that connects, and the pool to
        close once its body is done with (the caller reads and closes). Call it inside
        `with deadline:`. Raises `DestinationUnreachable` or `MalformedResponse`."""
        parts = urlsplit(url)
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise MalformedResponse(host or url[:100], "not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        headers = {
            "Host": parts.netloc.rpartition("@")[2],
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",
            **headers,
        }
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        reason = "no address"
        for ip in self.targets(host, deadline):
            pool = self._pool(parts.scheme, ip, port, host)
            timeout = urllib3.Timeout(
                connect=deadline.step_timeout(CONNECT_TIMEOUT_CAP), read=deadline.step_timeout()
            )
            try:
                response = pool.urlopen(
                    method,
                    target,
                    body=body,
                    headers=headers,
                    retries=False,
                    redirect=False,
                    timeout=timeout,
                    preload_content=False,
                    release_conn=False,
                    assert_same_host=False,
                )
            except (NewConnectionError, ConnectTimeoutError, SSLError) as e:
                pool.close()
                reason = f"cannot connect to {ip}:{port}: {e}"
                continue  # nothing was sent: the next address may do
            except ReadTimeoutError:
                pool.close()
                deadline.check(0.05)
                raise DestinationUnreachable(host, f"{ip}:{port} did not answer") from None
            except (ProtocolError, HTTPError, OSError) as e:
                pool.close()
                raise DestinationUnreachable(host, f"{ip}:{port} failed: {e}") from None
            except BaseException:
                pool.close()
                raise
            return response, pool
        raise DestinationUnreachable(host, reason)

    def targets(self, host: str, deadline: OutboundDeadline) -> list[str]:
        """The host's addresses the filter allows; unreachable when there are none."""
        literal = ip_literal(host)
        addresses = [literal] if literal is not None else self._dns.addresses(host, deadline)[0]
        if not addresses:
            raise DestinationUnreachable(host, "no address")
        allowed = [a for a in addresses if self.ip_filter.allows(a)]
        if not allowed:
            raise DestinationUnreachable(host, f"denied address {', '.join(addresses)}")
        return allowed

    def _pool(self, scheme: str, ip: str, port: int, host: str) -> urllib3.HTTPConnectionPool:
        # A pool per request, closed after it: the hosts are ever new, and a kept
        # connection would outlive the caller's deadline.
        if scheme == "http":
            return _PinnedHTTPPool(ip, port, maxsize=1, retries=False)
        return _PinnedHTTPSPool(
            ip,
            port,
            maxsize=1,
            retries=False,
            ssl_context=self._ssl_context,
            server_hostname=host,
            assert_hostname=host if self._verify_tls else False,
            cert_reqs=ssl.CERT_REQUIRED if self._verify_tls else ssl.CERT_NONE,
        )
