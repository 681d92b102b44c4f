"""confluent-kafka group members in threads for group tests, with a ledger of who holds
and read what: a partition given to a member while another still holds it is recorded as a
violation (from the members' assignment callbacks), and every record read as (partition,
offset, member). Members use either group protocol (`group.protocol` classic or consumer)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException


class Ledger:
    """What every member holds and read, shared by the member threads."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self.lock = threading.Lock()
        self.owner: dict[int, str] = {}
        self.violations: list[str] = []
        self.read: list[tuple[int, int, str]] = []  # (partition, offset, member)
        self.revoked: dict[str, list[int]] = {}
        self.errors: list[str] = []
        # (len(read) once confirmed, partition, committed offset) of each commit answered without error
        self.commits: list[tuple[int, int, int]] = []
        # reads of a partition the member did not hold by its callbacks: (partition, offset, member, holder)
        self.unheld_reads: list[tuple[int, int, str, str | None]] = []
        self.events: list[tuple[float, str, str, list[int]]] = []  # (time, member, callback, partitions): diagnostics

    def assigned(self, name: str, partitions) -> None:
        with self.lock:
            self.events.append((time.time(), name, "assign", sorted(p.partition for p in partitions)))
            for p in partitions:
                holder = self.owner.get(p.partition)
                if holder is not None and holder != name:
                    self.violations.append(f"partition {p.partition} given to {name} while {holder} holds it")
                self.owner[p.partition] = name

    def released(self, name: str, partitions, how: str = "revoke") -> None:
        with self.lock:
            self.events.append((time.time(), name, how, sorted(p.partition for p in partitions)))
            for p in partitions:
                if self.owner.get(p.partition) == name:
                    del self.owner[p.partition]
                self.revoked.setdefault(name, []).append(p.partition)

    def record_reads(self, name: str, msgs) -> None:
        with self.lock:
            for m in msgs:
                self.read.append((m.partition(), m.offset(), name))
                if self.owner.get(m.partition()) != name:
                    self.unheld_reads.append((m.partition(), m.offset(), name, self.owner.get(m.partition())))

    def committed(self, partitions) -> None:
        with self.lock:
            self.commits += [(len(self.read), tp.partition, tp.offset) for tp in partitions or ()
                             if tp.error is None and tp.offset >= 0]

    def read_after_commit(self, since: int = 0) -> list[tuple[int, int, str, int]]:
        """Records read again after a commit past them had been confirmed (among the reads
        from number `since` on): (partition, offset, member, committed offset then)."""
        with self.lock:
            commits, reads = sorted(self.commits), list(self.read)
        out, done, i = [], {}, 0
        for n, (p, off, name) in enumerate(reads):
            while i < len(commits) and commits[i][0] <= n:
                _, cp, co = commits[i]
                done[cp] = max(done.get(cp, 0), co)
                i += 1
            if n >= since and off < done.get(p, 0):
                out.append((p, off, name, done[p]))
        return out

    def split(self) -> list[int]:
        """How many partitions each member holds, sorted, once every partition is held."""
        with self.lock:
            counts: dict[str, int] = {}
            for name in self.owner.values():
                counts[name] = counts.get(name, 0) + 1
            return sorted(counts.values()) if len(self.owner) == self.partitions else []

    def holdings(self, name: str) -> set[int]:
        with self.lock:
            return {p for p, n in self.owner.items() if n == name}

    def offsets_read(self) -> dict[tuple[int, int], list[str]]:
        """(partition, offset) -> the members that read it."""
        with self.lock:
            seen: dict[tuple[int, int], list[str]] = {}
            for p, off, name in self.read:
                seen.setdefault((p, off), []).append(name)
            return seen


class Member(threading.Thread):
    """A consumer reading and committing after each batch until `leave()`."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, ledger: Ledger, instance_id: str | None = None,
                 protocol: str = "consumer", extra: dict | None = None):
        super().__init__(name=name, daemon=True)
        self.member, self.ledger, self.topic = name, ledger, topic
        self.stopping = threading.Event()
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
                "enable.auto.commit": False, "auto.offset.reset": "earliest", "client.id": name, **(extra or {})}
        if instance_id is not None:
            conf["group.instance.id"] = instance_id
        self.consumer = Consumer(conf)

    def run(self) -> None:
        c, ledger = self.consumer, self.ledger
        c.subscribe([self.topic], on_assign=lambda _c, ps: ledger.assigned(self.member, ps),
                    on_revoke=lambda _c, ps: ledger.released(self.member, ps),
                    on_lost=lambda _c, ps: ledger.released(self.member, ps, "lost"))
        try:
            while not self.stopping.is_set():
                msgs = c.consume(100, 0.2)
                got = [m for m in msgs if m.error() is None]
                ledger.errors += [f"{self.member}: {m.error()}" for m in msgs if m.error() is not None]
                ledger.record_reads(self.member, got)
                if got:
                    self.commit()
        finally:
            c.close()  # leaves the group

    def commit(self) -> None:
        # Synchronously, before the next consume (where revocations run): whoever reads a
        # partition next starts after these records. A commit racing a heartbeat that
        # moved the member's epoch gets STALE_MEMBER_EPOCH; it is retried.
        last = None
        for _ in range(50):
            try:
                self.ledger.committed(self.consumer.commit(asynchronous=False))
                return
            except KafkaException as e:
                if e.args[0].code() == KafkaError._NO_OFFSET:
                    return
                last = e
        self.ledger.errors.append(f"{self.member}: commit failed: {last}")

    def leave(self) -> None:
        self.stopping.set()
        self.join(30)
