"""How a `kafscale` client command reaches a cluster: the connection options (--bootstrap,
--command-config, -X, --timeout; `KAFSCALE_*` variables), the librdkafka settings they make,
waiting on a client's answers and turning Kafka errors into messages and exit codes. The
admin CLI (cli/), `kafscale console` and `kafscale mcp` (console/) share it.

Exit codes: 0 done, 1 the operation failed (unknown topic, group not empty, invalid config,
...), 2 no broker could be reached.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
from datetime import datetime, timezone

EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 2
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CONNECT_TIMEOUT_S = 3.0


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


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


class UnsupportedSecurity(Exception):
    """The connection settings use what `kafka_request` cannot (OAUTHBEARER, GSSAPI)."""


def kafka_request(args, host: str, port: int, api_key: int, version: int, body):
    """One request to one broker, for what librdkafka's admin API does not offer (a
    consumer group's member epochs: ConsumerGroupDescribe). Over the same connection
    settings as the librdkafka clients: PLAINTEXT, SSL and SASL PLAIN/SCRAM (the broker's
    own inter-broker client); other SASL mechanisms raise UnsupportedSecurity."""
    import asyncio

    from kafscale.protocol.codec import decode_response, encode_request

    security = _request_security(client_conf(args))

    async def call():
        reader, writer = await security.connect(host, port, args.timeout, "kafscale-cli")
        try:
            writer.write(encode_request(api_key, version, 1, "kafscale-cli", body))
            await writer.drain()
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), args.timeout), "big", signed=True)
            return decode_response(api_key, version, await asyncio.wait_for(reader.readexactly(size), args.timeout))[1]
        finally:
            writer.close()

    return asyncio.run(call())


def _request_security(conf: dict):
    """librdkafka's security settings as the broker's client connector."""
    import ssl

    from kafscale.security.inter_broker import InterBrokerSecurity

    protocol = str(conf.get("security.protocol", "plaintext")).upper()
    ctx = None
    if protocol in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(cafile=conf.get("ssl.ca.location") or None)
        if str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
            ctx.check_hostname = False
        if str(conf.get("enable.ssl.certificate.verification", "true")).lower() == "false":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if conf.get("ssl.certificate.location"):
            ctx.load_cert_chain(conf["ssl.certificate.location"], conf.get("ssl.key.location") or None, conf.get("ssl.key.password") or None)
    mechanism = str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI"))).upper()
    if protocol.startswith("SASL_") and mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise UnsupportedSecurity(f"SASL {mechanism}")
    return InterBrokerSecurity("", protocol, ctx, mechanism, str(conf.get("sasl.username", "")), str(conf.get("sasl.password", "")))


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


def add_connection_options(g) -> None:
    """--bootstrap, --command-config, -X and --timeout: how any client command reaches the
    cluster (the admin commands, `kafscale console`, `kafscale mcp`)."""
    g.add_argument("--bootstrap", "-b", default=os.environ.get("KAFSCALE_BOOTSTRAP", DEFAULT_BOOTSTRAP),
                   help=f"HOST:PORT[,HOST:PORT] of any broker (env KAFSCALE_BOOTSTRAP, default {DEFAULT_BOOTSTRAP})")
    g.add_argument("--command-config", default=os.environ.get("KAFSCALE_CLIENT_CONFIG"),
                   help="file of client settings, key=value per line (security.protocol, sasl.*, ssl.*; env KAFSCALE_CLIENT_CONFIG)")
    g.add_argument("-X", dest="client_setting", action="append", default=[], metavar="KEY=VALUE",
                   help="one client setting, e.g. -X security.protocol=SASL_SSL (repeatable)")
    g.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each broker answer (default 10)")
