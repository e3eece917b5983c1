"""Federation: how this server talks to others, and checks who talks to it.

- ``client.FederationClient``: the one outbound client (``runtime.federation_client``).
- ``discovery``: spec server discovery (``ServerDiscovery``, ``DnsResolver``).
- ``transport``: pinned-IP urllib3 pools, ``TargetHealth`` outcome hook, streamed bodies.
- ``ip_filter.IpFilter``: the outbound denylist/allowlist.
- ``signing``: X-Matrix headers and request signatures.
- ``keyring.Keyring``: other servers' keys, under the key-resolution budget.
- ``errors``: the outbound error taxonomy and ``to_client_error`` (DESIGN.md §4).
- ``signing_key``: this server's own key and key document.
- ``pdus``: the checks on received PDUs (format, signatures, content hash).
- ``transactions``: inbound ``/send`` transactions, in main and in a worker shard.
- ``shards``: the federation worker shard processes and their supervision.
- ``ipc``: the frames between main and the shards.

Inbound authentication is ``homeserver.http.federation_auth.requires_server_auth``.
"""
