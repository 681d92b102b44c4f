"""What every admin command of the `kafscale` CLI shares: connecting (a confluent-kafka
admin client, with the client settings of --command-config and -X), waiting for answers,
turning Kafka errors into exit codes, tables/JSON/progress output, and the connection and
output options every command takes.

Exit codes: 0 done, 1 the operation failed (unknown topic, group not empty, invalid config,
...), 2 no broker could be reached.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import sys
import time
from datetime import datetime, timezone

from tabulate import tabulate


EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 2
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CONNECT_TIMEOUT_S = 3.0


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


# -- output ------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], out=None) -> None:
    """Aligned columns; integer columns right-aligned. Writes only headers for no rows."""
    out = out or sys.stdout
    numeric = [bool(rows) and all(isinstance(r[i], int) and not isinstance(r[i], bool) or r[i] is None for r in rows) for i in range(len(headers))]
    # The header goes in as the first row: tabulate pads a header line by two more spaces.
    text = tabulate(
        [headers, *rows], tablefmt="plain", missingval="", disable_numparse=True,
        colalign=tuple("right" if num else "left" for num in numeric),
    )
    for line in text.splitlines():
        print(line.rstrip(), file=out)


def print_json(doc) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False))


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Progress:
    """Progress on stderr for long operations: rewritten in place on a terminal, a line
    every few seconds otherwise (logs), nothing with --quiet."""

    def __init__(self, args, what: str):
        self.what = what
        self.enabled = not getattr(args, "quiet", False)
        self.tty = sys.stderr.isatty()
        self.every = 0.5 if self.tty else 5.0
        self.started = self.last = time.monotonic()
        self.shown = False

    def update(self, done: int, total: int | None = None) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every or now - self.started < 1.0:
            return
        self.last = now
        text = f"{self.what}: {done}" + (f"/{total}" if total else "") + f" ({now - self.started:.0f}s)"
        if self.tty:
            sys.stderr.write("\r" + text + "\x1b[K")
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


# -- connecting --------------------------------------------------------------------------


def check_reachable(bootstrap: str, timeout: float) -> None:
    """Fail fast (exit 2) when no bootstrap address accepts a TCP connection: the Kafka
    client would otherwise retry silently until the operation times out."""
    errors = []
    for addr in [a.strip() for a in bootstrap.split(",") if a.strip()]:
        host, _, port = addr.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as e:
            errors.append(f"{addr}: {getattr(e, 'strerror', None) or e}")
    raise CliError(f"cannot reach any broker at {bootstrap} ({'; '.join(errors) or 'no address given'})", EXIT_UNREACHABLE)


def client_conf(args, **extra) -> dict:
    conf = {
        "bootstrap.servers": args.bootstrap,
        "client.id": "kafscale-cli",
        "socket.connection.setup.timeout.ms": int(CONNECT_TIMEOUT_S * 1000),
    }
    if not args.verbose:
        conf["log_level"] = 0  # we report failures ourselves, once, in plain words
    conf.update(client_settings(getattr(args, "command_config", None), getattr(args, "client_setting", None) or []))
    conf.update(extra)
    return conf


def client_settings(path: str | None, pairs: list[str]) -> dict[str, str]:
    """Client security (and other librdkafka) settings: Kafka's `--command-config` file of
    key=value lines ('#' comments), then each `-X key=value`, as kcat takes them."""
    out: dict[str, str] = {}
    lines = []
    if path:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith(("#", "!"))]
    for item in [*lines, *pairs]:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"client setting {item!r} is not key=value", 2)
        out[key.strip()] = value.strip()
    return out


def admin_client(args):
    from confluent_kafka.admin import AdminClient

    check_reachable(args.bootstrap, min(CONNECT_TIMEOUT_S, args.timeout))
    return AdminClient(client_conf(args))


UNREACHABLE = {"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "_DESTROY", "REQUEST_TIMED_OUT", "_WAIT_COORD", "COORDINATOR_NOT_AVAILABLE"}


def kafka_error(e: Exception, what: str) -> CliError:
    err = e.args[0] if e.args and hasattr(e.args[0], "name") else None
    if err is None:
        return CliError(f"{what}: {e}")
    name = err.name()
    if name in UNREACHABLE:
        return CliError(f"{what}: broker did not answer ({err.str()})", EXIT_UNREACHABLE)
    return CliError(f"{what}: {err.str()} ({name})")


def await_result(future, args, what: str):
    try:
        return future.result(timeout=args.timeout)
    except concurrent.futures.TimeoutError:
        raise CliError(f"{what}: no answer within {args.timeout:g}s", EXIT_UNREACHABLE) from None
    except Exception as e:  # noqa: BLE001 - KafkaException carries the broker's error
        raise kafka_error(e, what) from None


def fetch_metadata(client, args, what: str = "fetching metadata"):
    try:
        # All topics, never one by name: asking for an unknown topic by name may create it.
        return client.list_topics(timeout=args.timeout)
    except Exception as e:  # noqa: BLE001
        raise kafka_error(e, what) from None


def topic_meta(md, name: str):
    t = md.topics.get(name)
    if t is None or (t.error is not None and t.error.code() != 0):
        raise CliError(f"topic {name!r} does not exist")
    return t


def parse_kv(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError(f"{what} must look like key=value, not {item!r}")
        out[k] = v
    return out


def parse_time(value: str) -> int:
    """ISO 8601 (no zone means UTC) or epoch milliseconds -> epoch milliseconds."""
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise CliError(f"not an ISO 8601 date-time: {value!r} (e.g. 2024-05-01T12:00:00Z)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def list_offsets(admin, args, topic: str, partitions: list[int], spec) -> dict[int, tuple[int, int]]:
    """partition -> (offset, timestamp) for one OffsetSpec."""
    from confluent_kafka import TopicPartition

    if not partitions:
        return {}
    futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions}, request_timeout=args.timeout)
    out = {}
    for tp, fut in futures.items():
        info = await_result(fut, args, f"listing offsets of {topic}-{tp.partition}")
        out[tp.partition] = (info.offset, info.timestamp)
    return out


# -- argument parsing --------------------------------------------------------------------


def run_command(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except CliError as e:
            note(f"error: {e}")
            return e.code
        except KeyboardInterrupt:
            note("interrupted")
            return 130

    return run


def common_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection and output")
    g.add_argument("--bootstrap", "-b", default=os.environ.get("KAFSCALE_BOOTSTRAP", DEFAULT_BOOTSTRAP),
                   help=f"HOST:PORT[,HOST:PORT] of any broker (env KAFSCALE_BOOTSTRAP, default {DEFAULT_BOOTSTRAP})")
    g.add_argument("--command-config", default=os.environ.get("KAFSCALE_CLIENT_CONFIG"),
                   help="file of client settings, key=value per line (security.protocol, sasl.*, ssl.*; env KAFSCALE_CLIENT_CONFIG)")
    g.add_argument("-X", dest="client_setting", action="append", default=[], metavar="KEY=VALUE",
                   help="one client setting, e.g. -X security.protocol=SASL_SSL (repeatable)")
    g.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each broker answer (default 10)")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    g.add_argument("--verbose", "-v", action="store_true", help="show the Kafka client's own logs")
    return p


def command_family(subparsers, name: str, help_text: str):
    """`kafscale NAME ACTION ...`: the subparsers its actions are added to."""
    return subparsers.add_parser(name, help=help_text).add_subparsers(dest="action", required=True, metavar="ACTION")


def leaf(parent, name: str, fn, help_text: str, subject: str | None = None) -> argparse.ArgumentParser:
    """A command that runs `fn(args)` and takes the connection and output options; with
    `subject` (TOPIC, GROUP) also the name of what it acts on, as `args.name`."""
    p = parent.add_parser(name, parents=[common_options()], help=help_text, description=help_text)
    p.set_defaults(func=run_command(fn))
    if subject:
        p.add_argument("name", metavar=subject)
    return p
