"""What connections may cost the broker: frames that declare more than they send, many idle
connections, connection limits, the idle timeout and the request memory budget.

Each test runs a private broker subprocess and measures it from outside: its resident
memory (/proc/<pid>/status VmRSS) and what it answers over TCP.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest

from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.raw import ConnectionClosed, RawClient, decode_response, encode_request, error_code, req
from tests.support.wait import wait_until

MiB = 1024 * 1024
PRODUCE, API_VERSIONS = 0, 18


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def api_versions(c: RawClient) -> None:
    r = c.request(API_VERSIONS, 3, req(API_VERSIONS, 3, client_software_name="limits", client_software_version="1"))
    assert error_code(r.error_code) == 0


def metadata_answered_within(bootstrap: str, seconds: float) -> None:
    started = time.monotonic()
    with RawClient(bootstrap, timeout=seconds) as c:
        r = c.metadata(None)
    assert r.brokers, r
    assert time.monotonic() - started < seconds


def settled_rss(pid: int, timeout: float = 10.0) -> int:
    """RSS once it stops moving (two readings 0.5 s apart within 1 MiB)."""
    deadline = time.monotonic() + timeout
    last = rss_bytes(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_bytes(pid)
        if abs(now - last) < MiB:
            return now
        last = now
    return last


def produce_frame(topic: str, values: list[bytes], correlation_id: int) -> bytes:
    """A Produce v9 frame with one batch per value (each under the 1 MiB max.message.bytes)."""
    batch = b"".join(build_batch([(b"k", v)], timestamp=int(time.time() * 1000)) for v in values)
    p = req(PRODUCE, 9, "PartitionProduceData", index=0, records=batch)
    t = req(PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(p,))
    body = req(PRODUCE, 9, transactional_id=None, acks=-1, timeout=10_000, topic_data=(t,))
    payload = encode_request(PRODUCE, 9, body, correlation_id)
    return struct.pack(">i", len(payload)) + payload


def produce_response(c: RawClient, correlation_id: int):
    got, resp = decode_response(PRODUCE, 9, c.recv_frame())
    assert got == correlation_id
    return resp.responses[0].partition_responses[0]


def read_values(bootstrap: str, topic: str) -> list[bytes]:
    with RawClient(bootstrap) as c:
        out, offset = [], 0
        while True:
            p = c.fetch(topic, 0, offset, max_wait_ms=0)
            assert error_code(p.error_code) == 0, p
            if not p.records:
                return out
            for pos, h in iter_batches(p.records):
                out += [r.value for r in decode_records(p.records, pos, h)]
                offset = h.last_offset + 1


def assert_no_traceback(b) -> None:
    assert "Traceback" not in b.log_text(), b.log_text()[-3000:]


# ---------------------------------------------------------------------------------------
# frame buffers grow as the bytes arrive


def test_declared_huge_frames_take_memory_only_as_bytes_arrive(broker_factory):
    """20 connections each declare a 99 MiB frame and send 100 bytes of it: the broker must
    not allocate the declared size (it did: 20 x 99 MiB took RSS to 2 GB). The request
    memory budget is off here, so this checks the frame buffers themselves."""
    b = broker_factory(extra_args=["--max-request-memory", "0"])
    metadata_answered_within(b.bootstrap, 5)
    before = settled_rss(b.proc.pid)
    socks = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", b.port))
            s.sendall(struct.pack(">i", 99 * MiB) + struct.pack(">hhih", 0, 9, 1, 4) + b"huge" + b"\x00" * 88)
            socks.append(s)
        metadata_answered_within(b.bootstrap, 2)  # served after the 20 were read
        growth = settled_rss(b.proc.pid) - before
        assert growth < 100 * MiB, f"RSS grew by {growth / MiB:.0f} MiB for 20 declared 99 MiB frames"
    finally:
        for s in socks:
            s.close()
    metadata_answered_within(b.bootstrap, 2)
    assert b.proc.poll() is None
    assert_no_traceback(b)


def test_large_produce_sent_in_pieces_is_stored_whole(broker_factory, topic_name):
    """A 5 MiB Produce frame (past the first buffer step) trickled in 64 KiB pieces: the frame
    buffer grows to fit, and the record reads back byte for byte."""
    b = broker_factory(extra_args=["--max-frame-bytes", str(8 * MiB)])
    values = [os.urandom(900 * 1024) for _ in range(6)]
    with RawClient(b.bootstrap) as c:
        assert error_code(c.metadata([topic_name]).topics[0].error_code) == 0
        frame = produce_frame(topic_name, values, correlation_id=7)
        assert len(frame) > 5 * MiB
        for i in range(0, len(frame), 64 * 1024):
            c.send_raw(frame[i : i + 64 * 1024])
        p = produce_response(c, 7)
        assert (error_code(p.error_code), p.base_offset) == (0, 0)
    assert read_values(b.bootstrap, topic_name) == values


# ---------------------------------------------------------------------------------------
# idle connections


def test_idle_connections_cost_little_and_give_it_back(broker_factory):
    """2,000 connections that each made one request and went quiet (they cost 256 KiB of
    read buffer each: 500 MB). Once quiet their buffers are given back: bounded to 25 MiB
    (about 12 KiB a connection, kernel socket state not counted), and after they close
    the broker is back within 20 MiB of where it started."""
    b = broker_factory()
    metadata_answered_within(b.bootstrap, 5)
    before = settled_rss(b.proc.pid)
    clients = []
    try:
        for _ in range(2000):
            c = RawClient(b.bootstrap)
            clients.append(c)
            api_versions(c)
        # Buffers of quiet connections go back after about 2 s (READ_BUFFER_RELEASE_S).
        peak = rss_bytes(b.proc.pid)
        quiet = wait_until(lambda: (r := rss_bytes(b.proc.pid)) - before < 25 * MiB and r, 20,
                           "the idle connections' memory to go down")
        metadata_answered_within(b.bootstrap, 2)
    finally:
        for c in clients:
            c.close()
    wait_until(lambda: rss_bytes(b.proc.pid) - before < 20 * MiB, 20, "the memory to be given back after closing")
    after = rss_bytes(b.proc.pid)
    print(f"RSS before {before / MiB:.0f} MiB, 2000 connections {peak / MiB:.0f} MiB -> quiet {quiet / MiB:.0f} MiB, closed {after / MiB:.0f} MiB")
    metadata_answered_within(b.bootstrap, 2)


# ---------------------------------------------------------------------------------------
# connection limits and the idle timeout


def refused(c: RawClient) -> bool:
    """The broker closed this freshly accepted connection without answering."""
    return c.wait_closed(5)


def test_max_connections_refuses_the_excess_and_serves_the_rest(broker_factory):
    b = broker_factory(extra_args=["--max-connections", "5"])
    admitted = [RawClient(b.bootstrap) for _ in range(5)]
    try:
        for c in admitted:
            api_versions(c)
        with RawClient(b.bootstrap) as extra:
            assert refused(extra)
        for c in admitted:  # the five keep being served
            api_versions(c)
        assert b.log_text().count("(--max-connections)") == 1
        admitted.pop().close()

        def admitted_again():
            with RawClient(b.bootstrap) as c:
                try:
                    api_versions(c)
                    return True
                except (ConnectionClosed, OSError):
                    return False

        wait_until(admitted_again, 5, "a connection to be accepted after one closed")
    finally:
        for c in admitted:
            c.close()
    assert_no_traceback(b)


def connect_from(address: str, port: int) -> RawClient:
    c = RawClient.__new__(RawClient)
    c.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))
    c.timeout, c.client_id, c._corr = 10, "limits", 0
    return c


def test_max_connections_per_ip_counts_each_address(broker_factory):
    b = broker_factory(extra_args=["--max-connections-per-ip", "3"])
    first = [connect_from("127.0.0.1", b.port) for _ in range(3)]
    other = [connect_from("127.0.0.2", b.port) for _ in range(3)]  # another address: its own 3
    try:
        for c in first + other:
            api_versions(c)
        extra = connect_from("127.0.0.1", b.port)
        assert refused(extra)
        extra.close()
        extra = connect_from("127.0.0.2", b.port)
        assert refused(extra)
        extra.close()
        for c in first + other:
            api_versions(c)
        assert b.log_text().count("(--max-connections-per-ip)") == 2
    finally:
        for c in first + other:
            c.close()
    assert_no_traceback(b)


def test_idle_timeout_closes_quiet_connections_only(broker_factory):
    b = broker_factory(extra_args=["--connections-max-idle-ms", "1000"])
    with RawClient(b.bootstrap) as quiet, RawClient(b.bootstrap) as busy:
        api_versions(quiet)
        api_versions(busy)
        started = time.monotonic()
        closed_at = None
        while time.monotonic() - started < 4:
            api_versions(busy)  # a request every 0.2 s keeps it open
            if closed_at is None and quiet.wait_closed(0.2):
                closed_at = time.monotonic() - started
        assert closed_at is not None and 0.8 < closed_at < 3.5, closed_at
        api_versions(busy)
    assert "idle for" in b.log_text()
    assert_no_traceback(b)


# ---------------------------------------------------------------------------------------
# the request memory budget


def test_request_memory_budget_pauses_reading_until_memory_is_back(broker_factory, topic_name):
    """Budget 4 MiB. A holds a 3 MiB Produce half sent; B's whole 3 MiB Produce does not fit
    beside it, so B is not read (no answer) while a small Metadata request on another
    connection is answered. A completes: A is answered, then B, and both records are stored."""
    b = broker_factory(extra_args=["--max-request-memory", str(4 * MiB)])
    _second_produce_waits_for_the_first(b, topic_name, [os.urandom(768 * 1024) for _ in range(4)], [os.urandom(768 * 1024) for _ in range(4)])


def test_requests_leave_a_quarter_of_the_cache_for_reads(broker_factory, topic_name):
    """--cache-bytes 48 MiB: requests get at most 36 MiB of it (the segment cache keeps the
    rest for loads). A's 24 MiB Produce half sent and B's 13.5 MiB do not fit together there,
    though they would within the whole 48 MiB: B waits until A is answered."""
    b = broker_factory(extra_args=["--cache-bytes", str(48 * MiB)])
    _second_produce_waits_for_the_first(b, topic_name, [os.urandom(768 * 1024) for _ in range(32)], [os.urandom(768 * 1024) for _ in range(18)])


def _second_produce_waits_for_the_first(b, topic_name: str, va: list[bytes], vb: list[bytes]) -> None:
    """A sends half of a Produce of `va`; B's whole Produce of `vb` does not fit beside it in
    the request memory, so B is not read while a small Metadata request still is; once A
    completes, A is answered, then B, and both are stored."""
    with RawClient(b.bootstrap) as a, RawClient(b.bootstrap) as bc:
        assert error_code(a.metadata([topic_name]).topics[0].error_code) == 0
        frame_a, frame_b = produce_frame(topic_name, va, 1), produce_frame(topic_name, vb, 2)
        a.send_raw(frame_a[: len(frame_a) // 2])
        metadata_answered_within(b.bootstrap, 2)  # A's half has been read by now
        send_b = threading.Thread(target=bc.send_raw, args=(frame_b,))  # blocks while B is not read
        send_b.start()
        bc.sock.settimeout(1.5)
        with pytest.raises(socket.timeout):
            bc.sock.recv(1)  # B waits for memory
        bc.sock.settimeout(10)
        for _ in range(3):
            metadata_answered_within(b.bootstrap, 2)  # small requests still fit
        a.send_raw(frame_a[len(frame_a) // 2 :])
        pa = produce_response(a, 1)
        pb = produce_response(bc, 2)
        send_b.join(10)
        assert (error_code(pa.error_code), pa.base_offset, error_code(pb.error_code), pb.base_offset) == (0, 0, 0, len(va))
    assert read_values(b.bootstrap, topic_name) == va + vb
    assert_no_traceback(b)


def test_read_buffers_of_quiet_connections_are_given_back(broker_factory):
    """100 connections each pipeline 5 requests of 60 KiB, filling their whole 256 KiB read
    buffer (25 MiB in all), then go quiet: within seconds the buffers are given back."""
    b = broker_factory()
    metadata_answered_within(b.bootstrap, 5)
    body = req(API_VERSIONS, 3, client_software_name="a" * (60 * 1024), client_software_version="1")
    before = settled_rss(b.proc.pid)
    clients = [RawClient(b.bootstrap) for _ in range(100)]
    try:
        for c in clients:
            for _ in range(5):
                c.send_request(API_VERSIONS, 3, body)
        for c in clients:
            for _ in range(5):
                c.recv_frame()  # answered (an error code or not): the frame went through the buffer
        busy = rss_bytes(b.proc.pid)
        assert busy - before > 15 * MiB, f"the buffers were not filled ({(busy - before) / MiB:.1f} MiB)"
        quiet = wait_until(lambda: (r := rss_bytes(b.proc.pid)) - before < 8 * MiB and r, 15,
                           "the quiet connections' read buffers to be given back")
        print(f"RSS before {before / MiB:.0f} MiB, buffers filled {busy / MiB:.0f} MiB, quiet {quiet / MiB:.0f} MiB")
        for c in clients[:3]:  # still open and served (a new buffer on the next read)
            api_versions(c)
    finally:
        for c in clients:
            c.close()
    assert_no_traceback(b)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_client_that_does_not_read_stops_being_read(broker_factory):
    """A client pipelines 150,000 ApiVersions requests (about 70 MB of responses) and reads
    nothing. Once its responses back up the broker stops reading it (and goes idle) instead
    of answering everything into memory; when the client reads, every response arrives, in
    order."""
    b = broker_factory()
    metadata_answered_within(b.bootstrap, 5)
    before = settled_rss(b.proc.pid)
    count = 150_000
    body = req(API_VERSIONS, 3, client_software_name="slow-reader", client_software_version="1")
    with RawClient(b.bootstrap, timeout=60) as c:
        frames = b"".join(struct.pack(">i", len(p)) + p for p in (encode_request(API_VERSIONS, 3, body, i) for i in range(count)))
        # The broker stops reading until the client reads, after the checks below: longer
        # than any timeout a plain sendall could be given on a busy machine.
        sender = threading.Thread(target=c.send_raw_to_slow_reader, args=(frames,), daemon=True)
        sender.start()

        def broker_idle() -> bool:
            # Idle for two seconds running: on a busy machine a broker still working gets
            # little CPU, so one short window can look idle.
            for _ in range(2):
                used = cpu_seconds(b.proc.pid)
                time.sleep(1.0)
                if cpu_seconds(b.proc.pid) - used >= 0.02:
                    return False
            return True

        wait_until(broker_idle, 90, "the broker to stop working on the unread connection")
        growth = rss_bytes(b.proc.pid) - before
        assert growth < 25 * MiB, f"RSS grew by {growth / MiB:.0f} MiB holding responses nobody reads"
        print(f"RSS grew by {growth / MiB:.1f} MiB while the client read nothing")
        metadata_answered_within(b.bootstrap, 5)  # others are served meanwhile
        first = c.recv_frame()
        got, resp = decode_response(API_VERSIONS, 3, first)
        assert got == 0 and error_code(resp.error_code) == 0 and resp.api_keys
        for i in range(1, count):
            # every answer the same but for its correlation id: compared, not decoded again
            answer = c.recv_frame()
            assert struct.unpack_from(">i", answer)[0] == i and answer[4:] == first[4:], f"answer {i} out of order or not the first's"
        sender.join(10)
    assert_no_traceback(b)
