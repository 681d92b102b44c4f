"""`kafscale offsets`, `kafscale produce` (lines of stdin) and `kafscale consume`: the records of a topic."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone

from kafscale.cli.common import CONNECT_TIMEOUT_S, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UNREACHABLE, CliError, Progress, admin_client, check_reachable, client_conf, fetch_metadata, leaf, list_offsets, note, parse_kv, parse_time, print_json, table, topic_meta


def offsets(args) -> int:
    from confluent_kafka.admin import OffsetSpec

    admin = admin_client(args)
    t = topic_meta(fetch_metadata(admin, args), args.topic)
    ps = sorted(t.partitions)
    if args.time is None:
        lo = list_offsets(admin, args, args.topic, ps, OffsetSpec.earliest())
        hi = list_offsets(admin, args, args.topic, ps, OffsetSpec.latest())
        rows = [{"partition": p, "earliest": lo[p][0], "latest": hi[p][0]} for p in ps]
        if args.json:
            print_json({"topic": args.topic, "partitions": rows})
        else:
            table(["PARTITION", "EARLIEST", "LATEST"], [[r["partition"], r["earliest"], r["latest"]] for r in rows])
        return EXIT_OK
    when = args.time.lower()
    spec = OffsetSpec.earliest() if when == "earliest" else OffsetSpec.latest() if when == "latest" else OffsetSpec.for_timestamp(parse_time(args.time))
    res = list_offsets(admin, args, args.topic, ps, spec)
    rows = [{"partition": p, "offset": res[p][0], "timestamp": res[p][1] if res[p][1] is not None and res[p][1] >= 0 else None} for p in ps]
    if args.json:
        print_json({"topic": args.topic, "time": args.time, "partitions": rows})
    else:
        # -1 for a date-time: no record at or after it (a consumer would start at the end).
        table(["PARTITION", "OFFSET", "TIMESTAMP"], [[r["partition"], r["offset"], _fmt_ts(r["timestamp"]) if r["timestamp"] else "-"] for r in rows])
    return EXIT_OK


def _fmt_ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- produce / consume -------------------------------------------------------------------


def _ensure_topic(producer, args, topic: str) -> None:
    """Fail with exit 1 unless `topic` exists or the broker auto-creates it."""
    md = fetch_metadata(producer, args)
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

    headers = [(k, v.encode()) for k, v in parse_kv(args.header, "--header").items()]
    sep = args.key_separator.encode() if args.key_separator else None
    check_reachable(args.bootstrap, min(CONNECT_TIMEOUT_S, args.timeout))
    producer = Producer(client_conf(args, **{"linger.ms": 5, "message.timeout.ms": int(max(args.timeout, 5) * 1000), "acks": "all"}))
    _ensure_topic(producer, args, args.topic)
    state = {"ok": 0, "failed": 0, "error": None}

    def delivered(err, _msg):
        if err is None:
            state["ok"] += 1
        else:
            state["failed"] += 1
            state["error"] = state["error"] or err

    progress = Progress(args, f"producing to {args.topic}")
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
        print_json({"topic": args.topic, "produced": state["ok"], "failed": state["failed"] + lost})
    else:
        note(f"produced {state['ok']} records to {args.topic}" + (f", {state['failed'] + lost} failed" if state["failed"] or lost else ""))
    if state["failed"] or lost:
        err = state["error"]
        raise CliError(f"{state['failed'] + lost} records not delivered: {err.str() if err else 'timed out'}",
                       EXIT_UNREACHABLE if err is None or err.name() in UNREACHABLE or err.name() == "_MSG_TIMED_OUT" else EXIT_FAILED)
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

    check_reachable(args.bootstrap, min(CONNECT_TIMEOUT_S, args.timeout))
    conf = client_conf(args, **{
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
        t = topic_meta(fetch_metadata(consumer, args), args.topic)
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
                note(f"warning: {err.str()}")
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
    note(f"consumed {count} records")
    return EXIT_OK


def add_commands(subparsers) -> None:
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
