"""`kafscale pipeline parquet --once` against a live broker's store, checked row by row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
from confluent_kafka import Producer


def test_pipeline_parquet_cli_copies_every_record(broker, topic_name, tmp_path):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(200):
        p.produce(topic_name, key=b"k%d" % (i % 3), value=b"value-%d" % i, headers=[("n", str(i).encode())])
    assert p.flush(15) == 0
    out = tmp_path / "parquet"
    storage = "file://" + str(Path(broker.data_dir, "objects").resolve())
    run = subprocess.run(
        [sys.executable, "-m", "kafscale", "pipeline", "parquet", topic_name, "--storage", storage, "--output", str(out), "--once", "--checkpoint", str(tmp_path / "ckpt"),
         "--master", "local[1]", "--conf", "spark.sql.session.timeZone=UTC", "--conf", "spark.ui.enabled=false"],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "200 rows" in run.stderr
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table().to_pylist()
    rows = sorted(table, key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == list(range(200))
    assert [r["value"] for r in rows] == [b"value-%d" % i for i in range(200)]
    assert [r["key"] for r in rows] == [b"k%d" % (i % 3) for i in range(200)]
    assert all(r["topic"] == topic_name for r in rows)


def test_pipeline_cli_rejects_a_conf_without_a_value(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "kafscale", "pipeline", "parquet", "t", "--output", str(tmp_path), "--conf", "spark.master"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode != 0 and "--conf takes KEY=VALUE" in run.stderr
