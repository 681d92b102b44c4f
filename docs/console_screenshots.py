"""The console screenshots in docs/ (README's "Web console" section), taken the way the
browser tests drive the console: Debian's headless Chromium through Selenium, against one
broker with the ACL authorizer on (anonymous is a super user), a few topics, groups with
lag, ACLs, SCRAM users, quotas and a transaction left open, and a minute of produce/fetch
traffic so the overview's charts have lines.

Run from the repository: python docs/console_screenshots.py [--out docs]. It prints each
image's size (keep them under 150 KB: the console's plain style at 1280 pixels wide is).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.broker import BrokerProcess, free_port  # noqa: E402
from tests.support.console import chromium, console_on  # noqa: E402

TRAFFIC_S = 70  # the overview's charts show the last minutes, a point every second here
WIDTH = 1280
PAGES = [  # (file name, path, element to wait for, most CSS pixels of the page's height shown)
    ("console-overview.png", "/", ".uplot", 1045),  # down to the latency charts: all nine are over 150 KB
    ("console-topics.png", "/topics", "#topics", 800),
    ("console-topic.png", "/topics/orders", "#records", 1100),
    ("console-groups.png", "/groups", "#groups", 800),
    ("console-group.png", "/groups/billing", ".uplot", 1300),
    ("console-acls.png", "/acls", "#acls", 800),
    ("console-users.png", "/users", "#users", 800),
    ("console-quotas.png", "/quotas", "#quotas", 900),
    ("console-transactions.png", "/transactions?topic=payments", "#open-transactions", 900),
]


def seed(bootstrap: str) -> object:
    """Topics, groups, ACLs, users, quotas; returns the producer holding a transaction open."""
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import (
        AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType, ScramCredentialInfo,
        ScramMechanism, UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = {"orders": 3, "payments": 2, "clicks": 6, "inventory": 1, "audit-log": 1}
    for f in admin.create_topics([NewTopic(n, p, 1, config={"cleanup.policy": "compact"} if n == "inventory" else {})
                                  for n, p in topics.items()]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(600):
        p.produce("orders", key=f"customer-{i % 40}".encode(),
                  value=('{"order": %d, "customer": "customer-%d", "amount": %.2f, "currency": "EUR"}' % (i, i % 40, 5 + (i * 7.3) % 200)).encode(),
                  headers=[("source", b"web" if i % 3 else b"app")])
        p.produce("clicks", key=f"session-{i % 90}".encode(), value=f"/products/{i % 17}".encode())
        if i % 4 == 0:
            p.produce("payments", key=f"order-{i}".encode(), value=('{"order": %d, "status": "paid"}' % i).encode())
        if i % 10 == 0:
            p.produce("inventory", key=f"sku-{i % 12}".encode(), value=('{"stock": %d}' % (100 - i % 37)).encode())
    assert p.flush(60) == 0
    commits = {"billing": [("orders", q, 120 + 15 * q) for q in range(3)], "analytics": [("clicks", q, 80) for q in range(6)],
               "fulfilment": [("orders", q, 200) for q in range(3)], "ledger": [("payments", q, 60) for q in range(2)]}
    for group, tps in commits.items():
        req = ConsumerGroupTopicPartitions(group, [TopicPartition(t, q, off) for t, q, off in tps])
        admin.alter_consumer_group_offsets([req])[group].result(30)
    lit, pre, allow, deny = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED, AclPermissionType.ALLOW, AclPermissionType.DENY
    acls = [AclBinding(ResourceType.TOPIC, "orders", lit, "User:shop", "*", AclOperation.WRITE, allow),
            AclBinding(ResourceType.TOPIC, "orders", lit, "User:billing", "*", AclOperation.READ, allow),
            AclBinding(ResourceType.GROUP, "billing", lit, "User:billing", "*", AclOperation.READ, allow),
            AclBinding(ResourceType.TOPIC, "audit-", pre, "User:auditor", "*", AclOperation.READ, allow),
            AclBinding(ResourceType.TOPIC, "payments", lit, "User:shop", "10.0.0.13", AclOperation.READ, deny)]
    for f in admin.create_acls(acls).values():
        f.result(30)
    ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), f"{u}-secret".encode()) for u in ("shop", "billing", "auditor")]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(30)
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as Alter

    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    e = Alter.EntryData
    entries = [e(entity=[e.EntityData(entity_type="user", entity_name="shop")], ops=[e.OpData(key="producer_byte_rate", value=1048576.0, remove=False)]),
               e(entity=[e.EntityData(entity_type="user", entity_name=None)], ops=[e.OpData(key="consumer_byte_rate", value=4194304.0, remove=False),
                                                                                  e.OpData(key="request_percentage", value=200.0, remove=False)]),
               e(entity=[e.EntityData(entity_type="client-id", entity_name="batch-import")], ops=[e.OpData(key="producer_byte_rate", value=262144.0, remove=False)])]

    async def send():
        return await kp._manager.send(Alter(entries=entries, validate_only=False))

    assert all(x.error_code == 0 for x in kp._manager.run(send).entries)
    kp.close()
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "payments-writer", "transaction.timeout.ms": 900000})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce("payments", key=b"order-9001", value=b'{"order": 9001, "status": "pending"}', partition=1)
    assert txn.flush(30) == 0
    return txn


def traffic(bootstrap: str, stop: threading.Event) -> None:
    """Produce and consume for the charts (a group reading orders as it goes)."""
    from confluent_kafka import Consumer, Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "live-dashboard", "auto.offset.reset": "earliest"})
    c.subscribe(["orders", "clicks"])
    i = 0
    while not stop.is_set():
        for _ in range(40 + (i % 30)):
            p.produce("clicks", key=f"session-{i % 90}".encode(), value=f"/products/{i % 17}".encode())
            i += 1
        p.produce("orders", key=b"customer-7", value=b'{"order": %d, "customer": "customer-7", "amount": 12.50, "currency": "EUR"}' % i)
        p.poll(0)
        c.consume(200, 0.2)
    p.flush(10)
    c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(REPO / "docs"))
    args = ap.parse_args()
    out = Path(args.out)
    http = free_port()
    broker = BrokerProcess(extra_args=["--http", f"127.0.0.1:{http}", "--group-initial-rebalance-delay-ms", "0",
                                       "--authorizer", "acls", "--super-users", "User:ANONYMOUS"]).start()
    stop = threading.Event()
    with console_on(broker, ["--metrics", f"http://127.0.0.1:{http}", "--metrics-interval", "1"], seed) as (txn, console):
        try:
            mover = threading.Thread(target=traffic, args=(broker.bootstrap, stop), daemon=True)
            mover.start()
            with tempfile.TemporaryDirectory(prefix="kafscale-shots-") as profile:
                driver = chromium(profile)
                try:
                    driver.set_window_size(WIDTH, 900)
                    driver.get(console.url + "/groups/billing")  # its lag chart starts with this view
                    time.sleep(TRAFFIC_S)  # a script, not a test: the charts need this much history
                    from selenium.webdriver.common.by import By
                    from selenium.webdriver.support.ui import WebDriverWait

                    for name, path, ready, most in PAGES:
                        # The page laid out at its final width (the charts take theirs when
                        # drawn), then cut to its own height up to `most` pixels.
                        metrics = {"width": WIDTH, "height": most, "deviceScaleFactor": 1, "mobile": False}
                        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
                        driver.get(console.url + path)
                        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ready))
                        if ready == ".uplot":
                            time.sleep(2)  # the charts' data arrives after the page
                        height = min(int(driver.execute_script("return document.querySelector('main').getBoundingClientRect().bottom")) + 24, most)
                        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": height})
                        target = out / name
                        driver.save_screenshot(str(target))
                        print(f"{target}: {target.stat().st_size / 1024:.0f} KiB")
                finally:
                    driver.quit()
            txn.abort_transaction(30)
        finally:
            stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
