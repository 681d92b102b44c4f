"""The Spark sink (`df.write.format("kafscale")`) through a SASL_SSL listener (#17): the
`kafka.*` options carry Kafka's client security settings to its confluent-kafka producer
(as Spark's own Kafka sink takes them); the rows arrive; a wrong password fails the write
at once with the authentication error instead of waiting out delivery timeouts."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pyspark")

from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion  # noqa: E402

from kafscale.security import certs  # noqa: E402
from tests.support.broker import BrokerProcess, free_port  # noqa: E402
from tests.test_pipeline_sink import consume  # noqa: E402


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    paths = certs.write_self_signed(str(tmp_path_factory.mktemp("sink-sasl")))
    plain, sasl_ssl = free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl_ssl}",
        "--ssl-cert", paths["cert"], "--ssl-key", paths["key"], "--sasl-mechanisms", "SCRAM-SHA-512",
        "--group-initial-rebalance-delay-ms", "0",
    ]).start()  # fmt: skip
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    ups = [UserScramCredentialUpsertion("spark", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"spark-secret")]
    for fut in admin.alter_user_scram_credentials(ups).values():
        fut.result(10)
    yield b, sasl_ssl, paths
    b.stop()


def _options(port: int, paths: dict, password: str) -> dict:
    return {"bootstrap": f"127.0.0.1:{port}", "kafka.security.protocol": "SASL_SSL", "kafka.ssl.ca.location": paths["ca"],
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "spark", "kafka.sasl.password": password}


def test_spark_sink_over_sasl_ssl(spark, secured):
    b, port, paths = secured
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(5)], "key string, value string")
    df.write.format("kafscale").options(**_options(port, paths, "spark-secret")).option("topic", "spark-sasl").save()
    got = consume(b.bootstrap, "spark-sasl", 5, timeout=30)
    assert sorted((k, v) for _p, k, v, _h in got) == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(5)]
    assert "authenticated User:spark with SASL SCRAM-SHA-512" in b.log_text()

    started = time.monotonic()
    with pytest.raises(Exception, match="Authentication failed"):
        df.write.format("kafscale").options(**_options(port, paths, "wrong")).option("topic", "spark-sasl").save()
    assert time.monotonic() - started < 45  # not the 60 s flush timeout per task
