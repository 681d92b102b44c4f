"""`kafscale topics list|describe|create|delete|alter-config|restore`."""

from __future__ import annotations

import dataclasses

from kafscale.cli.common import EXIT_OK, EXIT_UNREACHABLE, CliError, Progress, admin_client, alter_config_overrides, await_result, command_family, fetch_metadata, leaf, list_offsets, nothing_to_change, parse_kv, parse_time, print_json, run_command, table, topic_meta


def topics_list(args) -> int:
    md = fetch_metadata(admin_client(args), args, "listing topics")
    rows = sorted((name, len(t.partitions)) for name, t in md.topics.items())
    if args.json:
        print_json([{"name": n, "partitions": p} for n, p in rows])
    else:
        table(["TOPIC", "PARTITIONS"], [list(r) for r in rows])
    return EXIT_OK


def _topic_configs(admin, args, name: str) -> dict:
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, name)
    entries = await_result(admin.describe_configs([res], request_timeout=args.timeout)[res], args, f"describing configs of {name!r}")
    dynamic = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    return {k: {"value": e.value, "override": int(getattr(e.source, "value", e.source)) == dynamic} for k, e in sorted(entries.items())}


def topics_describe(args) -> int:
    from confluent_kafka.admin import OffsetSpec

    admin = admin_client(args)
    t = topic_meta(fetch_metadata(admin, args), args.name)
    parts = sorted(t.partitions.values(), key=lambda p: p.id)
    ids = [p.id for p in parts]
    earliest = list_offsets(admin, args, args.name, ids, OffsetSpec.earliest())
    latest = list_offsets(admin, args, args.name, ids, OffsetSpec.latest())
    configs = _topic_configs(admin, args, args.name)
    rows = []
    for p in parts:
        lo, hi = earliest[p.id][0], latest[p.id][0]
        rows.append({"partition": p.id, "leader": p.leader, "replicas": list(p.replicas), "isr": list(p.isrs), "earliest": lo, "latest": hi, "records": max(hi - lo, 0)})
    if args.json:
        print_json({"name": args.name, "partitions": rows, "configs": {k: c["value"] for k, c in configs.items()}, "overrides": {k: c["value"] for k, c in configs.items() if c["override"]}})
        return EXIT_OK
    overrides = [f"{k}={c['value']}" for k, c in configs.items() if c["override"]]
    print(f"Topic: {args.name}")
    print(f"Partitions: {len(rows)}   Records: {sum(r['records'] for r in rows)}")
    print(f"Config overrides: {', '.join(overrides) if overrides else '(none)'}")
    print()
    table(
        ["PARTITION", "LEADER", "REPLICAS", "ISR", "EARLIEST", "LATEST", "RECORDS"],
        [[r["partition"], r["leader"], ",".join(map(str, r["replicas"])), ",".join(map(str, r["isr"])), r["earliest"], r["latest"], r["records"]] for r in rows],
    )
    return EXIT_OK


def topics_create(args) -> int:
    from confluent_kafka.admin import NewTopic

    configs = parse_kv(args.config, "--config")
    admin = admin_client(args)
    topic = NewTopic(args.name, num_partitions=args.partitions, replication_factor=args.replication_factor, config=configs)
    await_result(admin.create_topics([topic], request_timeout=args.timeout)[args.name], args, f"creating topic {args.name!r}")
    if args.json:
        print_json({"name": args.name, "partitions": args.partitions, "configs": configs, "created": True})
    else:
        print(f"created topic {args.name} with {args.partitions} partitions" + (f" ({', '.join(f'{k}={v}' for k, v in configs.items())})" if configs else ""))
    return EXIT_OK


def topics_delete(args) -> int:
    admin = admin_client(args)
    topic_meta(fetch_metadata(admin, args), args.name)  # a clear message for unknown topics
    await_result(admin.delete_topics([args.name], request_timeout=args.timeout)[args.name], args, f"deleting topic {args.name!r}")
    if args.json:
        print_json({"name": args.name, "deleted": True})
    else:
        print(f"deleted topic {args.name}")
    return EXIT_OK


def topics_alter_config(args) -> int:
    from confluent_kafka.admin import ResourceType

    nothing_to_change(args)
    admin = admin_client(args)
    topic_meta(fetch_metadata(admin, args), args.name)
    return alter_config_overrides(args, admin, ResourceType.TOPIC, args.name, "topic",
                                  lambda: {k: c["value"] for k, c in _topic_configs(admin, args, args.name).items() if c["override"]})


def topics_restore(args) -> int:
    """A new topic holding TOPIC's records up to a time or an offset, made directly in the
    cluster's stores (segments are copied inside the object store, which the Kafka protocol
    cannot do): storage/topic_restore.py."""
    import asyncio

    from kafscale.broker import config as broker_config
    from kafscale.broker.topics import TopicError, check_name
    from kafscale.metadata.internal_topics import is_internal
    from kafscale.metadata.backends import open_kv
    from kafscale.metadata.kv import MetadataUnavailable
    from kafscale.metadata.store import MetadataStore
    from kafscale.storage.backends import open_store
    from kafscale.storage.failures import StorageError
    from kafscale.storage.objectstore import ObjectStoreError
    from kafscale.storage.topic_marker import iso
    from kafscale.storage.topic_restore import RestoreError, TopicRestore

    try:
        check_name(args.new_name)
    except TopicError as e:
        raise CliError(f"--as: {e}") from None
    if is_internal(args.new_name):
        raise CliError(f"--as: {args.new_name} is an internal topic name")
    to_time = parse_time(args.to_time) if args.to_time is not None else None
    cfg = broker_config.from_args(args)
    progress = Progress(args, f"restoring {args.name} as {args.new_name}: segments")

    async def run():
        metadata = MetadataStore(open_kv(cfg.metadata_url, cfg.data_dir, cfg.metadata_prefix))
        store = open_store(cfg.storage_url)
        try:
            return await TopicRestore(metadata, store, cfg.namespace, progress.update).run(
                args.name, args.new_name, to_time_ms=to_time, to_offset=args.to_offset
            )
        finally:
            await metadata.close()
            await store.close()

    try:
        done = asyncio.run(run())
    except RestoreError as e:
        raise CliError(str(e)) from None
    except (MetadataUnavailable, ObjectStoreError) as e:
        raise CliError(f"{e}; the restore did not finish (a retry removes what it left)", EXIT_UNREACHABLE) from None
    except StorageError as e:  # a source segment unreadable (corrupt, or not the committed one)
        raise CliError(f"{e}; the restore did not finish (a retry removes what it left)") from None
    finally:
        progress.finish()
    rows = [dataclasses.asdict(p) for p in done.partitions]
    point = {"to_time": iso(to_time)} if to_time is not None else {"to_offset": args.to_offset}
    said = f"to time {point['to_time']}" if to_time is not None else f"to offset {args.to_offset}"
    if args.json:
        print_json({"source": done.source, "topic": done.topic.name, "topic_id": done.topic.topic_id, **point, "partitions": rows})
        return EXIT_OK
    print(f"restored {done.source} as {done.topic.name} ({said}): "
          f"{len(rows)} partitions, {sum(r['segments_copied'] for r in rows)} segments copied inside the store "
          f"({sum(r['bytes_copied'] for r in rows)} bytes), {sum(r['segments_rewritten'] for r in rows)} rewritten")
    table(
        ["PARTITION", "LOG_START", "END", "HIGH_WATERMARK", "COPIED", "REWRITTEN", "ABORTED_TXNS"],
        [[r["partition"], r["log_start_offset"], r["end"], r["high_watermark"], r["segments_copied"], r["segments_rewritten"], r["aborted_transactions"]] for r in rows],
    )
    return EXIT_OK


def _add_restore(ts) -> None:
    from kafscale.broker import config as broker_config

    what = ("make a new topic holding TOPIC's records up to a time (--to-time) or an offset (--to-offset), "
            "at their offsets, directly in the cluster's stores (safe while brokers run); TOPIC is not changed")
    p = ts.add_parser("restore", help=what, description=what)
    p.set_defaults(func=run_command(topics_restore))
    p.add_argument("name", metavar="TOPIC")
    point = p.add_mutually_exclusive_group(required=True)
    point.add_argument("--to-time", metavar="ISO", help="keep the records before the first one stamped after this time "
                       "(ISO 8601, no zone means UTC, or epoch ms), as Kafka's ListOffsets finds it")
    point.add_argument("--to-offset", type=int, metavar="N", help="keep offsets below N in every partition")
    p.add_argument("--as", dest="new_name", required=True, metavar="NEW_TOPIC", help="the topic to create (must not exist)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    stores = p.add_argument_group("the cluster's stores, as for `kafscale broker`")
    broker_config.add_arguments(stores, only=("data_dir", "storage", "namespace", "metadata", "metadata_prefix"))


def add_commands(subparsers) -> None:
    ts = command_family(subparsers, "topics", "list, describe, create, delete topics; alter topic configs; restore a topic to a point in time")
    leaf(ts, "list", topics_list, "list topics with their partition counts")
    leaf(ts, "describe", topics_describe, "partitions, offsets and config overrides of a topic", subject="TOPIC")
    p = leaf(ts, "create", topics_create, "create a topic", subject="TOPIC")
    p.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    p.add_argument("--replication-factor", type=int, default=-1, help="accepted for compatibility (durability comes from the object store)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="topic config, repeatable (e.g. retention.ms=86400000)")
    leaf(ts, "delete", topics_delete, "delete a topic and its data", subject="TOPIC")
    p = leaf(ts, "alter-config", topics_alter_config, "set or remove topic config overrides", subject="TOPIC")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set an override, repeatable")
    p.add_argument("--delete", action="append", metavar="KEY", help="remove an override (back to the default), repeatable")
    _add_restore(ts)
