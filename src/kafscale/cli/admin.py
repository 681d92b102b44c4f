"""Admin commands of the `kafscale` CLI. They speak the Kafka protocol (confluent-kafka) to
any broker, so they work the same against KafScale or Kafka:

    kafscale topics list|describe NAME|create NAME|delete NAME|alter-config NAME
    kafscale groups list|describe NAME|delete NAME|reset-offsets NAME
    kafscale offsets TOPIC [--time ISO|earliest|latest]
    kafscale produce TOPIC            (lines from stdin)
    kafscale consume TOPIC
    kafscale cluster describe

Tables by default, `--json` for scripts. Exit codes: 0 done, 1 the operation failed (unknown
topic, group not empty, invalid config, ...), 2 no broker could be reached.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import os
import socket
import sys
import time
import uuid
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


def _table(headers: list[str], rows: list[list], out=None) -> None:
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


def _json(doc) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False))


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _Progress:
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


def _check_reachable(bootstrap: str, timeout: float) -> None:
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


def _conf(args, **extra) -> dict:
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


def _admin(args):
    from confluent_kafka.admin import AdminClient

    _check_reachable(args.bootstrap, min(CONNECT_TIMEOUT_S, args.timeout))
    return AdminClient(_conf(args))


_UNREACHABLE = {"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "_DESTROY", "REQUEST_TIMED_OUT", "_WAIT_COORD", "COORDINATOR_NOT_AVAILABLE"}


def _kafka_error(e: Exception, what: str) -> CliError:
    err = e.args[0] if e.args and hasattr(e.args[0], "name") else None
    if err is None:
        return CliError(f"{what}: {e}")
    name = err.name()
    if name in _UNREACHABLE:
        return CliError(f"{what}: broker did not answer ({err.str()})", EXIT_UNREACHABLE)
    return CliError(f"{what}: {err.str()} ({name})")


def _result(future, args, what: str):
    try:
        return future.result(timeout=args.timeout)
    except concurrent.futures.TimeoutError:
        raise CliError(f"{what}: no answer within {args.timeout:g}s", EXIT_UNREACHABLE) from None
    except Exception as e:  # noqa: BLE001 - KafkaException carries the broker's error
        raise _kafka_error(e, what) from None


def _metadata(client, args, what: str = "fetching metadata"):
    try:
        # All topics, never one by name: asking for an unknown topic by name may create it.
        return client.list_topics(timeout=args.timeout)
    except Exception as e:  # noqa: BLE001
        raise _kafka_error(e, what) from None


def _topic_meta(md, name: str):
    t = md.topics.get(name)
    if t is None or (t.error is not None and t.error.code() != 0):
        raise CliError(f"topic {name!r} does not exist")
    return t


def _parse_kv(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError(f"{what} must look like key=value, not {item!r}")
        out[k] = v
    return out


def _parse_time(value: str) -> int:
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


def _list_offsets(admin, args, topic: str, partitions: list[int], spec) -> dict[int, tuple[int, int]]:
    """partition -> (offset, timestamp) for one OffsetSpec."""
    from confluent_kafka import TopicPartition

    if not partitions:
        return {}
    futures = admin.list_offsets({TopicPartition(topic, p): spec for p in partitions}, request_timeout=args.timeout)
    out = {}
    for tp, fut in futures.items():
        info = _result(fut, args, f"listing offsets of {topic}-{tp.partition}")
        out[tp.partition] = (info.offset, info.timestamp)
    return out


def _state(state) -> str:
    """ConsumerGroupState enum -> Kafka's spelling (Stable, Empty, ...)."""
    name = getattr(state, "name", str(state))
    return "".join(p.title() for p in name.split("_"))


# -- topics ------------------------------------------------------------------------------


def topics_list(args) -> int:
    md = _metadata(_admin(args), args, "listing topics")
    rows = sorted((name, len(t.partitions)) for name, t in md.topics.items())
    if args.json:
        _json([{"name": n, "partitions": p} for n, p in rows])
    else:
        _table(["TOPIC", "PARTITIONS"], [list(r) for r in rows])
    return EXIT_OK


def _topic_configs(admin, args, name: str) -> dict:
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, name)
    entries = _result(admin.describe_configs([res], request_timeout=args.timeout)[res], args, f"describing configs of {name!r}")
    dynamic = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    return {k: {"value": e.value, "override": int(getattr(e.source, "value", e.source)) == dynamic} for k, e in sorted(entries.items())}


def topics_describe(args) -> int:
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(args)
    t = _topic_meta(_metadata(admin, args), args.name)
    parts = sorted(t.partitions.values(), key=lambda p: p.id)
    ids = [p.id for p in parts]
    earliest = _list_offsets(admin, args, args.name, ids, OffsetSpec.earliest())
    latest = _list_offsets(admin, args, args.name, ids, OffsetSpec.latest())
    configs = _topic_configs(admin, args, args.name)
    rows = []
    for p in parts:
        lo, hi = earliest[p.id][0], latest[p.id][0]
        rows.append({"partition": p.id, "leader": p.leader, "replicas": list(p.replicas), "isr": list(p.isrs), "earliest": lo, "latest": hi, "records": max(hi - lo, 0)})
    if args.json:
        _json({"name": args.name, "partitions": rows, "configs": {k: c["value"] for k, c in configs.items()}, "overrides": {k: c["value"] for k, c in configs.items() if c["override"]}})
        return EXIT_OK
    overrides = [f"{k}={c['value']}" for k, c in configs.items() if c["override"]]
    print(f"Topic: {args.name}")
    print(f"Partitions: {len(rows)}   Records: {sum(r['records'] for r in rows)}")
    print(f"Config overrides: {', '.join(overrides) if overrides else '(none)'}")
    print()
    _table(
        ["PARTITION", "LEADER", "REPLICAS", "ISR", "EARLIEST", "LATEST", "RECORDS"],
        [[r["partition"], r["leader"], ",".join(map(str, r["replicas"])), ",".join(map(str, r["isr"])), r["earliest"], r["latest"], r["records"]] for r in rows],
    )
    return EXIT_OK


def topics_create(args) -> int:
    from confluent_kafka.admin import NewTopic

    configs = _parse_kv(args.config, "--config")
    admin = _admin(args)
    topic = NewTopic(args.name, num_partitions=args.partitions, replication_factor=args.replication_factor, config=configs)
    _result(admin.create_topics([topic], request_timeout=args.timeout)[args.name], args, f"creating topic {args.name!r}")
    if args.json:
        _json({"name": args.name, "partitions": args.partitions, "configs": configs, "created": True})
    else:
        print(f"created topic {args.name} with {args.partitions} partitions" + (f" ({', '.join(f'{k}={v}' for k, v in configs.items())})" if configs else ""))
    return EXIT_OK


def topics_delete(args) -> int:
    admin = _admin(args)
    _topic_meta(_metadata(admin, args), args.name)  # a clear message for unknown topics
    _result(admin.delete_topics([args.name], request_timeout=args.timeout)[args.name], args, f"deleting topic {args.name!r}")
    if args.json:
        _json({"name": args.name, "deleted": True})
    else:
        print(f"deleted topic {args.name}")
    return EXIT_OK


def topics_alter_config(args) -> int:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    sets = _parse_kv(args.set, "--set")
    deletes = list(args.delete or ())
    if not sets and not deletes:
        raise CliError("nothing to change: give --set key=value and/or --delete key")
    admin = _admin(args)
    _topic_meta(_metadata(admin, args), args.name)
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
    res = ConfigResource(ResourceType.TOPIC, args.name, incremental_configs=entries)
    _result(admin.incremental_alter_configs([res], request_timeout=args.timeout)[res], args, f"altering configs of {args.name!r}")
    overrides = {k: c["value"] for k, c in _topic_configs(admin, args, args.name).items() if c["override"]}
    if args.json:
        _json({"name": args.name, "set": sets, "deleted": deletes, "overrides": overrides})
    else:
        print(f"altered configs of topic {args.name}")
        print(f"Config overrides: {', '.join(f'{k}={v}' for k, v in overrides.items()) if overrides else '(none)'}")
    return EXIT_OK


# -- groups ------------------------------------------------------------------------------


def groups_list(args) -> int:
    admin = _admin(args)
    res = _result(admin.list_consumer_groups(request_timeout=args.timeout), args, "listing groups")
    rows = sorted(((g.group_id, _state(g.state), "simple" if g.is_simple_consumer_group else "consumer") for g in res.valid), key=lambda r: r[0])
    for err in res.errors:
        _note(f"warning: a broker did not list its groups: {err}")
    if args.json:
        _json([{"group": g, "state": s, "type": t} for g, s, t in rows])
    else:
        _table(["GROUP", "STATE", "TYPE"], [list(r) for r in rows])
    return EXIT_OK if not res.errors else EXIT_FAILED


def _describe_group(admin, args, group: str):
    return _result(admin.describe_consumer_groups([group], request_timeout=args.timeout)[group], args, f"describing group {group!r}")


def _committed(admin, args, group: str, partitions=None) -> dict[tuple[str, int], int]:
    """(topic, partition) -> committed offset (only partitions with a commit)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    req = ConsumerGroupTopicPartitions(group, partitions) if partitions else ConsumerGroupTopicPartitions(group)
    res = _result(admin.list_consumer_group_offsets([req], request_timeout=args.timeout)[group], args, f"fetching offsets of group {group!r}")
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0 and tp.error is None}


def _latest(admin, args, tps) -> dict[tuple[str, int], int]:
    from confluent_kafka.admin import OffsetSpec

    out = {}
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    for t, ps in by_topic.items():
        for p, (off, _ts) in _list_offsets(admin, args, t, sorted(ps), OffsetSpec.latest()).items():
            out[(t, p)] = off
    return out


def groups_describe(args) -> int:
    admin = _admin(args)
    desc = _describe_group(admin, args, args.name)
    state = _state(desc.state)
    committed = _committed(admin, args, args.name)
    if state in ("Dead", "Unknown") and not desc.members and not committed:
        raise CliError(f"group {args.name!r} does not exist")
    owner: dict[tuple[str, int], object] = {}
    for m in desc.members:
        for tp in getattr(m.assignment, "topic_partitions", None) or ():
            owner[(tp.topic, tp.partition)] = m
    tps = sorted(set(committed) | set(owner))
    ends = _latest(admin, args, tps) if tps else {}
    rows = []
    for key in tps:
        m = owner.get(key)
        off = committed.get(key)
        end = ends.get(key)
        lag = max(end - off, 0) if off is not None and end is not None else None
        rows.append({"topic": key[0], "partition": key[1], "committed": off, "end": end, "lag": lag,
                     "member": m.member_id if m else None, "client": m.client_id if m else None, "host": m.host if m else None})
    coordinator = getattr(desc.coordinator, "id", None)
    members = [{"member": m.member_id, "client": m.client_id, "host": m.host, "instance": m.group_instance_id,
                "assignment": [f"{tp.topic}-{tp.partition}" for tp in (getattr(m.assignment, "topic_partitions", None) or ())]} for m in desc.members]
    if args.json:
        _json({"group": args.name, "state": state, "assignor": desc.partition_assignor, "coordinator": coordinator,
               "members": members, "partitions": rows, "total_lag": sum(r["lag"] or 0 for r in rows)})
        return EXIT_OK
    print(f"Group: {args.name}   State: {state}   Members: {len(members)}   Assignor: {desc.partition_assignor or '-'}   Coordinator: {coordinator}")
    print(f"Total lag: {sum(r['lag'] or 0 for r in rows)}")
    print()
    _table(["TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER", "CLIENT", "HOST"],
           [[r["topic"], r["partition"], r["committed"], r["end"], r["lag"], r["member"] or "-", r["client"] or "-", r["host"] or "-"] for r in rows])
    return EXIT_OK


def groups_delete(args) -> int:
    admin = _admin(args)
    try:
        admin.delete_consumer_groups([args.name], request_timeout=args.timeout)[args.name].result(timeout=args.timeout)
    except concurrent.futures.TimeoutError:
        raise CliError(f"deleting group {args.name!r}: no answer within {args.timeout:g}s", EXIT_UNREACHABLE) from None
    except Exception as e:  # noqa: BLE001
        err = e.args[0] if e.args and hasattr(e.args[0], "name") else None
        name = err.name() if err is not None else ""
        if name == "GROUP_ID_NOT_FOUND":
            raise CliError(f"group {args.name!r} does not exist") from None
        if name == "NON_EMPTY_GROUP":
            raise CliError(f"group {args.name!r} still has active members; stop its consumers first") from None
        raise _kafka_error(e, f"deleting group {args.name!r}") from None
    if args.json:
        _json({"group": args.name, "deleted": True})
    else:
        print(f"deleted group {args.name}")
    return EXIT_OK


def _parse_topic_arg(value: str) -> tuple[str, list[int] | None]:
    """`topic` or `topic:0,2,5` (Kafka's syntax for a subset of partitions)."""
    topic, sep, parts = value.partition(":")
    if not sep:
        return topic, None
    try:
        return topic, sorted({int(p) for p in parts.split(",") if p != ""})
    except ValueError:
        raise CliError(f"--topic must be TOPIC or TOPIC:P1,P2,..., not {value!r}") from None


def groups_reset_offsets(args) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(args)
    topic, wanted = _parse_topic_arg(args.topic)
    t = _topic_meta(_metadata(admin, args), topic)
    partitions = sorted(t.partitions)
    if wanted is not None:
        missing = [p for p in wanted if p not in t.partitions]
        if missing:
            raise CliError(f"topic {topic!r} has no partition {missing[0]} (it has {len(partitions)})")
        partitions = wanted

    # Kafka only lets offsets be reset while nobody consumes: members would overwrite them.
    desc = _describe_group(admin, args, args.name)
    state = _state(desc.state)
    if desc.members or state not in ("Empty", "Dead", "Unknown"):
        raise CliError(f"group {args.name!r} is not empty (state {state}, {len(desc.members)} members): stop its consumers before resetting offsets")

    earliest = _list_offsets(admin, args, topic, partitions, OffsetSpec.earliest())
    latest = _list_offsets(admin, args, topic, partitions, OffsetSpec.latest())
    if args.to_datetime is not None:
        at = _list_offsets(admin, args, topic, partitions, OffsetSpec.for_timestamp(_parse_time(args.to_datetime)))
    current = _committed(admin, args, args.name, [TopicPartition(topic, p) for p in partitions])
    plan = []
    for p in partitions:
        lo, hi = earliest[p][0], latest[p][0]
        if args.to_earliest:
            new = lo
        elif args.to_latest:
            new = hi
        elif args.to_offset is not None:
            new = min(max(args.to_offset, lo), hi)  # out-of-range targets are clamped, as Kafka does
        else:
            new = at[p][0]
            if new < 0:  # no record at or after that time: the end of the partition
                new = hi
        plan.append({"topic": topic, "partition": p, "current": current.get((topic, p)), "new": new})

    if args.execute:
        req = ConsumerGroupTopicPartitions(args.name, [TopicPartition(topic, r["partition"], r["new"]) for r in plan])
        res = _result(admin.alter_consumer_group_offsets([req], request_timeout=args.timeout)[args.name], args, f"resetting offsets of group {args.name!r}")
        failed = [tp for tp in res.topic_partitions if tp.error is not None]
        if failed:
            raise CliError(f"resetting {failed[0].topic}-{failed[0].partition}: {failed[0].error.str()}")
    if args.json:
        _json({"group": args.name, "executed": bool(args.execute), "partitions": plan})
    else:
        _table(["GROUP", "TOPIC", "PARTITION", "CURRENT", "NEW"], [[args.name, r["topic"], r["partition"], r["current"] if r["current"] is not None else "-", r["new"]] for r in plan])
    if args.execute:
        _note(f"offsets of group {args.name} reset on {len(plan)} partitions")
    else:
        _note("dry run: nothing changed; add --execute to apply this plan")
    return EXIT_OK


# -- offsets -----------------------------------------------------------------------------


def offsets(args) -> int:
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(args)
    t = _topic_meta(_metadata(admin, args), args.topic)
    ps = sorted(t.partitions)
    if args.time is None:
        lo = _list_offsets(admin, args, args.topic, ps, OffsetSpec.earliest())
        hi = _list_offsets(admin, args, args.topic, ps, OffsetSpec.latest())
        rows = [{"partition": p, "earliest": lo[p][0], "latest": hi[p][0]} for p in ps]
        if args.json:
            _json({"topic": args.topic, "partitions": rows})
        else:
            _table(["PARTITION", "EARLIEST", "LATEST"], [[r["partition"], r["earliest"], r["latest"]] for r in rows])
        return EXIT_OK
    when = args.time.lower()
    spec = OffsetSpec.earliest() if when == "earliest" else OffsetSpec.latest() if when == "latest" else OffsetSpec.for_timestamp(_parse_time(args.time))
    res = _list_offsets(admin, args, args.topic, ps, spec)
    rows = [{"partition": p, "offset": res[p][0], "timestamp": res[p][1] if res[p][1] is not None and res[p][1] >= 0 else None} for p in ps]
    if args.json:
        _json({"topic": args.topic, "time": args.time, "partitions": rows})
    else:
        # -1 for a date-time: no record at or after it (a consumer would start at the end).
        _table(["PARTITION", "OFFSET", "TIMESTAMP"], [[r["partition"], r["offset"], _fmt_ts(r["timestamp"]) if r["timestamp"] else "-"] for r in rows])
    return EXIT_OK


def _fmt_ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- produce / consume -------------------------------------------------------------------


def _ensure_topic(producer, args, topic: str) -> None:
    """Fail with exit 1 unless `topic` exists or the broker auto-creates it."""
    md = _metadata(producer, args)
    if topic in md.topics:
        return
    # A named lookup from a producer asks the broker to create the topic (if it may).
    try:
        md = producer.list_topics(topic=topic, timeout=args.timeout)
        t = md.topics.get(topic)
        if t is not None and (t.error is None or t.error.code() == 0) and t.partitions:
            return
    except Exception:  # noqa: BLE001 - fall through to a plain "does not exist"
        pass
    raise CliError(f"topic {topic!r} does not exist")


def produce(args) -> int:
    from confluent_kafka import Producer

    headers = [(k, v.encode()) for k, v in _parse_kv(args.header, "--header").items()]
    sep = args.key_separator.encode() if args.key_separator else None
    _check_reachable(args.bootstrap, min(CONNECT_TIMEOUT_S, args.timeout))
    producer = Producer(_conf(args, **{"linger.ms": 5, "message.timeout.ms": int(max(args.timeout, 5) * 1000), "acks": "all"}))
    _ensure_topic(producer, args, args.topic)
    state = {"ok": 0, "failed": 0, "error": None}

    def delivered(err, _msg):
        if err is None:
            state["ok"] += 1
        else:
            state["failed"] += 1
            state["error"] = state["error"] or err

    progress = _Progress(args, f"producing to {args.topic}")
    sent = 0
    stdin = sys.stdin.buffer
    try:
        for lineno, raw in enumerate(stdin, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            key = None
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    raise CliError(f"line {lineno} has no key separator {args.key_separator!r}")
            else:
                value = line
            while True:
                try:
                    producer.produce(args.topic, value=value, key=key, headers=headers or None, on_delivery=delivered)
                    break
                except BufferError:  # local queue full: let deliveries drain it
                    producer.poll(0.1)
            sent += 1
            producer.poll(0)
            progress.update(state["ok"])
    finally:
        deadline = time.monotonic() + max(args.timeout, 5) + 5
        while producer.flush(0.5) > 0 and time.monotonic() < deadline:
            progress.update(state["ok"], sent)
        progress.finish()
    lost = sent - state["ok"] - state["failed"]
    if args.json:
        _json({"topic": args.topic, "produced": state["ok"], "failed": state["failed"] + lost})
    else:
        _note(f"produced {state['ok']} records to {args.topic}" + (f", {state['failed'] + lost} failed" if state["failed"] or lost else ""))
    if state["failed"] or lost:
        err = state["error"]
        raise CliError(f"{state['failed'] + lost} records not delivered: {err.str() if err else 'timed out'}",
                       EXIT_UNREACHABLE if err is None or err.name() in _UNREACHABLE or err.name() == "_MSG_TIMED_OUT" else EXIT_FAILED)
    return EXIT_OK


def _text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "backslashreplace")


def _render(fmt: str, msg) -> str:
    """%t topic, %p partition, %o offset, %k key, %v value, %T timestamp (ms), %h headers,
    %% a percent sign; \\n and \\t are expanded."""
    out = []
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c == "%" and i + 1 < len(fmt):
            f = fmt[i + 1]
            i += 2
            if f == "t":
                out.append(msg.topic())
            elif f == "p":
                out.append(str(msg.partition()))
            elif f == "o":
                out.append(str(msg.offset()))
            elif f == "k":
                out.append(_text(msg.key()) or "")
            elif f == "v":
                out.append(_text(msg.value()) or "")
            elif f == "T":
                out.append(str(msg.timestamp()[1]))
            elif f == "h":
                out.append(",".join(f"{k}={_text(v) or ''}" for k, v in (msg.headers() or ())))
            elif f == "%":
                out.append("%")
            else:
                out.append("%" + f)
            continue
        if c == "\\" and i + 1 < len(fmt) and fmt[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[fmt[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _as_json(msg) -> str:
    def field(b):
        if b is None:
            return None
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(b).decode()}

    ts_type, ts = msg.timestamp()
    return json.dumps({
        "topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
        "timestamp": ts if ts_type else None, "key": field(msg.key()), "value": field(msg.value()),
        "headers": [[k, field(v)] for k, v in (msg.headers() or ())],
    })


def consume(args) -> int:
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    _check_reachable(args.bootstrap, min(CONNECT_TIMEOUT_S, args.timeout))
    conf = _conf(args, **{
        # Without --group nothing is committed and no group is joined (partitions are
        # assigned directly); librdkafka still insists on some group.id.
        "group.id": args.group or f"kafscale-cli-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": bool(args.group),
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "enable.partition.eof": True,
    })
    consumer = Consumer(conf)
    count = 0
    out = sys.stdout
    try:
        t = _topic_meta(_metadata(consumer, args), args.topic)
        assigned: set[int] | None
        if args.group:
            consumer.subscribe([args.topic])
            assigned = None  # known once the group assigns partitions
        else:
            start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
            consumer.assign([TopicPartition(args.topic, p, start) for p in sorted(t.partitions)])
            assigned = set(t.partitions)
        at_end: set[int] = set()
        last_data = time.monotonic()
        flush_each = out.isatty()
        while args.max_messages is None or count < args.max_messages:
            msg = consumer.poll(0.5)
            if msg is None:
                if args.idle_timeout is not None and time.monotonic() - last_data > args.idle_timeout:
                    break
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    if args.group:
                        assigned = {tp.partition for tp in consumer.assignment()}
                    if args.exit_at_end and assigned and assigned <= at_end:
                        break
                    continue
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    raise CliError(f"topic {args.topic!r} does not exist")
                if err.fatal():
                    raise CliError(f"consumer failed: {err.str()}")
                _note(f"warning: {err.str()}")
                continue
            at_end.discard(msg.partition())
            last_data = time.monotonic()
            out.write((_as_json(msg) if args.json else _render(args.format, msg)) + "\n")
            if flush_each:
                out.flush()
            count += 1
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # `| head`: the reader is gone. Point stdout at /dev/null so the interpreter's
        # final flush does not complain, and stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    finally:
        try:
            out.flush()
        except (BrokenPipeError, ValueError):
            pass
        consumer.close()  # commits the final position when in a group
    _note(f"consumed {count} records")
    return EXIT_OK


# -- cluster -----------------------------------------------------------------------------


def cluster_describe(args) -> int:
    md = _metadata(_admin(args), args, "describing the cluster")
    leaders: dict[int, int] = {}
    npart = 0
    for t in md.topics.values():
        for p in t.partitions.values():
            npart += 1
            leaders[p.leader] = leaders.get(p.leader, 0) + 1
    brokers = [{"id": b.id, "host": b.host, "port": b.port, "controller": b.id == md.controller_id, "leader_partitions": leaders.get(b.id, 0)}
               for b in sorted(md.brokers.values(), key=lambda b: b.id)]
    if args.json:
        _json({"cluster_id": md.cluster_id, "controller": md.controller_id, "brokers": brokers, "topics": len(md.topics), "partitions": npart})
        return EXIT_OK
    print(f"Cluster id: {md.cluster_id}")
    print(f"Controller: {md.controller_id}")
    print(f"Topics: {len(md.topics)}   Partitions: {npart}")
    print()
    _table(["BROKER", "HOST", "PORT", "LEADER PARTITIONS", "CONTROLLER"],
           [[b["id"], b["host"], b["port"], b["leader_partitions"], "yes" if b["controller"] else ""] for b in brokers])
    return EXIT_OK


# -- argument parsing --------------------------------------------------------------------


def _run(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except CliError as e:
            _note(f"error: {e}")
            return e.code
        except KeyboardInterrupt:
            _note("interrupted")
            return 130

    return run


def _common() -> argparse.ArgumentParser:
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


def add_commands(subparsers) -> None:
    common = _common()

    def leaf(parent, name, fn, help_text, **kw):
        p = parent.add_parser(name, parents=[common], help=help_text, description=help_text, **kw)
        p.set_defaults(func=_run(fn))
        return p

    topics = subparsers.add_parser("topics", help="list, describe, create, delete topics; alter topic configs")
    ts = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(ts, "list", topics_list, "list topics with their partition counts")
    p = leaf(ts, "describe", topics_describe, "partitions, offsets and config overrides of a topic")
    p.add_argument("name", metavar="TOPIC")
    p = leaf(ts, "create", topics_create, "create a topic")
    p.add_argument("name", metavar="TOPIC")
    p.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    p.add_argument("--replication-factor", type=int, default=-1, help="accepted for compatibility (durability comes from the object store)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="topic config, repeatable (e.g. retention.ms=86400000)")
    p = leaf(ts, "delete", topics_delete, "delete a topic and its data")
    p.add_argument("name", metavar="TOPIC")
    p = leaf(ts, "alter-config", topics_alter_config, "set or remove topic config overrides")
    p.add_argument("name", metavar="TOPIC")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set an override, repeatable")
    p.add_argument("--delete", action="append", metavar="KEY", help="remove an override (back to the default), repeatable")

    groups = subparsers.add_parser("groups", help="list, describe, delete consumer groups; reset their offsets")
    gs = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(gs, "list", groups_list, "list consumer groups with their states")
    p = leaf(gs, "describe", groups_describe, "members, committed offsets and lag of a group")
    p.add_argument("name", metavar="GROUP")
    p = leaf(gs, "delete", groups_delete, "delete an empty group and its committed offsets")
    p.add_argument("name", metavar="GROUP")
    p = leaf(gs, "reset-offsets", groups_reset_offsets, "move an empty group's committed offsets (dry run unless --execute)")
    p.add_argument("name", metavar="GROUP")
    p.add_argument("--topic", required=True, help="TOPIC, or TOPIC:P1,P2 for some partitions")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the oldest offset still kept")
    to.add_argument("--to-latest", action="store_true", help="the end of each partition (skip everything)")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped into the available range)")
    to.add_argument("--to-datetime", metavar="ISO", help="first offset at or after this time (ISO 8601; no zone means UTC)")
    p.add_argument("--execute", action="store_true", help="apply the plan (default: only print it)")

    p = leaf(subparsers, "offsets", offsets, "earliest/latest offsets of each partition, or the offsets at a time")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--time", metavar="ISO|earliest|latest", help="ISO 8601 date-time (no zone: UTC), epoch ms, earliest or latest")

    p = leaf(subparsers, "produce", produce, "produce one record per line of stdin")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--key-separator", metavar="SEP", help="split each line at the first SEP into key and value")
    p.add_argument("--header", action="append", metavar="KEY=VALUE", help="header added to every record, repeatable")

    p = leaf(subparsers, "consume", consume, "print records of a topic")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--from-beginning", action="store_true", help="start at the oldest record (default: only new records)")
    p.add_argument("--max-messages", type=int, metavar="N", help="exit after N records")
    p.add_argument("--exit-at-end", "-e", action="store_true", help="exit once every partition has been read to its end")
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS", help="exit after this long without a record")
    p.add_argument("--format", default="%v", help="output line: %%t topic, %%p partition, %%o offset, %%k key, %%v value, %%T timestamp, %%h headers (default %%v)")
    p.add_argument("--group", metavar="GROUP", help="consume as a member of GROUP and commit offsets (default: no group, nothing committed)")

    cluster = subparsers.add_parser("cluster", help="cluster id, controller and brokers")
    cs = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    leaf(cs, "describe", cluster_describe, "cluster id, controller, brokers and partition leadership")
