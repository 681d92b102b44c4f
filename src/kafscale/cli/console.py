"""`kafscale console`: serve the web console (kafscale/console/) for one cluster."""

from __future__ import annotations

import getpass
import logging
import os
import sys

from kafscale.cli.common import note, run_command
from kafscale.client import CliError, add_connection_options, client_settings

log = logging.getLogger("kafscale.console")


def hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise CliError(f"--listen must be HOST:PORT, not {value!r}", 2)
    return host.strip("[]") or "127.0.0.1", int(port)


def _add_user(args) -> int:
    from kafscale.console.auth import add_user

    if not args.auth:
        raise CliError("--add-user needs --auth USERS_FILE (the file the user is written to)", 2)
    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.add_user}: ")
        if password != getpass.getpass("again: "):
            raise CliError("the passwords differ", 2)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CliError("an empty password is not allowed", 2)
    try:
        add_user(args.auth, args.add_user, password)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    note(f"user {args.add_user} written to {args.auth}")
    return 0


def _ssl_context(args):
    if not args.tls_cert:
        return None
    import ssl

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.tls_cert, args.tls_key or None)
    return ctx


def console(args) -> int:
    from aiohttp import web

    from kafscale.console.auth import load_users
    from kafscale.console.web import make_app
    from kafscale.ops import logging_setup

    if args.add_user:
        return _add_user(args)
    logging_setup.setup(args.log_level, "text")
    if args.log_level != "debug":
        logging.getLogger("kafka").setLevel(logging.WARNING)  # kafka-python (quotas, transactions): a line per connection
    host, port = hostport(args.listen)
    users = None
    if args.auth:
        try:
            users = load_users(args.auth)
        except (OSError, ValueError) as e:
            raise CliError(f"cannot read --auth {args.auth}: {e}", 2) from None
        if not users:
            raise CliError(f"{args.auth} has no users: add one with --add-user NAME", 2)
    registry = None
    if args.schema_registry:
        from kafscale.registry.client import RegistryClient

        registry = RegistryClient(args.schema_registry, args.schema_registry_user, timeout=args.timeout)
    app = make_app(cluster(args), metrics_reader(args), users, read_only=args.read_only, registry=registry)
    ssl_context = _ssl_context(args)
    scheme = "https" if ssl_context else "http"
    banner = (f"KafScale console on {scheme}://{host}:{port} for {args.bootstrap}"
              + (" (read-only)" if args.read_only else "") + ("" if users else " (no login: --auth not given)"))

    def started(_text: str) -> None:
        print(banner, flush=True)  # tests and supervisors wait for this line

    web.run_app(app, host=host, port=port, ssl_context=ssl_context, print=started, access_log=None, handle_signals=True, shutdown_timeout=2)
    return 0


def add_metrics_options(p, interval: bool = True) -> None:
    """Where the brokers' /metrics are (kafscale/console/metrics.py says how they are found);
    `interval`: and how often to scrape them (not for one-shot commands)."""
    m = p.add_argument_group("broker metrics")
    m.add_argument("--metrics", action="append", default=[], metavar="URL[,URL]",
                   help="ops endpoints of the brokers, e.g. http://broker-0:9093 (repeatable); default: each broker's Kafka host at its Kafka port + --metrics-port-offset")
    m.add_argument("--metrics-port-offset", type=int, default=1,
                   help="ops port = Kafka port + this, when --metrics is not given (default 1: 9092 -> 9093; -1: read no metrics)")
    if interval:
        m.add_argument("--metrics-interval", type=float, default=5.0, help="seconds between scrapes of every broker's /metrics (default 5)")
    m.add_argument("--metrics-basic-auth", metavar="USER:PASSWORD", default=os.environ.get("KAFSCALE_METRICS_BASIC_AUTH", ""),
                   help="credentials for brokers started with --http-basic-auth (prefer the env KAFSCALE_METRICS_BASIC_AUTH)")


def metrics_reader(args):
    from kafscale.console.metrics import MetricsReader

    urls = [u for u in ",".join(args.metrics).split(",") if u.strip()]
    return MetricsReader(urls, None if args.metrics_port_offset < 0 else args.metrics_port_offset,
                         getattr(args, "metrics_interval", 5.0), args.metrics_basic_auth)


def cluster(args):
    from kafscale.console.cluster import Cluster

    return Cluster(args.bootstrap, client_settings(args.command_config, args.client_setting), args.timeout)


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("console", help="web console for a cluster (topics, groups, lag, records, ACLs, live charts)",
                              description="Serve a web console that talks to the cluster as a Kafka client and reads the brokers' /metrics.")
    add_connection_options(p.add_argument_group("connection"))
    w = p.add_argument_group("console")
    w.add_argument("--listen", default=os.environ.get("KAFSCALE_CONSOLE_LISTEN", "127.0.0.1:8080"),
                   help="HOST:PORT the console serves on (env KAFSCALE_CONSOLE_LISTEN, default 127.0.0.1:8080)")
    w.add_argument("--read-only", action="store_true", default=os.environ.get("KAFSCALE_CONSOLE_READ_ONLY", "") in ("1", "true"),
                   help="show everything, change nothing (env KAFSCALE_CONSOLE_READ_ONLY=1)")
    w.add_argument("--auth", metavar="USERS_FILE", default=os.environ.get("KAFSCALE_CONSOLE_AUTH"),
                   help="require a login: file of NAME:scrypt$... lines (env KAFSCALE_CONSOLE_AUTH; default: no login, for local use)")
    w.add_argument("--add-user", metavar="NAME", help="write NAME with a password read from the terminal (or stdin) into --auth USERS_FILE, then exit")
    w.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (chain); session cookies are then Secure")
    w.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert (if not in the same file)")
    w.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level (default info)")
    w.add_argument("--schema-registry", metavar="URL", default=os.environ.get("KAFSCALE_CONSOLE_SCHEMA_REGISTRY"),
                   help="the schema registry (kafscale broker --schema-registry) whose subjects and versions the console shows (env KAFSCALE_CONSOLE_SCHEMA_REGISTRY)")
    w.add_argument("--schema-registry-user", metavar="USER:PASSWORD", default=os.environ.get("KAFSCALE_CONSOLE_SCHEMA_REGISTRY_USER_INFO"),
                   help="HTTP basic auth for --schema-registry (prefer the env KAFSCALE_CONSOLE_SCHEMA_REGISTRY_USER_INFO)")
    add_metrics_options(p)
    p.set_defaults(func=run_command(console))
