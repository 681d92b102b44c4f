"""`kafscale groups list|describe|delete|reset-offsets|configs|alter-config`."""

from __future__ import annotations

import concurrent.futures

from kafscale.cli.common import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, CliError, admin_client, alter_config_overrides, await_result, command_family, fetch_metadata, kafka_error, leaf, list_offsets, note, nothing_to_change, parse_time, print_json, table, topic_meta
from kafscale.cli.console import add_metrics_options


def _state(state) -> str:
    """ConsumerGroupState enum -> Kafka's spelling (Stable, Empty, ...)."""
    name = getattr(state, "name", str(state))
    return "".join(p.title() for p in name.split("_"))


def _protocol(group) -> str:
    """The group's protocol, as clients name it (group.protocol): classic, or consumer (KIP-848)."""
    kind = getattr(getattr(group, "type", None), "name", "UNKNOWN")
    return "-" if kind == "UNKNOWN" else kind.lower()


def _request(args, host: str, port: int, api_key, version: int, **fields):
    """One request the CLI sends itself (kafscale.client.kafka_request), for what
    librdkafka's admin API lacks."""
    from kafscale.client import kafka_request
    from kafscale.protocol.codec import schema

    return kafka_request(args, host, port, api_key, version, schema(api_key, version, "request")(**fields))


def _share_groups(admin, args) -> tuple[list[tuple[str, str]], list[str]]:
    """([(group, state)], failures) of the share groups (KIP-932) every broker coordinates,
    from ListGroups v5 filtered on the share type: librdkafka's listing leaves them out."""
    from kafscale.client import UnsupportedSecurity
    from kafscale.errors import ErrorCode
    from kafscale.protocol.api_keys import ApiKey

    found: dict[str, str] = {}
    failures = []
    for b in fetch_metadata(admin, args).brokers.values():
        try:
            r = _request(args, b.host, b.port, ApiKey.LIST_GROUPS, 5, states_filter=(), types_filter=("share",))
        except UnsupportedSecurity as e:
            return [], [f"share groups not listed: the CLI cannot ask with {e}"]
        except Exception as e:  # noqa: BLE001 - the other brokers' groups still stand
            failures.append(f"broker {b.id} did not list its share groups: {e or type(e).__name__}")
            continue
        if r.error_code != ErrorCode.none:
            failures.append(f"broker {b.id} did not list its share groups: {ErrorCode(r.error_code).name.upper()}")
            continue
        found.update((g.group_id, g.group_state) for g in r.groups)
    return sorted(found.items()), failures


def groups_list(args) -> int:
    admin = admin_client(args)
    res = await_result(admin.list_consumer_groups(request_timeout=args.timeout), args, "listing groups")
    shares, share_failures = _share_groups(admin, args)
    listed = {g.group_id for g in res.valid}
    rows = sorted([(g.group_id, _state(g.state), "simple" if g.is_simple_consumer_group else "consumer", _protocol(g))
                   for g in res.valid] + [(g, state, "share", "share") for g, state in shares if g not in listed],
                  key=lambda r: r[0])
    for err in res.errors:
        note(f"warning: a broker did not list its groups: {err}")
    for failure in share_failures:  # a warning only: brokers before Kafka 4.0 have no ListGroups v5
        note(f"warning: {failure}")
    if args.json:
        print_json([{"group": g, "state": s, "type": t, "protocol": p} for g, s, t, p in rows])
    else:
        table(["GROUP", "STATE", "TYPE", "PROTOCOL"], [list(r) for r in rows])
    return EXIT_OK if not res.errors else EXIT_FAILED


def _describe_group(admin, args, group: str):
    return await_result(admin.describe_consumer_groups([group], request_timeout=args.timeout)[group], args, f"describing group {group!r}")


def _describe_group_or_share(admin, args, group: str):
    """(librdkafka's description, None), or (None, _share_group(...)) for a share group, which
    librdkafka's describe does not know (GROUP_ID_NOT_FOUND); its error stands otherwise."""
    try:
        desc = _describe_group(admin, args, group)
    except CliError:
        share = _share_group_if_any(admin, args, group)
        if share is None:
            raise
        return None, share
    # DescribeGroups answers a share group as Kafka 4 does: Dead, no members (and from v6
    # GROUP_ID_NOT_FOUND, above); ask ShareGroupDescribe before calling the group gone.
    if _state(desc.state) in ("Dead", "Unknown") and not desc.members:
        share = _share_group_if_any(admin, args, group)
        if share is not None:
            return None, share
    return desc, None


def _committed(admin, args, group: str, partitions=None) -> dict[tuple[str, int], int]:
    """(topic, partition) -> committed offset (only partitions with a commit)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    req = ConsumerGroupTopicPartitions(group, partitions) if partitions else ConsumerGroupTopicPartitions(group)
    res = await_result(admin.list_consumer_group_offsets([req], request_timeout=args.timeout)[group], args, f"fetching offsets of group {group!r}")
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0 and tp.error is None}


def _latest(admin, args, tps) -> dict[tuple[str, int], int]:
    from confluent_kafka.admin import OffsetSpec

    out = {}
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    for t, ps in by_topic.items():
        for p, (off, _ts) in list_offsets(admin, args, t, sorted(ps), OffsetSpec.latest()).items():
            out[(t, p)] = off
    return out


def _epochs(args, desc, group: str):
    """(group epoch, target assignment epoch, {member id: (member epoch, its protocol)}) of a
    consumer-protocol group from its coordinator's ConsumerGroupDescribe (librdkafka's
    describe does not give epochs); the protocol ("classic" for a classic member inside the
    group, KIP-848's migration) needs v1 (Kafka 4.0), else None. None, with a note why, when
    it cannot be asked."""
    from kafscale.client import UnsupportedSecurity
    from kafscale.errors import ErrorCode
    from kafscale.protocol.api_keys import ApiKey

    node = desc.coordinator
    try:
        for version in (1, 0):
            try:
                [g] = _request(args, node.host, node.port, ApiKey.CONSUMER_GROUP_DESCRIBE, version, group_ids=(group,),
                               include_authorized_operations=False).groups
                break
            except UnsupportedSecurity:
                raise
            except Exception:  # noqa: BLE001 - a broker before Kafka 4.0 has v0 only: ask that
                if version == 0:
                    raise
    except UnsupportedSecurity as e:
        note(f"member epochs not shown: the CLI cannot ask with {e}")
        return None
    except Exception as e:  # noqa: BLE001 - the rest of the description stands without them
        note(f"member epochs not shown: {e or type(e).__name__}")
        return None
    if g.error_code != ErrorCode.none:
        note(f"member epochs not shown: the coordinator answered {ErrorCode(g.error_code).name.upper()}")
        return None
    kinds = {0: "classic", 1: "consumer"}
    return g.group_epoch, g.assignment_epoch, {m.member_id: (m.member_epoch, kinds.get(getattr(m, "member_type", None)))
                                               for m in g.members}


def groups_describe(args) -> int:
    admin = admin_client(args)
    desc, share = _describe_group_or_share(admin, args, args.name)
    if share is not None:
        topics = {t.topic_name for t in share[2].topics}
        return _print_share_group(args, *share, live=_share_partitions_live(admin, args, args.name, topics))
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
    def partitions(assignment) -> list[str]:
        return [f"{tp.topic}-{tp.partition}" for tp in (getattr(assignment, "topic_partitions", None) or ())]

    # A consumer-protocol (KIP-848) member also has the target the broker reconciles it to.
    members = [{"member": m.member_id, "client": m.client_id, "host": m.host, "instance": m.group_instance_id,
                "assignment": partitions(m.assignment),
                **({"target_assignment": partitions(m.target_assignment)} if getattr(m, "target_assignment", None) else {})}
               for m in desc.members]
    protocol = _protocol(desc)
    epochs = _epochs(args, desc, args.name) if protocol == "consumer" else None
    header = {}
    if epochs is not None:
        header = {"group_epoch": epochs[0], "assignment_epoch": epochs[1]}
        for m in members:
            m["member_epoch"], m["member_protocol"] = epochs[2].get(m["member"], (None, None))
    if args.json:
        print_json({"group": args.name, "state": state, "protocol": protocol, **header, "assignor": desc.partition_assignor,
                    "coordinator": coordinator, "members": members, "partitions": rows, "total_lag": sum(r["lag"] or 0 for r in rows)})
        return EXIT_OK
    print(f"Group: {args.name}   State: {state}   Protocol: {protocol}   Members: {len(members)}   Assignor: {desc.partition_assignor or '-'}   Coordinator: {coordinator}")
    if epochs is not None:
        print(f"Group epoch: {epochs[0]}   Target assignment epoch: {epochs[1]}")
    pending = [(m["member"], m["target_assignment"]) for m in members if "target_assignment" in m and sorted(m["target_assignment"]) != sorted(m["assignment"])]
    for member, target in pending:
        print(f"Reconciling: member {member} moves to {', '.join(target) or 'nothing'}")
    print(f"Total lag: {sum(r['lag'] or 0 for r in rows)}")
    if protocol == "consumer" and members:
        # each member's epoch, what it holds and what the broker reconciles it to
        print()
        # (PROTOCOL: classic for a classic member inside the consumer group, during a migration)
        table(["MEMBER", "EPOCH", "PROTOCOL", "INSTANCE", "CLIENT", "HOST", "ASSIGNED", "TARGET"],
              [[m["member"], "-" if m.get("member_epoch") is None else m["member_epoch"], m.get("member_protocol") or "-",
                m["instance"] or "-", m["client"], m["host"], ",".join(m["assignment"]) or "-",
                ",".join(m.get("target_assignment", m["assignment"])) or "-"] for m in members])
    print()
    table(["TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER", "CLIENT", "HOST"],
          [[r["topic"], r["partition"], r["committed"], r["end"], r["lag"], r["member"] or "-", r["client"] or "-", r["host"] or "-"] for r in rows])
    return EXIT_OK


def groups_delete(args) -> int:
    admin = admin_client(args)
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
        raise kafka_error(e, f"deleting group {args.name!r}") from None
    if args.json:
        print_json({"group": args.name, "deleted": True})
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

    admin = admin_client(args)
    topic, wanted = _parse_topic_arg(args.topic)
    t = topic_meta(fetch_metadata(admin, args), topic)
    partitions = sorted(t.partitions)
    if wanted is not None:
        missing = [p for p in wanted if p not in t.partitions]
        if missing:
            raise CliError(f"topic {topic!r} has no partition {missing[0]} (it has {len(partitions)})")
        partitions = wanted

    # Kafka only lets offsets be reset while nobody consumes: members would overwrite them.
    desc, share = _describe_group_or_share(admin, args, args.name)
    members, state = (share[1].members, share[1].group_state) if share else (desc.members, _state(desc.state))
    if members or state not in ("Empty", "Dead", "Unknown"):
        raise CliError(f"group {args.name!r} is not empty (state {state}, {len(members)} members): stop its consumers before resetting offsets")

    earliest = list_offsets(admin, args, topic, partitions, OffsetSpec.earliest())
    latest = list_offsets(admin, args, topic, partitions, OffsetSpec.latest())
    if args.to_datetime is not None:
        at = list_offsets(admin, args, topic, partitions, OffsetSpec.for_timestamp(parse_time(args.to_datetime)))
    if share:
        current = {(t.topic_name, p.partition_index): p.start_offset for t in share[2].topics for p in t.partitions if p.start_offset >= 0}
    else:
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

    if args.execute and share:
        _alter_share_offsets(args, share[0], args.name, topic, {r["partition"]: r["new"] for r in plan})
    elif args.execute:
        req = ConsumerGroupTopicPartitions(args.name, [TopicPartition(topic, r["partition"], r["new"]) for r in plan])
        res = await_result(admin.alter_consumer_group_offsets([req], request_timeout=args.timeout)[args.name], args, f"resetting offsets of group {args.name!r}")
        failed = [tp for tp in res.topic_partitions if tp.error is not None]
        if failed:
            raise CliError(f"resetting {failed[0].topic}-{failed[0].partition}: {failed[0].error.str()}")
    if args.json:
        print_json({"group": args.name, "executed": bool(args.execute), "partitions": plan})
    else:
        table(["GROUP", "TOPIC", "PARTITION", "CURRENT", "NEW"], [[args.name, r["topic"], r["partition"], r["current"] if r["current"] is not None else "-", r["new"]] for r in plan])
    if args.execute:
        note(f"offsets of group {args.name} reset on {len(plan)} partitions")
    else:
        note("dry run: nothing changed; add --execute to apply this plan")
    return EXIT_OK


def _group_configs(admin, args, name: str) -> list[dict]:
    """The group's configs (GROUP config resources) with their sources, as the broker reports them."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    res = ConfigResource(ResourceType.GROUP, name)
    entries = await_result(admin.describe_configs([res], request_timeout=args.timeout)[res], args, f"describing configs of group {name!r}")
    group_source = ConfigSource.GROUP_CONFIG.value
    return [{"name": k, "value": e.value, "override": int(getattr(e.source, "value", e.source)) == group_source}
            for k, e in sorted(entries.items())]


def groups_configs(args) -> int:
    configs = _group_configs(admin_client(args), args, args.name)
    if args.json:
        print_json({"group": args.name, "configs": configs})
    else:
        table(["CONFIG", "VALUE", "SOURCE"], [[c["name"], c["value"], "group" if c["override"] else "default"] for c in configs])
    return EXIT_OK


def groups_alter_config(args) -> int:
    from confluent_kafka.admin import ResourceType

    nothing_to_change(args)
    admin = admin_client(args)
    return alter_config_overrides(args, admin, ResourceType.GROUP, args.name, "group",
                                  lambda: {c["name"]: c["value"] for c in _group_configs(admin, args, args.name) if c["override"]})


def add_commands(subparsers) -> None:
    gs = command_family(subparsers, "groups", "list, describe, delete consumer groups; reset their offsets; their configs")
    leaf(gs, "list", groups_list, "list consumer groups with their states")
    p = leaf(gs, "describe", groups_describe, "members, committed offsets and lag of a group (of a share group: start offsets, lag, in-flight records)", subject="GROUP")
    add_metrics_options(p, interval=False)  # a share group's in-flight records: its partitions' owners' /metrics
    leaf(gs, "delete", groups_delete, "delete an empty group and its committed offsets", subject="GROUP")
    p = leaf(gs, "reset-offsets", groups_reset_offsets, "move an empty group's committed offsets (dry run unless --execute)", subject="GROUP")
    p.add_argument("--topic", required=True, help="TOPIC, or TOPIC:P1,P2 for some partitions")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the oldest offset still kept")
    to.add_argument("--to-latest", action="store_true", help="the end of each partition (skip everything)")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped into the available range)")
    to.add_argument("--to-datetime", metavar="ISO", help="first offset at or after this time (ISO 8601; no zone means UTC)")
    p.add_argument("--execute", action="store_true", help="apply the plan (default: only print it)")
    leaf(gs, "configs", groups_configs, "a group's configs (consumer.*, share.*: Kafka's group configs) and where each comes from", subject="GROUP")
    p = leaf(gs, "alter-config", groups_alter_config, "set or remove a group's config overrides (the group need not exist yet)", subject="GROUP")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="set an override, e.g. share.auto.offset.reset=earliest; repeatable")
    p.add_argument("--delete", action="append", metavar="KEY", help="remove an override (back to the broker's value), repeatable")


def _share_group(admin, args, group: str):
    """(coordinator, ShareGroupDescribe's group, DescribeShareGroupOffsets v1's group) of a
    share group from its coordinator; None when no share group has that name."""
    from kafscale.errors import ErrorCode
    from kafscale.protocol.api_keys import ApiKey

    brokers = list(fetch_metadata(admin, args).brokers.values())
    if not brokers:
        return None
    r = _request(args, brokers[0].host, brokers[0].port, ApiKey.FIND_COORDINATOR, 6, key_type=0, coordinator_keys=(group,))
    [c] = r.coordinators
    if c.error_code != ErrorCode.none:
        raise CliError(f"no coordinator for group {group!r}: {ErrorCode(c.error_code).name.upper()}")
    [g] = _request(args, c.host, c.port, ApiKey.SHARE_GROUP_DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False).groups
    if g.error_code == ErrorCode.group_id_not_found:
        return None
    if g.error_code != ErrorCode.none:
        raise CliError(f"describing share group {group!r}: {ErrorCode(g.error_code).name.upper()} {g.error_message or ''}".rstrip())
    from kafscale.protocol.build import nested
    from kafscale.protocol.codec import schema

    group_req = nested(schema(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, "request"), "DescribeShareGroupOffsetsRequestGroup")
    [offsets] = _request(args, c.host, c.port, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1,
                         groups=(group_req(group_id=group, topics=None),)).groups
    if offsets.error_code != ErrorCode.none:
        raise CliError(f"share group offsets of {group!r}: {ErrorCode(offsets.error_code).name.upper()} {offsets.error_message or ''}".rstrip())
    return c, g, offsets


def _alter_share_offsets(args, coordinator, group: str, topic: str, offsets: dict[int, int]) -> None:
    """AlterShareGroupOffsets (91) at the group's coordinator: the share partitions start there."""
    from kafscale.errors import ErrorCode
    from kafscale.protocol.api_keys import ApiKey
    from kafscale.protocol.build import nested
    from kafscale.protocol.codec import schema

    cls = schema(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, "request")
    parts = tuple(nested(cls, "AlterShareGroupOffsetsRequestPartition")(partition_index=p, start_offset=o) for p, o in offsets.items())
    r = _request(args, coordinator.host, coordinator.port, ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, group_id=group,
                 topics=(nested(cls, "AlterShareGroupOffsetsRequestTopic")(topic_name=topic, partitions=parts),))
    if r.error_code != ErrorCode.none:
        raise CliError(f"resetting offsets of share group {group!r}: {ErrorCode(r.error_code).name.upper()} {r.error_message or ''}".rstrip())
    for t in r.responses:
        for p in t.partitions:
            if p.error_code != ErrorCode.none:
                raise CliError(f"resetting {t.topic_name}-{p.partition_index}: {ErrorCode(p.error_code).name.upper()} {p.error_message or ''}".rstrip())


def _share_group_if_any(admin, args, group: str):
    """_share_group, or None also when asking fails (the caller's own error then stands)."""
    try:
        return _share_group(admin, args, group)
    except Exception:  # noqa: BLE001
        return None


def _share_partitions_live(admin, args, group: str, topics: set[str]) -> dict[tuple[str, int], tuple[int, int]] | None:
    """(topic, partition) -> (in-flight, acquired) records of a share group's partitions, from
    the /metrics of the brokers owning them (kafscale_share_partition_*: only the owner knows
    which records are acquired); None when no broker's /metrics could be read."""
    import asyncio
    import logging

    from kafscale.cli.console import metrics_reader

    reader = metrics_reader(args)
    brokers = [{"id": b.id, "host": b.host, "port": b.port} for b in fetch_metadata(admin, args).brokers.values()]
    quiet = logging.getLogger("kafscale.console")  # an endpoint not answering is the note below, not a warning per broker
    level = quiet.level

    async def scrape():
        try:
            return await reader.scrape(brokers)
        finally:
            await reader.close()

    quiet.setLevel(logging.ERROR)
    try:
        stats = asyncio.run(scrape())
    finally:
        quiet.setLevel(level)
    if not any(st.up for st in stats.values()):
        return None
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for topic in topics:
        flight = reader.per_partition("kafscale_share_partition_in_flight_records", topic, group=group)
        held = reader.per_partition("kafscale_share_partition_acquired_records", topic, group=group)
        out.update({(topic, p): (int(n), int(held.get(p, 0))) for p, n in flight.items()})
    return out


def _print_share_group(args, c, g, offsets, live=None) -> int:
    """A share group as Kafka's kafka-share-groups.sh --describe shows it: members with their
    assignments, and per partition the share-partition start offset and lag (-1: unknown),
    and the records in flight and acquired now (`live`, from the owners' /metrics: None
    unknown; a partition no owner reports has no share state loaded, nothing acquired)."""
    coordinator = c.node_id
    members = [{"member": m.member_id, "epoch": m.member_epoch, "client": m.client_id, "host": m.client_host, "rack": m.rack_id,
                "subscribed": list(m.subscribed_topic_names),
                "assignment": [f"{t.topic_name}-{p}" for t in m.assignment.topic_partitions for p in t.partitions]}
               for m in g.members]
    rows = sorted(({"topic": t.topic_name, "partition": p.partition_index, "leader_epoch": p.leader_epoch,
                    "start_offset": p.start_offset, "lag": p.lag} for t in offsets.topics for p in t.partitions),
                  key=lambda r: (r["topic"], r["partition"]))
    for r in rows:
        flight, held = (None, None) if live is None else live.get((r["topic"], r["partition"]), (None, 0))
        r.update(in_flight=flight, acquired=held)
    if args.json:
        print_json({"group": g.group_id, "state": g.group_state, "protocol": "share", "group_epoch": g.group_epoch,
                    "assignment_epoch": g.assignment_epoch, "assignor": g.assignor_name, "coordinator": coordinator,
                    "members": members, "partitions": rows})
        return EXIT_OK
    print(f"Group: {g.group_id}   State: {g.group_state}   Protocol: share   Members: {len(members)}   Assignor: {g.assignor_name or '-'}   Coordinator: {coordinator}")
    print(f"Group epoch: {g.group_epoch}   Target assignment epoch: {g.assignment_epoch}")
    if members:
        print()
        table(["MEMBER", "EPOCH", "CLIENT", "HOST", "ASSIGNED"],
              [[m["member"], m["epoch"], m["client"], m["host"], ",".join(m["assignment"]) or "-"] for m in members])
    print()
    def shown(n):
        return "-" if n is None or n < 0 else n

    table(["TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG", "IN-FLIGHT", "ACQUIRED"],
          [[r["topic"], r["partition"], r["leader_epoch"], r["start_offset"], shown(r["lag"]), shown(r["in_flight"]),
            shown(r["acquired"])] for r in rows])
    if live is None:
        note("in-flight and acquired records not shown: no broker's /metrics answered (--metrics, --metrics-port-offset)")
    return EXIT_OK
