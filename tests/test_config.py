import dataclasses
import os

import pytest

from homeserver.config import Config, ConfigError, load_config, parse_config
from tests.support.server import run_app, write_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_empty_config_takes_every_default():
    config = parse_config({}, "/srv/weir")
    assert config.server_name == "localhost:8008"
    assert config.server.http.main_pool_size == 1000
    assert config.server.http.media_fetch_max_per_client == 8
    assert config.federation.remote_timeout == 60
    assert config.security.federation.key_resolution_per_ip_rate.max_requests == 30
    assert config.security.federation.event_resolution_max_in_flight == 16
    assert config.security.federation.event_resolution_per_origin_rate.max_requests == 30
    assert config.security.federation.event_resolution_per_origin_rate.per_seconds == 60
    assert config.data_dir == "/srv/weir/data"
    assert config.database.url == "sqlite:////srv/weir/data/homeserver.db"
    assert "127.0.0.0/8" in config.federation.ip_range_denylist


def test_shipped_config_toml_is_valid_and_matches_defaults():
    shipped = load_config(os.path.join(REPO, "config.toml"))
    assert shipped == parse_config({}, REPO)


@pytest.mark.parametrize(
    "data, key, reason",
    [
        ({"server": {"http": {"port": "x"}}}, "server.http.port", "Not a valid integer."),
        ({"server": {"http": {"port": 70000}}}, "server.http.port", "less than or equal to 65535"),
        ({"nonsense": 1}, "nonsense", "Unknown field."),
        ({"federation": {"worker": {"shard": 2}}}, "federation.worker.shard", "Unknown field."),
        ({"registration": {"enabled": "yes"}}, "registration.enabled", "Not a valid boolean."),
        (
            {"server": {"http": {"trusted_proxies": ["nope"]}}},
            "server.http.trusted_proxies",
            "Not a valid CIDR",
        ),
        (
            {"security": {"federation": {"key_resolution_per_ip_rate": {"max_requests": 0}}}},
            "security.federation.key_resolution_per_ip_rate.max_requests",
            "greater than or equal to 1",
        ),
        ({"database": {"url": "mysql://x"}}, "database.url", "Expected sqlite"),
        (
            {"federation": {"dns_nameservers": ["127.0.0.1"]}},
            "federation.dns_nameservers",
            "host:port",
        ),
        # Values the server used to start with, and then failed on at the first request.
        ({"server_name": "my server"}, "server_name", "Not a server name"),
        ({"server_name": "example.org:99999"}, "server_name", "Not a server name"),
        ({"public_baseurl": "localhost:8008"}, "public_baseurl", "Not a valid URL"),
        (
            {"federation": {"dns_nameservers": ["127.0.0.1:99999"]}},
            "federation.dns_nameservers",
            "host:port",
        ),
        (
            {"federation": {"dns_nameservers": ["dns.example:53"]}},
            "federation.dns_nameservers",
            "host:port",
        ),
        (
            {"security": {"federation": {"trusted_key_servers": [{"server_name": "a b"}]}}},
            "security.federation.trusted_key_servers.0.server_name",
            "Not a server name",
        ),
        (
            {
                "security": {
                    "federation": {
                        "trusted_key_servers": [
                            {
                                "server_name": "matrix.org",
                                "verify_keys": {"ed25519:a": "not base64!"},
                            }
                        ]
                    }
                }
            },
            "security.federation.trusted_key_servers.0.verify_keys",
            "Not an ed25519 key",
        ),
        (
            {
                "security": {
                    "federation": {
                        "trusted_key_servers": [
                            {"server_name": "matrix.org", "verify_keys": {"a": "AAAA"}}
                        ]
                    }
                }
            },
            "security.federation.trusted_key_servers.0.verify_keys",
            "Not an ed25519 key",
        ),
        ({"instance_name": "a b"}, "instance_name", "Expected 1 to 64"),
        ({"instance_name": ""}, "instance_name", "Expected 1 to 64"),
        ({"cluster": {"instances": 0}}, "cluster.instances", ""),
        ({"cluster": {"instances": 2}}, "cluster.instances", "need PostgreSQL"),
    ],
)
def test_invalid_values_name_the_dotted_key(data, key, reason):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key == key
    assert reason in info.value.reason


def test_several_instances_on_postgresql_are_accepted():
    config = parse_config(
        {
            "instance_name": "worker-2",
            "cluster": {"instances": 3},
            "database": {"url": "postgresql://weir@db/weir"},
        }
    )
    assert (config.instance_name, config.cluster.instances) == ("worker-2", 3)


def test_weir_instance_name_in_the_environment_names_the_instance(tmp_path):
    """Several instances share one config file (deploy/docker-compose.yml), each started
    with its own WEIR_INSTANCE_NAME."""
    path = tmp_path / "weir.toml"
    path.write_text('instance_name = "from-file"\n')
    assert load_config(str(path), environ={}).instance_name == "from-file"
    named = load_config(str(path), environ={"WEIR_INSTANCE_NAME": "weir-2"})
    assert named.instance_name == "weir-2"
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environ={"WEIR_INSTANCE_NAME": "weir 2"})
    assert info.value.key == "instance_name"
    assert info.value.reason.endswith("(from WEIR_INSTANCE_NAME)"), info.value.reason


def test_config_is_frozen():
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server_name = "x"  # type: ignore[misc]


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    path = tmp_path / "conf" / "weir.toml"
    path.parent.mkdir()
    write_config(
        str(path),
        {
            "data_dir": "state",
            "database": {"url": "sqlite:///db/hs.db"},
            "federation": {"ca_file": "ca.pem"},
        },
    )
    config = load_config(str(path))
    assert config.data_dir == str(tmp_path / "conf" / "state")
    assert config.database.url == f"sqlite:///{tmp_path}/conf/db/hs.db"
    assert config.federation.ca_file == str(tmp_path / "conf" / "ca.pem")


def test_absolute_sqlite_path_is_kept(tmp_path):
    config = parse_config({"database": {"url": "sqlite:////var/lib/weir/hs.db"}}, str(tmp_path))
    assert config.database.url == "sqlite:////var/lib/weir/hs.db"


def test_invalid_config_exits_2_with_one_line_naming_the_key(tmp_path):
    (tmp_path / "bad.toml").write_text('[server.http]\nport = "eighty"\n')
    result = run_app(["--config", str(tmp_path / "bad.toml")], cwd=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["config: server.http.port: Not a valid integer."]


def test_invalid_server_name_exits_2_instead_of_starting(tmp_path):
    # A server_name that is not one would make every user ID invalid: refuse it at start.
    write_config(
        str(tmp_path / "bad.toml"),
        {"server_name": "my server", "server": {"http": {"port": 0}}, "federation": {"port": 0}},
    )
    result = run_app(["--config", str(tmp_path / "bad.toml")], cwd=str(tmp_path), timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "config: server_name: Not a server name: 'my server'."
    ]


def test_unparseable_toml_exits_2(tmp_path):
    (tmp_path / "bad.toml").write_text("server_name = \n")
    result = run_app(["--config", str(tmp_path / "bad.toml")], cwd=str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("config: ")
    assert "not valid TOML" in result.stderr


@pytest.mark.parametrize(
    "make",
    [
        lambda d: os.mkdir(d / "bad.toml"),  # a directory where the file should be
        lambda d: (d / "bad.toml").write_bytes(b'server_name = "\xff"\n'),  # not UTF-8
    ],
)
def test_a_config_that_cannot_be_read_exits_2_with_one_line(tmp_path, make):
    make(tmp_path)
    result = run_app(["--config", str(tmp_path / "bad.toml")], cwd=str(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config: {tmp_path / 'bad.toml'}: "), lines


def test_a_port_in_use_exits_1_with_one_line(tmp_path):
    # Another process holds the client port: an operator needs the reason, not a traceback.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write_config(
            str(tmp_path / "weir.toml"),
            {
                "server": {"http": {"bind_address": "127.0.0.1", "port": port}},
                "federation": {"port": 0},
            },
        )
        result = run_app(["--config", str(tmp_path / "weir.toml")], cwd=str(tmp_path), timeout=30)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "in use" in result.stderr
