"""`kafscale console` processes and a headless Chromium for tests (Debian's chromium and
chromium-driver, driven by Selenium; nothing is downloaded: the driver and the browser are
named explicitly and Selenium Manager is told to stay offline)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.broker import REPO, BrokerProcess, free_port, wait_port

TOPIC, GROUP = "orders", "billing"

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]


class ConsoleProcess:
    def __init__(self, bootstrap: str, extra_args: list[str] | None = None):
        self.bootstrap = bootstrap
        self.port = free_port()
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="kafscale-console-", suffix=".log", delete=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ConsoleProcess":
        args = [sys.executable, "-m", "kafscale", "console", "--bootstrap", self.bootstrap, "--listen", f"127.0.0.1:{self.port}",
                "--timeout", "5", *self.extra_args]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wait_port(self.port, timeout=30, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")


@contextlib.contextmanager
def console_on(broker: BrokerProcess, console_args: list[str], seed=None):
    """(what `seed(bootstrap)` returned, a `kafscale console` with `console_args` started after
    it) on the started `broker`; stops the console and then the broker however the block ends."""
    console = None
    try:
        seeded = seed(broker.bootstrap) if seed is not None else None
        console = ConsoleProcess(broker.bootstrap, console_args).start()
        yield seeded, console
    finally:
        if console is not None:
            console.stop()
        broker.stop()


def add_console_user(users_file: str, name: str, password: str) -> None:
    subprocess.run([sys.executable, "-m", "kafscale", "console", "--auth", users_file, "--add-user", name],
                   input=password + "\n", text=True, check=True, cwd=REPO, timeout=60, capture_output=True)


def csrf_token(html: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def chromium(profile_dir: str):
    """A headless Chromium whose console log (errors included) can be read back."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never fetch a driver or a browser
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))


def seeded_broker() -> BrokerProcess:
    """A broker with its ops endpoint (`.http`), topic `orders` (300 records over 3
    partitions, 100 each) and group `billing` committed at 37 on partition 0."""
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    http = free_port()
    b = BrokerProcess(extra_args=["--http", f"127.0.0.1:{http}", "--group-initial-rebalance-delay-ms", "0"]).start()
    b.http = f"http://127.0.0.1:{http}"
    try:
        admin(b.bootstrap).create_topics([NewTopic(TOPIC, 3, 1)])[TOPIC].result(15)
        p = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(300):
            p.produce(TOPIC, key=f"k{i}".encode(), value=f'{{"order": {i}}}'.encode(), partition=i % 3)
        assert p.flush(30) == 0
        req = ConsumerGroupTopicPartitions(GROUP, [TopicPartition(TOPIC, 0, 37)])
        admin(b.bootstrap).alter_consumer_group_offsets([req])[GROUP].result(15)
    except BaseException:
        b.stop()
        raise
    return b


_ADMINS: dict = {}


def admin(bootstrap: str):
    """One AdminClient per cluster, kept: one that goes away leaves its futures unanswered."""
    from confluent_kafka.admin import AdminClient

    if bootstrap not in _ADMINS:
        _ADMINS[bootstrap] = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return _ADMINS[bootstrap]


def committed(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    res = admin(bootstrap).list_consumer_group_offsets([req])[group].result(10)
    return {tp.partition: tp.offset for tp in res.topic_partitions}
