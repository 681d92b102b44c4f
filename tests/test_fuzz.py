"""A seeded fuzz run against a broker subprocess.

Seed frames: well-formed requests of every API and version the broker serves, built from
kio's request schemas with plausible values (tests/support/samples.py). Each is mutated
(bit flips, length / count fields bumped to huge values, varint bombs, truncations,
inserted and overwritten bytes) and sent, in batches spread over many connections. After
every batch: the process is alive, a well-formed Metadata request on a connection of its
own is answered within 2 s, and the broker's log has no traceback (every malformed
request gets an answer or a closed connection with one log line).

Before the request validator, the first batches killed the process (SIGABRT in kio's
native decoder).
"""

from __future__ import annotations

import random
import socket
import struct
import time

import pytest

from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient
from tests.support.samples import sample_payload, served_versions

SEED = 20_251_124
MUTATIONS = 3000
BATCH = 50
CONNECTIONS_PER_BATCH = 50  # one frame each: a malformed frame closes its connection
ANSWER_WITHIN_S = 2.0

HUGE_LENGTHS = (
    b"\xff\xff\xff\xff\x0f",  # uvarint 2^32-1
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a 10-byte varint
    b"\x80\x80\x80\x80\x08",  # uvarint 2^31
    b"\x7f\xff\xff\xff",  # int32 max
    b"\xff\xff\xff\xfe",  # int32 -2
    b"\x80\x00\x00\x00",  # int32 min
    b"\x7f\xff",  # int16 max
    b"\xff\xfe",  # int16 -2
    b"\xff\xff",  # -1: null
    b"\x00",  # compact null
)


def header_length(payload: bytes) -> int:
    (client_id_len,) = struct.unpack_from(">h", payload, 8)
    return 10 + max(client_id_len, 0)


def mutate(payload: bytes, rng: random.Random) -> bytes:
    b = bytearray(payload)
    # mostly in the body (past the header), where the decoders work hardest
    lo = header_length(payload) if rng.random() < 0.85 else 0
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if len(b) <= max(lo, 10):
            break
        pos = rng.randrange(lo, len(b))
        kind = rng.randrange(7)
        if kind == 0:  # bit flips
            b[pos] ^= 1 << rng.randrange(8)
        elif kind in (1, 2):  # a length or count bumped to something huge, null or negative
            v = rng.choice(HUGE_LENGTHS)
            b[pos : pos + (len(v) if kind == 1 else 0)] = v
        elif kind == 3:  # truncation
            del b[max(pos, 10) :]
        elif kind == 4:  # inserted bytes
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif kind == 5:  # an interesting byte
            b[pos] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF))
        else:  # a deleted range
            del b[pos : pos + rng.randrange(1, 6)]
    return bytes(b)


@pytest.fixture(scope="module")
def fuzz_broker():
    b = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0", "--merge-interval-ms", "0"]).start()
    yield b
    b.stop()


def metadata_round_trip(b: BrokerProcess, client: RawClient) -> float:
    started = time.monotonic()
    md = client.metadata([], version=12)
    assert len(md.brokers) == 1
    return time.monotonic() - started


def drain(conns: list[socket.socket], seconds: float) -> int:
    """Read whatever the broker answers for a moment; the count of bytes read."""
    got = 0
    deadline = time.monotonic() + seconds
    for s in conns:
        s.settimeout(max(0.001, min(0.05, deadline - time.monotonic())))
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
        except (socket.timeout, OSError):
            pass
    return got


def test_fuzzed_requests_never_kill_the_broker(fuzz_broker):
    b = fuzz_broker
    rng = random.Random(SEED)
    apis = served_versions()
    seeds = [sample_payload(key, version, rng, correlation_id=i + 1) for i, (key, version) in enumerate(apis) for _ in range(2)]
    frames = [mutate(rng.choice(seeds), rng) for _ in range(MUTATIONS)]
    bystander = RawClient(b.bootstrap, timeout=ANSWER_WITHIN_S)
    slowest, answered_bytes = 0.0, 0
    try:
        for start in range(0, len(frames), BATCH):
            batch = frames[start : start + BATCH]
            conns = [socket.create_connection(("127.0.0.1", b.port), timeout=5) for _ in range(CONNECTIONS_PER_BATCH)]
            try:
                for i, payload in enumerate(batch):
                    try:
                        conns[i % len(conns)].sendall(struct.pack(">i", len(payload)) + payload)
                    except OSError:
                        pass  # the broker already closed this connection over an earlier frame
                answered_bytes += drain(conns, 0.3)
                where = f"after batch {start // BATCH + 1} (frames {start}-{start + len(batch) - 1})"
                assert b.proc.poll() is None, f"broker died {where} with {b.proc.returncode}:\n{b.log_text()[-3000:]}"
                try:
                    with RawClient(b.bootstrap, timeout=ANSWER_WITHIN_S) as fresh:
                        slowest = max(slowest, metadata_round_trip(b, fresh))
                    slowest = max(slowest, metadata_round_trip(b, bystander))
                except (OSError, TimeoutError) as e:
                    pytest.fail(f"Metadata not answered within {ANSWER_WITHIN_S}s {where}: {e!r}\n{b.log_text()[-3000:]}")
                assert slowest < ANSWER_WITHIN_S, f"Metadata took {slowest:.2f}s {where}"
                log = b.log_text()
                assert "Traceback" not in log, f"traceback in the broker log {where}:\n{log[log.index('Traceback') - 400:][:3000]}"
            finally:
                for s in conns:
                    s.close()
    finally:
        bystander.close()
    log = b.log_text()
    print(f"\n{len(frames)} fuzzed frames over {len(apis)} api versions: slowest Metadata {slowest * 1000:.0f} ms, "
          f"{answered_bytes} response bytes, {log.count('closing connection')} connections closed over bad input")
    assert log.count("closing connection") > 100  # most mutations are malformed and said so
