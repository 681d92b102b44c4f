"""One local Spark session for the whole test run (a JVM start costs 10-20 s)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark(request):
    # local[2], UI off, two shuffle partitions, UTC; workers run this interpreter
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    try:
        # Spark's Python workers inherit the JVM's environment, fixed when it starts: the
        # S3 test needs moto's AWS_* / KAFSCALE_S3_ENDPOINT in it from the beginning.
        request.getfixturevalue("moto_server")
    except Exception:  # noqa: BLE001 - no moto: only the S3 test skips
        pass
    from kafscale.pipeline import jobs

    session = jobs.local_spark("kafscale-tests", **{"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
