"""An acknowledged produce survives power loss on the embedded default: the syscalls of one
flush, traced with strace on a real broker process.

kill -9 tests cannot tell an fsynced file from one still in the page cache (the kernel keeps
both), so this test looks at the fsync calls themselves. Between reading a Produce request
(acks=all) and sending its answer, the broker must have, in this order:

1. fsynced the object's temp file, then linked or renamed it to its name (the partition's segment, or
   with write-ahead objects the flush's object holding every partition's data);
2. fsynced the object's directory (the new name is durable), and the parent of every
   directory it created (the first flush of a partition makes its directory);
3. committed the segment to SQLite with the WAL fsynced (synchronous=FULL).

Both write paths are traced, each named by its flag, whatever the default.
A speed-up that drops or reorders one of these fails here. strace is a Debian package
`make test` installs; the test is skipped only where strace is missing or cannot attach.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafscale.protocol import records
from kafscale.storage import write_ahead as write_ahead_objects
from tests.support.raw import RawClient, error_code
from tests.support.wait import wait_until

TRACED = "fsync,fdatasync,link,linkat,rename,renameat,renameat2,mkdir,mkdirat,recvfrom,read,sendto,sendmsg,write,writev"
LINE = re.compile(r"^(\d+\.\d+) (\w+)\((.*)\) = (-?\d+)(?: .*)? <(\d+\.\d+)>$")
FD = re.compile(r"^\d+<(TCP:\[[^\]]*\]|[^>]*)>")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass
class Call:
    start: float
    end: float
    name: str
    fd_path: str | None  # the first argument's path or socket (strace -yy)
    paths: list[str]  # the string arguments (link, rename, mkdir), relative ones joined to their directory's descriptor

    def named(self) -> tuple[str, str] | None:
        """(from, to) of a link or rename, as full paths."""
        return (self.paths[0], self.paths[-1]) if self.name in NAMING and len(self.paths) >= 2 else None


NAMING = ("link", "linkat", "rename", "renameat", "renameat2")
DIR_ARG = re.compile(r'(?:^|, )(\d+<[^>]*>|AT_FDCWD), "((?:[^"\\]|\\.)*)"')


def read_trace(prefix: Path) -> list[Call]:
    """Successful calls of every traced thread (strace -ff: a file per thread, so no call is
    split into 'unfinished' and 'resumed'), by start time."""
    calls = []
    for f in prefix.parent.glob(prefix.name + ".*"):
        for line in f.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if m is None or int(m.group(4)) < 0:
                continue
            start, name, args, dur = float(m.group(1)), m.group(2), m.group(3), float(m.group(5))
            fd = FD.match(args)
            paths = STRING.findall(args)
            if name in ("linkat", "renameat", "renameat2"):  # (dirfd, name) pairs: names relative to a descriptor made whole
                paths = [p if p.startswith("/") or d == "AT_FDCWD" else os.path.join(FD.match(d).group(1), p) for d, p in DIR_ARG.findall(args)]
            calls.append(Call(start, start + dur, name, fd.group(1) if fd else None, paths))
    return sorted(calls, key=lambda c: c.start)


def start_strace(pid: int, prefix: Path) -> subprocess.Popen:
    tracer = subprocess.Popen(
        ["strace", "-f", "-ff", "-ttt", "-T", "-yy", "-e", f"trace={TRACED}", "-o", str(prefix), "-p", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    err = []
    while True:  # strace says "Process N attached" per thread, or why it cannot attach
        line = tracer.stderr.readline()
        if not line:
            tracer.wait(10)
            pytest.skip(f"strace cannot attach to the broker here: {''.join(err).strip() or tracer.returncode}")
        err.append(line)
        if "attached" in line:
            return tracer


def stop_strace(tracer: subprocess.Popen) -> None:
    tracer.send_signal(signal.SIGINT)  # detaches and writes out every file
    tracer.wait(30)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (make system-deps installs it)")
@pytest.mark.parametrize("write_ahead", [False, True], ids=["segments", "write-ahead"])
def test_acks_all_answer_follows_file_dir_and_sqlite_fsyncs(broker_factory, topic_name, tmp_path, write_ahead):
    b = broker_factory(extra_args=["--write-ahead-objects", str(write_ahead).lower()])
    with RawClient(b.bootstrap) as probe:
        wait_until(lambda: probe.metadata([topic_name]).topics[0].partitions[0].leader_id >= 0, 30, "the topic's leader")
        tracer = start_strace(b.proc.pid, tmp_path / "trace")
        try:
            probe.metadata([topic_name])  # a round trip with the broker traced: strace is attached
            with RawClient(b.bootstrap) as client:
                port = client.sock.getsockname()[1]
                now_ms = int(time.time() * 1000)
                part = client.produce(topic_name, 0, records.build_batch([(b"k", b"durable")], timestamp=now_ms), acks=-1)
                assert error_code(part.error_code) == 0 and part.base_offset == 0
        finally:
            stop_strace(tracer)
    calls = read_trace(tmp_path / "trace")

    # The window: from reading the Produce request to sending its answer, on its connection.
    conn = f"->127.0.0.1:{port}]"
    on_conn = [c for c in calls if c.fd_path and c.fd_path.endswith(conn)]
    received = next(c for c in on_conn if c.name in ("recvfrom", "read"))
    answered = next((c for c in on_conn if c.name in ("sendto", "sendmsg", "write", "writev")), None)
    assert answered is not None, "the broker's answer is not in the trace"
    window = [c for c in calls if received.start <= c.start and c.end <= answered.start]

    # 1. the object's temp file fsynced, then linked to its name: the partition's first
    #    segment, or a write-ahead object (one per flush, for every partition)
    if write_ahead:
        object_name = re.compile("/" + re.escape(write_ahead_objects.wal_prefix("default")) + r"\d{13}-0-[0-9a-z]+-\d{10}\.wal$")
    else:
        object_name = re.compile(re.escape(f"/{topic_name}/0/segment-{0:020d}.kfs") + "$")
    link = next((c for c in window if c.named() and object_name.search(c.named()[1])), None)
    assert link is not None, f"no link or rename to {object_name.pattern} before the answer: {[(c.name, c.fd_path, c.paths) for c in window]}"
    temp = link.named()[0]
    assert os.path.basename(temp).startswith(".tmp-"), link
    synced = [c for c in window if c.name in ("fsync", "fdatasync") and c.fd_path == temp]
    assert synced and synced[0].end <= link.start, f"{temp} is not fsynced before it is linked to its name"

    # 2. its directory fsynced after the link (and after every other name it got there);
    #    every directory created in the data dir: its parent fsynced after the mkdir (the
    #    interpreter's bytecode cache, elsewhere, makes directories of its own meanwhile)
    part_dir = os.path.dirname(link.paths[-1])
    dir_syncs = [c for c in window if c.name == "fsync" and c.fd_path == part_dir and c.start >= link.end]
    assert dir_syncs, f"the directory {part_dir} is not fsynced after the segment is linked, before the answer"
    dir_synced = dir_syncs[0]
    data_dir = os.path.realpath(b.data_dir)
    for made in (c for c in window if c.name in ("mkdir", "mkdirat") and c.paths[-1].startswith(data_dir + "/")):
        parent = os.path.dirname(made.paths[-1])
        assert any(c.name == "fsync" and c.fd_path == parent and c.start >= made.end for c in window), f"{made.paths[-1]} was created but {parent} not fsynced"

    # 3. the SQLite commit durable: its WAL fsynced after the directory, before the answer
    wal = [c for c in window if c.name in ("fsync", "fdatasync") and c.fd_path and c.fd_path.endswith("metadata.sqlite-wal")]
    assert wal, "SQLite's WAL is not fsynced before the answer (synchronous=FULL)"
    assert wal[-1].start >= dir_synced.end, "the segment is committed to SQLite before its directory entry is durable"

    # And what was acknowledged is there after kill -9.
    b.kill9()
    b.start()
    with RawClient(b.bootstrap) as client:
        got = wait_until(lambda: client.fetch(topic_name, 0, 0).records, 30, "the acknowledged record after kill -9")
        assert b"durable" in bytes(got)
