"""`kafscale topics list|describe|create|delete|alter-config`."""

from __future__ import annotations

from kafscale.cli.common import EXIT_OK, CliError, admin_client, await_result, command_family, fetch_metadata, leaf, list_offsets, parse_kv, print_json, table, topic_meta


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
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    sets = parse_kv(args.set, "--set")
    deletes = list(args.delete or ())
    if not sets and not deletes:
        raise CliError("nothing to change: give --set key=value and/or --delete key")
    admin = admin_client(args)
    topic_meta(fetch_metadata(admin, args), args.name)
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
    entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
    res = ConfigResource(ResourceType.TOPIC, args.name, incremental_configs=entries)
    await_result(admin.incremental_alter_configs([res], request_timeout=args.timeout)[res], args, f"altering configs of {args.name!r}")
    overrides = {k: c["value"] for k, c in _topic_configs(admin, args, args.name).items() if c["override"]}
    if args.json:
        print_json({"name": args.name, "set": sets, "deleted": deletes, "overrides": overrides})
    else:
        print(f"altered configs of topic {args.name}")
        print(f"Config overrides: {', '.join(f'{k}={v}' for k, v in overrides.items()) if overrides else '(none)'}")
    return EXIT_OK


def add_commands(subparsers) -> None:
    ts = command_family(subparsers, "topics", "list, describe, create, delete topics; alter topic configs")
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
