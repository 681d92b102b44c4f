"""Produce requests pipelined on one connection get offsets in request order, even when
the first one has to wait (here: its partition log is slow to come) and the second not."""

from __future__ import annotations

import asyncio
import time

from kafscale.broker.app import Broker
from kafscale.broker.config import BrokerConfig
from kafscale.metadata.store import TopicMeta
from kafscale.protocol import records
from tests.support.raw import RawClient, decode_response, error_code, req


async def test_pipelined_produces_keep_request_order(tmp_path, monkeypatch):
    broker = Broker(BrokerConfig(listen="127.0.0.1:0", data_dir=str(tmp_path), http=""))
    await broker.start()
    try:
        host, port = broker.listen_address
        logs = broker.logs
        original = logs.get_log
        calls = 0

        async def slow_first_get_log(topic, partition):
            nonlocal calls
            calls += 1
            first = calls == 1
            lg = await original(topic, partition)
            if first:
                await asyncio.sleep(0.3)  # the first request resumes late; the second does not
            return lg

        await broker.metadata.create_topic(TopicMeta("ordered", 1))
        monkeypatch.setattr(logs, "get_log", slow_first_get_log)

        def pipeline() -> list[int]:
            now = int(time.time() * 1000)
            with RawClient(f"{host}:{port}") as c:
                corrs = []
                for value in (b"first", b"second"):
                    pd = req(0, 9, "PartitionProduceData", index=0, records=records.build_batch([(None, value)], timestamp=now))
                    td = req(0, 9, "TopicProduceData", name="ordered", partition_data=(pd,))
                    corrs.append(c.send_request(0, 9, req(0, 9, transactional_id=None, acks=-1, timeout=10000, topic_data=(td,))))
                out = []
                for corr in corrs:
                    got, resp = decode_response(0, 9, c.recv_frame())
                    assert got == corr
                    part = resp.responses[0].partition_responses[0]
                    assert error_code(part.error_code) == 0
                    out.append(part.base_offset)
                return out

        assert await asyncio.to_thread(pipeline) == [0, 1]
    finally:
        await broker.stop()
