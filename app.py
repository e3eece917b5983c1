from gevent import monkey

monkey.patch_all()  # first: every later import must see cooperative sockets and locks

# Weir's entry point.
#   python app.py [--config config.toml]                 production: gevent servers and pools
#   python app.py register-user NAME [--password P] [--admin] [--config PATH]
#   python app.py federation-shard ...                   a worker shard (main starts these)
#   flask --app app run                                  development: one app, inline mode

import argparse
import getpass
import logging
import os
import sys

import gevent

from homeserver.config import ConfigError, load_config
from homeserver.core.errors import MatrixError
from homeserver.logs import configure_logging

log = logging.getLogger("weir")

# Every open connection, a waiting /sync included, is a greenlet; recording each one's
# spawning stack costs about a dozen objects per greenlet that the garbage collector walks.
gevent.config.track_greenlet_tree = False

DEFAULT_CONFIG = os.environ.get("WEIR_CONFIG", "config.toml")


def _load_config_or_exit(path: str):
    from homeserver.appservice.registration import load_registrations

    try:
        config = load_config(path)
        # Registration files are config too: a bad one stops the server before it serves.
        load_registrations(config.app_service_config_files, config.server_name)
        return config
    except ConfigError as e:
        print(f"config: {e}", file=sys.stderr)
        sys.exit(2)


def create_app(config_path: str | None = None):
    """The development app: both APIs on one port, no pools (inline mode)."""
    from homeserver.api.app import create_flask_app
    from homeserver.runtime import HomeserverRuntime

    config = _load_config_or_exit(config_path or DEFAULT_CONFIG)
    configure_logging(config.logging)
    return create_flask_app(HomeserverRuntime(config, pools=False))


def serve(config_path: str) -> int:
    from homeserver.processes.main import serve as serve_main

    config = _load_config_or_exit(config_path)
    configure_logging(config.logging)
    return serve_main(config, config_path)


def federation_shard(args) -> int:
    from homeserver.processes.shard import run_shard

    config = _load_config_or_exit(args.config)
    configure_logging(config.logging, process=f"shard {args.index}")
    return run_shard(config, args.index, args.listen_fd, args.parent_pid)


def register_user(args) -> int:
    from homeserver.runtime import HomeserverRuntime

    config = _load_config_or_exit(args.config)
    configure_logging(config.logging)
    password = args.password
    if password is None:
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Confirm password: "):
            print("passwords do not match", file=sys.stderr)
            return 1
    if not password:
        print("a password is required", file=sys.stderr)
        return 1
    runtime = HomeserverRuntime(config, pools=False)
    try:
        result = runtime.accounts.register(
            args.name.lower(), password, admin=args.admin, inhibit_login=True
        )
    except MatrixError as e:
        print(f"register-user: {e.errcode}: {e.error}", file=sys.stderr)
        return 1
    finally:
        runtime.close()
    print(f"registered {result.user_id}{' (admin)' if args.admin else ''}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="app.py", description="Weir Matrix homeserver")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="path to config.toml")
    sub = parser.add_subparsers(dest="command")
    reg = sub.add_parser("register-user", help="create an account")
    reg.add_argument("name", help="localpart of the new user")
    reg.add_argument("--password", help="the password (asked for when absent)")
    reg.add_argument("--admin", action="store_true", help="make the user a server admin")
    reg.add_argument("--config", default=argparse.SUPPRESS, help="path to config.toml")
    shard = sub.add_parser(
        "federation-shard", help="(internal) a federation worker shard, started by the server"
    )
    shard.add_argument("--index", type=int, required=True)
    shard.add_argument("--listen-fd", type=int, required=True)
    shard.add_argument("--parent-pid", type=int, required=True)
    shard.add_argument("--config", default=argparse.SUPPRESS, help="path to config.toml")
    args = parser.parse_args(argv)
    if args.command == "register-user":
        return register_user(args)
    if args.command == "federation-shard":
        return federation_shard(args)
    return serve(args.config)


if __name__ == "__main__":
    sys.exit(main())
