"""A Faust worker with processing_guarantee="exactly_once" (run by tests/test_faust.py with
the Python of the separate Faust venv, `.venv-faust`; it imports nothing of kafscale): an
agent counts the records of an input topic by key into a table and sends "key:count" to an
output topic for each. Faust commits each input partition's offsets, changelog and output
records in one transaction (aiokafka's send_offsets_to_transaction: TxnOffsetCommit v0),
every FAUST_COMMIT_INTERVAL seconds.

    python faust_app.py BOOTSTRAP APP_ID INPUT_TOPIC OUTPUT_TOPIC PARTITIONS DATA_DIR

It prints "processed N: PARTITION/OFFSET" after each record it counted (N: in this run),
and keeps DATA_DIR/table.json as the table's contents (rewritten every 0.2 s).
"""

import json
import os
import sys

import faust
from faust.transport.consumer import Consumer


def seek_before_resume() -> None:
    """faust-streaming 0.15's table recovery resumes the stream partitions, then seeks them
    to the committed offsets. Records its consumer fetched during recovery reach the agents
    in between; the seek then reads them again, Faust's read-offset filter lets the last one
    through a second time and its ack bookkeeping falls behind (later commits stop short of
    what was processed); the broker hands each record over once. Here the resume of stream
    partitions waits until the seek that follows it is done (the seek drops what the consumer
    fetched before it)."""
    resume, seek = Consumer.resume_partitions, Consumer.perform_seek
    deferred: dict[int, set] = {}

    def resume_partitions(self, tps) -> None:
        tps = set(tps)
        streams = {tp for tp in tps if not self._is_changelog_tp(tp)}
        deferred.setdefault(id(self), set()).update(streams)
        resume(self, tps - streams)

    async def perform_seek(self) -> None:
        await seek(self)
        later = deferred.pop(id(self), set())
        if later:
            resume(self, later)

    Consumer.resume_partitions = resume_partitions
    Consumer.perform_seek = perform_seek


def main() -> None:
    bootstrap, app_id, input_topic, output_topic, partitions, data_dir = sys.argv[1:7]
    seek_before_resume()
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        processing_guarantee="exactly_once",
        store="memory://",
        datadir=data_dir,
        topic_partitions=int(partitions),
        topic_replication_factor=1,
        web_enabled=False,
        commit_interval=float(os.environ.get("FAUST_COMMIT_INTERVAL", "2.0")),
        consumer_auto_offset_reset="earliest",
        # A worker killed with SIGKILL stays a group member until its session times out
        # (Faust's default: 60 s); its successor's JoinGroup waits for that.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
    )
    source = app.topic(input_topic, key_type=str, value_type=str, value_serializer="raw", key_serializer="raw")
    sink = app.topic(output_topic, key_type=str, value_type=str, value_serializer="raw", key_serializer="raw")
    counts = app.Table("counts", default=int)
    processed = 0

    @app.agent(source)
    async def count(stream):
        nonlocal processed
        async for event in stream.events():
            partition, offset = event.message.partition, event.message.offset
            key = event.key.decode() if isinstance(event.key, bytes) else event.key
            counts[key] += 1
            # The input record's partition: its offsets, the table's changelog record and
            # this output are then all in the transaction of that partition.
            await sink.send(key=key.encode(), value=f"{key}:{counts[key]}".encode(), partition=partition)
            processed += 1
            print(f"processed {processed}: {partition}/{offset}", flush=True)

    @app.agent(sink)
    async def subscribe_output(stream):
        # Faust sends within the transactions only to topics its workers consume (those
        # of its co-partitioned topic groups); to any other topic it sends outside them.
        async for _ in stream:
            pass

    @app.timer(0.2)
    async def dump_table():
        path = os.path.join(data_dir, "table.json")
        with open(path + ".tmp", "w") as f:
            json.dump(dict(counts.items()), f)
        os.replace(path + ".tmp", path)

    sys.argv[1:] = ["worker", "--loglevel", os.environ.get("FAUST_LOGLEVEL", "info"), "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
