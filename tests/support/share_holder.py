"""A share consumer in a process of its own, for tests that freeze it (SIGSTOP: its
heartbeats stop, its connections stay open) or kill it. It reads until it holds N records
(explicit acknowledgement, none acknowledged), prints their offsets as one line of JSON,
and then never polls again.

    python -m tests.support.share_holder BOOTSTRAP GROUP TOPIC N
"""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import ShareConsumer


def main(bootstrap: str, group: str, topic: str, n: int) -> None:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    held: list[int] = []
    while len(held) < n:
        held += [m.offset() for m in c.poll(0.5) if m.error() is None]
    print(json.dumps(sorted(held)), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
