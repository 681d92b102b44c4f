"""`kafscale pipeline parquet --once` against a live broker's store, checked row by row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
from confluent_kafka import Producer

from kafscale.cli.main import main


def test_pipeline_parquet_cli_copies_every_record(broker, topic_name, tmp_path, spark, capsys):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(200):
        p.produce(topic_name, key=b"k%d" % (i % 3), value=b"value-%d" % i, headers=[("n", str(i).encode())])
    assert p.flush(15) == 0
    out = tmp_path / "parquet"
    storage = "file://" + str(Path(broker.data_dir, "objects").resolve())
    # In process: the CLI's session builder gets the test run's Spark session (`spark`)
    # instead of starting a JVM of its own (10-20 s, far more on a busy machine)
    code = main(["pipeline", "parquet", topic_name, "--storage", storage, "--output", str(out), "--once", "--checkpoint", str(tmp_path / "ckpt"),
                 "--master", "local[1]", "--conf", "spark.sql.session.timeZone=UTC"])
    assert code == 0
    assert "200 rows" in capsys.readouterr().err
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
