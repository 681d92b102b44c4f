"""`kafscale cluster describe`."""

from __future__ import annotations

from kafscale.cli.common import EXIT_OK, admin_client, command_family, fetch_metadata, leaf, print_json, table


def cluster_describe(args) -> int:
    md = fetch_metadata(admin_client(args), args, "describing the cluster")
    leaders: dict[int, int] = {}
    npart = 0
    for t in md.topics.values():
        for p in t.partitions.values():
            npart += 1
            leaders[p.leader] = leaders.get(p.leader, 0) + 1
    brokers = [{"id": b.id, "host": b.host, "port": b.port, "controller": b.id == md.controller_id, "leader_partitions": leaders.get(b.id, 0)}
               for b in sorted(md.brokers.values(), key=lambda b: b.id)]
    if args.json:
        print_json({"cluster_id": md.cluster_id, "controller": md.controller_id, "brokers": brokers, "topics": len(md.topics), "partitions": npart})
        return EXIT_OK
    print(f"Cluster id: {md.cluster_id}")
    print(f"Controller: {md.controller_id}")
    print(f"Topics: {len(md.topics)}   Partitions: {npart}")
    print()
    table(["BROKER", "HOST", "PORT", "LEADER PARTITIONS", "CONTROLLER"],
          [[b["id"], b["host"], b["port"], b["leader_partitions"], "yes" if b["controller"] else ""] for b in brokers])
    return EXIT_OK


def add_commands(subparsers) -> None:
    cs = command_family(subparsers, "cluster", "cluster id, controller and brokers")
    leaf(cs, "describe", cluster_describe, "cluster id, controller, brokers and partition leadership")
