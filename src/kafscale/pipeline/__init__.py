"""Spark pipelines over KafScale topics: a `kafscale` data source reading segment objects
directly (no broker), a sink producing back through a broker, and ready-made jobs.

    from kafscale.pipeline import register
    register(spark)
    spark.read.format("kafscale").option("storage", ...).option("subscribe", "t").load()

Nothing here imports pyspark until it is used, so the broker never pays for it.
"""

from __future__ import annotations

NAME = "kafscale"


def register(spark) -> None:
    """Register the `kafscale` data source with a SparkSession."""
    from kafscale.pipeline.source import KafScaleDataSource

    spark.dataSource.register(KafScaleDataSource)


def read_skip_log(directory: str) -> dict:
    """Sum what reads with option corruptionLog=<directory> skipped (failOnCorruption=false)."""
    from kafscale.pipeline.segments import read_skip_log as _read

    return _read(directory)


__all__ = ["NAME", "register", "read_skip_log"]
