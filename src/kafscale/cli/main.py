"""The `kafscale` command: `broker` runs a broker; the admin and pipeline commands talk to
a running cluster."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from kafscale.broker import config as broker_config

log = logging.getLogger("kafscale")


def _run_broker(args: argparse.Namespace) -> int:
    from kafscale.backup.guard import MetadataLost
    from kafscale.broker.app import Broker
    from kafscale.cluster.membership import BrokerIdInUse
    from kafscale.ops import logging_setup

    cfg = broker_config.from_args(args)
    logging_setup.setup(cfg.log_level, cfg.log_format)
    try:
        cfg.check_security()
    except ValueError as e:
        log.error("refusing to start: %s", e)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # uvloop is optional at run time; plain asyncio works
        pass
    # The event loop's thread holds the GIL while it works; a flush's worker threads (file
    # write and fsyncs, the SQLite commit) need it back after every syscall and wait up to
    # the switch interval each time (5 ms by default, a dozen times per flush). 0.5 ms keeps
    # those waits off the acknowledgement latency of a busy broker.
    sys.setswitchinterval(0.0005)

    async def run() -> int:
        broker = Broker(cfg)
        try:
            await broker.start()
        except (BrokerIdInUse, MetadataLost) as e:
            log.error("refusing to start: %s", e)
            await broker.close_stores()
            return 1
        # Everything loaded so far (kio schemas, modules, config) lives as long as the
        # process: keep it out of the cyclic GC's full collections.
        gc.collect()
        gc.freeze()
        # Young collections every 20,000 allocations, not 700: the request path allocates
        # dozens of short-lived objects a partition entry, and at 700 the collector ran
        # so often it took 9% of a broker's samples at 1,024 partitions (2% now, #32).
        gc.set_threshold(20_000, 20, 10)
        bound = ", ".join(f"{name} {host}:{port}" for name, (host, port) in broker.server.addresses.items())
        advertised = ",".join(f"{n}://{h}:{p}" for n, h, p in broker.cluster.local.endpoints)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # Printed once SIGTERM means a clean shutdown (supervisors and tests wait for it).
        print(f"KafScale broker {cfg.broker_id} listening on {bound} (advertised as {advertised}); storage {cfg.storage}; metadata {cfg.metadata}", flush=True)
        await stop.wait()
        # From here on a repeated SIGTERM/SIGINT changes nothing: the shutdown under way
        # flushes and hands over (asyncio's handler only sets `stop` again). Once the loop
        # is closed, the process ignores them (see below).
        log.info("shutting down: stop accepting, flush buffers")
        await broker.stop()
        log.info("stopped")
        return 0

    try:
        return asyncio.run(run())
    finally:
        # Closing the loop puts the default handlers back, and the interpreter may take a
        # while to exit after "stopped" (worker threads, gRPC channels): a second SIGTERM
        # (a supervisor repeating itself) must not turn a clean exit 0 into a kill.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafscale", description="Kafka-compatible broker on object storage")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("broker", help="run a broker")
    broker_config.add_arguments(b)
    b.set_defaults(func=_run_broker)
    from kafscale.cli import cluster, console, groups, mcp, metadata, records, schemas, security, topics
    from kafscale.pipeline import cli as pipeline_cli

    for family in (topics, groups, records, cluster, security, metadata, schemas, pipeline_cli, console, mcp):
        family.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
