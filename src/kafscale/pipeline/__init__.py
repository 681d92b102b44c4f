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
    _default_save_mode_appends()


def _default_save_mode_appends() -> None:
    """`df.write.format("kafscale")...save()` without .mode() appends, as Spark's Kafka sink.

    Spark's Kafka sink treats the default save mode (ErrorIfExists) as append; Spark refuses
    that mode for every Python data source before the source is asked, so the Spark guide's
    `df.write.format(...).option(...).save()` would fail. pyspark offers no hook for it:
    this wraps DataFrameWriter.format/mode/save (once per process) to remember the format
    and the mode asked for, and turns the default or "error"/"errorifexists" into "append"
    for `kafscale` only; every other format, and every other mode, is passed on untouched.
    """
    try:
        from pyspark.sql.readwriter import DataFrameWriter
    except ImportError:  # pragma: no cover - Spark Connect only
        return
    if getattr(DataFrameWriter, "_kafscale_default_append", False):
        return
    orig_format, orig_mode, orig_save = DataFrameWriter.format, DataFrameWriter.mode, DataFrameWriter.save

    def format(self, source):
        self._kafscale_format = str(source).lower()
        return orig_format(self, source)

    def mode(self, saveMode):
        self._kafscale_mode = saveMode
        return orig_mode(self, saveMode)

    def save(self, path=None, format=None, mode=None, partitionBy=None, **options):
        fmt = str(format).lower() if format is not None else getattr(self, "_kafscale_format", None)
        asked = mode if mode is not None else getattr(self, "_kafscale_mode", None)
        if fmt == NAME and (asked is None or str(asked).lower() in ("error", "errorifexists", "default")):
            mode = "append"
        return orig_save(self, path, format, mode, partitionBy, **options)

    for fn, orig in ((format, orig_format), (mode, orig_mode), (save, orig_save)):
        fn.__doc__, fn.__name__, fn.__qualname__ = orig.__doc__, orig.__name__, orig.__qualname__
    DataFrameWriter.format, DataFrameWriter.mode, DataFrameWriter.save = format, mode, save
    DataFrameWriter._kafscale_default_append = True


def read_skip_log(directory: str) -> dict:
    """Sum what reads with option corruptionLog=<directory> skipped (failOnCorruption=false)."""
    from kafscale.pipeline.segments import read_skip_log as _read

    return _read(directory)


__all__ = ["NAME", "register", "read_skip_log"]
