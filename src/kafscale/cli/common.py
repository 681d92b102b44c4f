"""What every admin command of the `kafscale` CLI shares: tables/JSON/progress output, the
options every command takes, running a command; connecting (a confluent-kafka admin client
with the client settings of --command-config and -X), waiting for answers and turning
Kafka errors into exit codes live in kafscale/client.py, re-exported here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tabulate import tabulate

from kafscale.client import (  # noqa: F401 - re-exported for the command modules
    CONNECT_TIMEOUT_S, DEFAULT_BOOTSTRAP, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UNREACHABLE, CliError, add_connection_options,
    admin_client, await_result, check_reachable, client_conf, client_settings, fetch_metadata, kafka_error, list_offsets, parse_time,
    topic_meta,
)


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


def alter_config_overrides(args, admin, resource_type, name: str, what: str, overrides_now) -> int:
    """`alter-config NAME --set k=v --delete k` of a config resource (IncrementalAlterConfigs),
    then the overrides it has now (`overrides_now()`), printed or as JSON."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    sets = parse_kv(args.set, "--set")
    deletes = list(args.delete or ())
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
    res = ConfigResource(resource_type, name, incremental_configs=entries)
    await_result(admin.incremental_alter_configs([res], request_timeout=args.timeout)[res], args, f"altering configs of {what} {name!r}")
    overrides = overrides_now()
    if args.json:
        print_json({"name": name, "set": sets, "deleted": deletes, "overrides": overrides})
    else:
        print(f"altered configs of {what} {name}")
        print(f"Config overrides: {', '.join(f'{k}={v}' for k, v in overrides.items()) if overrides else '(none)'}")
    return EXIT_OK


def nothing_to_change(args) -> None:
    if not args.set and not args.delete:
        raise CliError("nothing to change: give --set key=value and/or --delete key")


def parse_kv(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError(f"{what} must look like key=value, not {item!r}")
        out[k] = v
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
    add_connection_options(g)
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
