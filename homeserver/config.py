"""config.toml -> frozen Config objects.

Each setting is declared once, as a dataclass field carrying its marshmallow field and its
default, so the schema, the default and the type cannot drift apart. Unknown keys, wrong
types and out-of-range values are errors that name the dotted key.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping

from marshmallow import RAISE, Schema, ValidationError, fields, post_load, validate
from unpaddedbase64 import decode_base64

from homeserver.core.identifiers import is_valid_server_name

# Overrides `instance_name` from the config file (load_config).
INSTANCE_NAME_ENV = "WEIR_INSTANCE_NAME"

DEFAULT_IP_RANGE_DENYLIST = (
    # IPv4: "this network", private, CGNAT, loopback, link-local, IETF, documentation,
    # benchmarking, multicast, reserved and broadcast.
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
    # IPv6: unspecified, loopback, IPv4-mapped, discard, documentation, unique local,
    # link-local, site-local, multicast, NAT64 and 6to4/Teredo transition ranges.
    "::/128",
    "::1/128",
    "::/96",  # IPv4-compatible IPv6 (deprecated): ::127.0.0.1 would reach loopback
    "::ffff:0:0/96",
    "100::/64",
    "2001:db8::/32",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
    "64:ff9b::/96",
    "2001::/32",
    "2002::/16",
)


class ConfigError(Exception):
    """An invalid config: `key` is the dotted path, `reason` what is wrong with it."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}" if key else reason)
        self.key = key
        self.reason = reason


def setting(mfield: fields.Field, default: Any) -> Any:
    """A dataclass field that is also a config key: its marshmallow field and default."""
    if isinstance(default, (list, dict)):
        raise TypeError("use a tuple or a frozen object as a default")
    return field(default=default, metadata={"mfield": mfield})


def section(cls: type) -> Any:
    """A nested config table, defaulting to all of its own defaults."""
    return field(default_factory=cls, metadata={"mfield": fields.Nested(schema_for(cls))})


_SCHEMAS: dict[type, type[Schema]] = {}


def schema_for(cls: type) -> type[Schema]:
    """Builds (once) the marshmallow schema that loads a table into `cls`."""
    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    attrs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        mfield = f.metadata["mfield"]
        mfield.load_default = (
            f.default_factory if f.default_factory is not dataclasses.MISSING else f.default
        )
        attrs[f.name] = mfield

    class Meta:
        unknown = RAISE

    def make(self, data, **kwargs):
        return cls(**data)

    attrs["Meta"] = Meta
    attrs["make"] = post_load(make)
    schema = type(f"{cls.__name__}Schema", (Schema,), attrs)
    _SCHEMAS[cls] = schema
    return schema


def _string_list(**kw) -> fields.Field:
    return _Tuple(fields.String(), **kw)


class _Tuple(fields.List):
    """A TOML array loaded as a tuple, so that the config stays immutable."""

    def _deserialize(self, value, attr, data, **kwargs):
        return tuple(super()._deserialize(value, attr, data, **kwargs))


def _int(minimum: int | None = None, maximum: int | None = None) -> fields.Integer:
    return fields.Integer(strict=True, validate=validate.Range(min=minimum, max=maximum))


class _StrictBool(fields.Boolean):
    """TOML has real booleans; "yes" or 1 is a mistake, not a truthy value."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


def _bool() -> fields.Boolean:
    return _StrictBool()


def _seconds(minimum: float = 0.001) -> fields.Float:
    return fields.Float(validate=validate.Range(min=minimum))


def _cidrs(value: tuple) -> None:
    for item in value:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ValidationError(f"Not a valid CIDR: {item!r}.") from None


def _server_name(value: str) -> None:
    if not is_valid_server_name(value):
        raise ValidationError(f"Not a server name: {value!r}.")


def _server_names(value: tuple) -> None:
    for item in value:
        _server_name(item)


def _host_ports(value: tuple) -> None:
    """DNS servers: an IP literal (IPv6 in brackets) and a port, as the resolver needs."""
    for item in value:
        host, sep, port = item.rpartition(":")
        try:
            ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
            valid = bool(sep) and port.isdigit() and 0 < int(port) < 65536
        except ValueError:
            valid = False
        if not valid:
            raise ValidationError(f"Expected host:port with an IP address, got {item!r}.")


def _ed25519_keys(value: dict) -> None:
    """A notary's keys, checked now rather than at the first key fetch that uses them."""
    for key_id, key in value.items():
        try:
            valid = key_id.startswith("ed25519:") and len(decode_base64(key)) == 32
        except ValueError:
            valid = False
        if not valid:
            raise ValidationError(f"Not an ed25519 key id and unpadded base64 key: {key_id!r}.")


@dataclass(frozen=True)
class RateConfig:
    max_requests: int = setting(_int(1), 30)
    per_seconds: float = setting(_seconds(), 60.0)


@dataclass(frozen=True)
class HttpConfig:
    bind_address: str = setting(fields.String(), "127.0.0.1")
    # 0 picks a free port; the ready line on stdout names the one in use.
    port: int = setting(_int(0, 65535), 8008)
    main_pool_size: int = setting(_int(2), 1000)
    keepalive_timeout: float = setting(_seconds(), 75.0)
    # Open connections per listener, idle, reading a head or parked in /sync included; they
    # wait outside the main pool, which counts only requests being worked on (http/server.py).
    max_connections: int = setting(_int(1), 10_000)
    # The whole request line and headers must arrive within this (a slow client is closed).
    request_head_timeout: float = setting(_seconds(), 10.0)
    # On SIGTERM, /health answers 503 and the server keeps serving this long before it
    # closes its listeners: a load balancer marks it down first (http/server.py).
    shutdown_drain_delay: float = setting(_seconds(0), 0.0)
    trusted_proxies: tuple = setting(_string_list(validate=_cidrs), ())
    media_fetch_threads: int = setting(_int(1), 16)
    media_fetch_max_in_flight: int = setting(_int(1), 64)
    media_fetch_max_per_client: int = setting(_int(1), 8)
    media_fetch_max_queued_per_client: int = setting(_int(0), 32)


@dataclass(frozen=True)
class ServerConfig:
    http: HttpConfig = section(HttpConfig)


@dataclass(frozen=True)
class WorkerConfig:
    shards: int = setting(_int(0, 64), 0)


@dataclass(frozen=True)
class SenderConfig:
    # Outbound transactions at once, in the sender's own pool (homeserver/federation/sender.py).
    max_in_flight: int = setting(_int(1, 10000), 64)
    # A destination that answered within this is live (the sender's lanes).
    live_window: float = setting(_seconds(), 300.0)
    # What an unproven destination's transaction has to answer in (never over remote_timeout).
    unproven_timeout: float = setting(_seconds(), 10.0)
    # A transaction is late past 10 times its destination's last answer time, and never
    # before this: while a live destination waits for a slot, a late one gives its slot up.
    late_after: float = setting(_seconds(), 0.5)
    # Durable EDUs (to-device messages, device list updates) owed to one server: past this,
    # new ones for it are dropped and counted (weir_federation_edus_dropped).
    max_queued_edus: int = setting(_int(100), 10_000)


@dataclass(frozen=True)
class JoinsConfig:
    # One deadline for the whole of a remote join (rooms/remote_membership.py): the one
    # outbound work allowed past remote_timeout, since a big room's answer takes minutes.
    deadline: float = setting(_seconds(), 300.0)
    # A send_join answer's size and its count of state and auth chain events: past these
    # the answer is refused rather than held and checked.
    max_bytes: int = setting(_int(1024 * 1024), 256 * 1024 * 1024)
    max_events: int = setting(_int(1000), 200_000)


@dataclass(frozen=True)
class FederationConfig:
    bind_address: str = setting(fields.String(), "127.0.0.1")
    port: int = setting(_int(0, 65535), 8448)
    tls_certificate: str = setting(fields.String(), "")
    tls_private_key: str = setting(fields.String(), "")
    remote_timeout: float = setting(_seconds(), 60.0)
    verify_tls: bool = setting(_bool(), True)
    ca_file: str = setting(fields.String(), "")
    dns_nameservers: tuple = setting(_string_list(validate=_host_ports), ())
    ip_range_denylist: tuple = setting(_string_list(validate=_cidrs), DEFAULT_IP_RANGE_DENYLIST)
    ip_range_allowlist: tuple = setting(_string_list(validate=_cidrs), ())
    worker: WorkerConfig = section(WorkerConfig)
    sender: SenderConfig = section(SenderConfig)
    joins: JoinsConfig = section(JoinsConfig)


@dataclass(frozen=True)
class DatabaseConfig:
    url: str = setting(
        fields.String(
            validate=validate.Regexp(
                r"^(sqlite:///|postgres(ql)?://)",
                error="Expected sqlite:///... or postgresql://...",
            )
        ),
        "sqlite:///data/homeserver.db",
    )


@dataclass(frozen=True)
class MediaConfig:
    max_upload_size: int = setting(_int(1), 52428800)
    max_image_pixels: int = setting(_int(1), 32000000)
    # The spec's freeze of unauthenticated media (Synapse's enable_authenticated_media): media
    # stored while this is true is marked authenticated, and the legacy endpoints refuse it.
    enable_authenticated_media: bool = setting(_bool(), True)
    max_pending_uploads: int = setting(_int(1), 5)
    unused_expiration_time: float = setting(_seconds(), 86400.0)
    thumbnail_threads: int = setting(_int(1, 64), 2)


@dataclass(frozen=True)
class MediaSecurityConfig:
    remote_fetch_enabled: bool = setting(_bool(), True)
    # A name without a port blocks that host on every port.
    blocked_servers: tuple = setting(_string_list(validate=_server_names), ())


@dataclass(frozen=True)
class TrustedKeyServer:
    server_name: str = setting(fields.String(validate=_server_name), "")
    # {key_id: base64 key}; empty = trust whatever the notary's own key document says.
    verify_keys: dict = setting(
        fields.Dict(keys=fields.String(), values=fields.String(), validate=_ed25519_keys), None
    )


@dataclass(frozen=True)
class FederationSecurityConfig:
    key_resolution_max_in_flight: int = setting(_int(1), 16)
    key_resolution_per_ip_rate: RateConfig = section(RateConfig)
    # Calls to other servers caused by an inbound PDU (rooms/gaps.py): missing events,
    # state, auth events.
    event_resolution_max_in_flight: int = setting(_int(1), 16)
    event_resolution_per_origin_rate: RateConfig = section(RateConfig)
    # Inbound transactions answered before they were applied (rooms/staging.py), per origin:
    # past either, the origin's next transaction is refused with 429.
    staged_per_origin_max_pdus: int = setting(_int(50), 1000)
    staged_per_origin_max_bytes: int = setting(_int(1024 * 1024), 16 * 1024 * 1024)
    # And every origin's together: a server under many names has each name's caps.
    staged_max_bytes: int = setting(_int(1024 * 1024), 256 * 1024 * 1024)
    # A received PDU whose missing events its origin could not give is held and retried
    # (rooms/held.py). First retry after 30 s: a restarting server is back by then, and a
    # blip costs a user half a minute; doubling to an hour. Dropped after a day: past that
    # Synapse's catch-up sends the room's latest event, whose gap is filled then.
    held_pdu_first_retry: float = setting(_seconds(), 30.0)
    held_pdu_max_age: float = setting(_seconds(), 86400.0)
    trusted_key_servers: tuple = setting(_Tuple(fields.Nested(schema_for(TrustedKeyServer))), ())


@dataclass(frozen=True)
class SecurityConfig:
    media: MediaSecurityConfig = section(MediaSecurityConfig)
    federation: FederationSecurityConfig = section(FederationSecurityConfig)


@dataclass(frozen=True)
class RegistrationConfig:
    enabled: bool = setting(_bool(), False)
    shared_secret: str = setting(fields.String(), "")
    # Registration's flow starts with m.login.registration_token (accounts/registration_tokens.py).
    requires_token: bool = setting(_bool(), False)


@dataclass(frozen=True)
class RateLimitingConfig:
    # Per client key (docs/architecture.md, "Budgets"); a refusal is 429 M_LIMIT_EXCEEDED
    # with retry_after_ms.
    login: RateConfig = section(RateConfig)
    registration: RateConfig = section(RateConfig)
    media_create: RateConfig = section(RateConfig)
    # Remote media requests that miss the cache and so may make us fetch from another server.
    # Generous: one room's first view asks for every image and thumbnail on screen at once.
    remote_media: RateConfig = setting(
        fields.Nested(schema_for(RateConfig)), RateConfig(max_requests=300, per_seconds=60.0)
    )
    # User directory searches, per user, not per client key: a client searches as its user
    # types, and each search reads the whole directory table.
    user_directory: RateConfig = setting(
        fields.Nested(schema_for(RateConfig)), RateConfig(max_requests=100, per_seconds=60.0)
    )


def _globs(value: tuple) -> None:
    for item in value:
        if not item.strip():
            raise ValidationError("Expected a glob pattern, got an empty string.")


@dataclass(frozen=True)
class UrlPreviewConfig:
    # Link previews (GET .../preview_url, media/preview.py): off by default, as in Synapse,
    # since they make the server fetch any URL a user names.
    enabled: bool = setting(_bool(), False)
    # Glob patterns matched against a URL's host and against the whole URL: refused (403).
    url_blacklist: tuple = setting(_string_list(validate=_globs), ())
    # The most of a page read; an HTML page cut there is parsed as read.
    max_spider_size: int = setting(_int(1024), 10 * 1024 * 1024)
    # One deadline for a preview: DNS, connects, redirects, the body and its og:image.
    deadline: float = setting(_seconds(), 10.0)
    # Addresses a preview may not connect to (every resolved address and every redirect);
    # the allowlist wins, as for federation.
    ip_range_denylist: tuple = setting(_string_list(validate=_cidrs), DEFAULT_IP_RANGE_DENYLIST)
    ip_range_allowlist: tuple = setting(_string_list(validate=_cidrs), ())


@dataclass(frozen=True)
class PushConfig:
    # Notifies to push gateways at once, in the push sender's own pool (sync/push_sender.py).
    max_in_flight: int = setting(_int(1, 10000), 16)
    # One deadline for a notify: DNS, the connect and the gateway's answer.
    deadline: float = setting(_seconds(), 10.0)
    # Addresses a gateway may not be reached at; the allowlist wins, as for federation.
    ip_range_denylist: tuple = setting(_string_list(validate=_cidrs), DEFAULT_IP_RANGE_DENYLIST)
    ip_range_allowlist: tuple = setting(_string_list(validate=_cidrs), ())


@dataclass(frozen=True)
class LoggingConfig:
    level: str = setting(
        fields.String(validate=validate.OneOf(["DEBUG", "INFO", "WARNING", "ERROR"])), "INFO"
    )
    format: str = setting(fields.String(validate=validate.OneOf(["text", "json"])), "text")


@dataclass(frozen=True)
class PresenceConfig:
    # Whether users' presence is tracked, shown in /sync and exchanged with other servers.
    enabled: bool = setting(_bool(), True)


@dataclass(frozen=True)
class VoipConfig:
    # TURN servers handed to clients by /voip/turnServer (accounts/turn.py); none: `{}`.
    turn_uris: tuple = setting(_string_list(), ())
    # Time-limited credentials (coturn's use-auth-secret); wins over the static pair.
    turn_shared_secret: str = setting(fields.String(), "")
    turn_username: str = setting(fields.String(), "")
    turn_password: str = setting(fields.String(), "")
    turn_user_lifetime: int = setting(_int(1), 86400)  # seconds


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = setting(_bool(), True)
    # Matched against the client's address (after trusted_proxies), not the direct peer, so
    # a load balancer in front does not open /metrics to everyone behind it.
    allowed_networks: tuple = setting(_string_list(validate=_cidrs), ("127.0.0.0/8", "::1/128"))


@dataclass(frozen=True)
class UserDirectoryConfig:
    # Also find every local user, not only those sharing a room with the searcher or in a
    # public room (Synapse's user_directory.search_all_users).
    search_all_users: bool = setting(_bool(), False)


@dataclass(frozen=True)
class SlidingSyncConfig:
    # Connections of the simplified sliding sync (sync/sliding.py) kept in memory, most
    # recently used first; the rest are read back from the database when next used, their
    # room lists read whole. As many as the server's connections: each parked one is in use.
    cached_connections: int = setting(_int(1), 10000)
    # A connection unused this long is forgotten: its next request gets M_UNKNOWN_POS.
    connection_lifetime: float = setting(_seconds(), 7 * 86400.0)
    # Connections one device may keep (one per conn_id); a new one ends its oldest past it.
    connections_per_device: int = setting(_int(1), 10)


@dataclass(frozen=True)
class AppserviceConfig:
    # Transactions to application services at once, in a pool of their own; one per
    # appservice at most (homeserver/appservice/sender.py).
    max_in_flight: int = setting(_int(1, 1000), 16)
    # One total deadline for a call to an appservice: a transaction, a ping, a user or
    # alias query.
    deadline: float = setting(_seconds(), 30.0)


@dataclass(frozen=True)
class ClusterConfig:
    # Instances serving one server on one PostgreSQL database (docs/operations.md,
    # "Several instances"); more than 1 turns on their wake-ups through LISTEN/NOTIFY.
    instances: int = setting(_int(1, 64), 1)
    # How long an instance's lease on an outbound queue (a federation destination, an
    # appservice, a pusher) lasts unless renewed: a dead instance's queues are taken over
    # within it, or within one call's deadline + 2 s where that is longer.
    queue_lease: float = setting(_seconds(), 30.0)


@dataclass(frozen=True)
class Config:
    server_name: str = setting(fields.String(validate=_server_name), "localhost:8008")
    # What clients are told to use (.well-known/matrix/client): an absolute http(s) URL.
    public_baseurl: str = setting(
        fields.Url(schemes={"http", "https"}, require_tld=False), "http://localhost:8008/"
    )
    data_dir: str = setting(fields.String(), "data")
    # This instance's name, unique among the instances on one database.
    instance_name: str = setting(
        fields.String(
            validate=validate.Regexp(
                r"^[A-Za-z0-9._-]{1,64}$", error="Expected 1 to 64 of A-Z a-z 0-9 . _ -"
            )
        ),
        "main",
    )
    cluster: ClusterConfig = section(ClusterConfig)
    server: ServerConfig = section(ServerConfig)
    federation: FederationConfig = section(FederationConfig)
    database: DatabaseConfig = section(DatabaseConfig)
    media: MediaConfig = section(MediaConfig)
    security: SecurityConfig = section(SecurityConfig)
    registration: RegistrationConfig = section(RegistrationConfig)
    ratelimiting: RateLimitingConfig = section(RateLimitingConfig)
    logging: LoggingConfig = section(LoggingConfig)
    metrics: MetricsConfig = section(MetricsConfig)
    presence: PresenceConfig = section(PresenceConfig)
    url_preview: UrlPreviewConfig = section(UrlPreviewConfig)
    push: PushConfig = section(PushConfig)
    voip: VoipConfig = section(VoipConfig)
    user_directory: UserDirectoryConfig = section(UserDirectoryConfig)
    sliding_sync: SlidingSyncConfig = section(SlidingSyncConfig)
    # Application services' registration files (YAML, as Synapse's); checked at start.
    app_service_config_files: tuple = setting(_string_list(), ())
    appservice: AppserviceConfig = section(AppserviceConfig)


def _first_error(messages: Any, prefix: str = "") -> tuple[str, str]:
    """The first (dotted key, reason) in marshmallow's nested error dict."""
    if isinstance(messages, dict):
        for key in sorted(messages, key=str):
            sub = f"{prefix}.{key}" if prefix else str(key)
            return _first_error(messages[key], sub)
    if isinstance(messages, list) and messages:
        return _first_error(messages[0], prefix)
    return prefix, str(messages)


def _resolve_paths(config: Config, base: str) -> Config:
    """Relative paths in the config are relative to the config file's folder."""

    def resolve(path: str) -> str:
        return (
            path if not path or os.path.isabs(path) else os.path.normpath(os.path.join(base, path))
        )

    url = config.database.url
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        url = "sqlite:///" + resolve(url[len("sqlite:///") :])
    federation = dataclasses.replace(
        config.federation,
        tls_certificate=resolve(config.federation.tls_certificate),
        tls_private_key=resolve(config.federation.tls_private_key),
        ca_file=resolve(config.federation.ca_file),
    )
    return dataclasses.replace(
        config,
        data_dir=resolve(config.data_dir),
        app_service_config_files=tuple(resolve(p) for p in config.app_service_config_files),
        database=DatabaseConfig(url=url),
        federation=federation,
    )


def parse_config(data: dict, base_dir: str = ".") -> Config:
    try:
        config = schema_for(Config)().load(data)
    except ValidationError as e:
        raise ConfigError(*_first_error(e.messages)) from None
    if bool(config.federation.tls_certificate) != bool(config.federation.tls_private_key):
        raise ConfigError(
            "federation.tls_private_key",
            "tls_certificate and tls_private_key must be set together.",
        )
    if config.cluster.instances > 1 and sqlite_path(config.database.url) is not None:
        raise ConfigError(
            "cluster.instances",
            "several instances need PostgreSQL: SQLite is served by one process.",
        )
    return _resolve_paths(config, os.path.abspath(base_dir))


def load_config(path: str, environ: Mapping[str, str] | None = None) -> Config:
    """`path`'s config, with `instance_name` taken from `WEIR_INSTANCE_NAME` in the
    environment when that is set: several instances may share one config file, each
    started with its own name (deploy/docker-compose.yml)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("", f"{path}: no such file") from None
    except OSError as e:  # a directory, no permission: still a config error, in one line
        raise ConfigError("", f"{path}: cannot be read: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:  # TOML is UTF-8 only
        raise ConfigError("", f"{path}: not valid TOML: {e}") from None
    name = (os.environ if environ is None else environ).get(INSTANCE_NAME_ENV)
    if name is not None:
        data["instance_name"] = name
    try:
        return parse_config(data, os.path.dirname(os.path.abspath(path)))
    except ConfigError as e:
        if name is None or e.key != "instance_name":
            raise
        raise ConfigError(e.key, f"{e.reason} (from {INSTANCE_NAME_ENV})") from None


def sqlite_path(url: str) -> str | None:
    """The file of a sqlite:/// URL, or None for another engine."""
    return url[len("sqlite:///") :] if url.startswith("sqlite:///") else None
