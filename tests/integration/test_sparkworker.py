"""The job's Python worker daemon (streaming.sparkworker): every Spark Python worker starts with
the quality gate's great-expectations objects built, and with them frozen out of the collector."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _probe(frames):
    import gc
    import os

    import pandas as pd

    from streaming.ingest import quality

    for f in frames:
        # read before anything here could build them: warm means built by the daemon, pre-fork
        yield pd.DataFrame({"pid": [os.getpid()] * len(f), "built": [quality._GX is not None] * len(f),
                            "builds": [quality.BUILDS] * len(f), "frozen": [gc.get_freeze_count()] * len(f)})


def test_every_worker_starts_with_the_gate_built(spark):
    assert spark.conf.get("spark.python.daemon.module") == "streaming.sparkworker"
    df = spark.range(0, 4000, numPartitions=8).mapInPandas(_probe, "pid long, built boolean, builds long, frozen long")
    rows = df.distinct().collect()
    assert rows and all(r.built for r in rows), rows
    # built once, in the daemon, not by the worker itself; and frozen there
    assert {r.builds for r in rows} == {1}
    assert all(r.frozen > 10_000 for r in rows), rows


def _started_warm(frames):
    import importlib
    import sys
    import zipimport

    import pandas as pd

    preloaded = sys.modules["__main__"].PRELOADED  # the daemon runs streaming.sparkworker as __main__
    read = []
    real = zipimport._read_directory
    zipimport._read_directory = lambda archive: read.append(archive) or real(archive)
    try:
        importlib.invalidate_caches()  # what PySpark does when a new worker first sets up its files
    finally:
        zipimport._read_directory = real
    zips = sum(isinstance(f, zipimport.zipimporter) for f in sys.path_importer_cache.values())
    for f in frames:
        yield pd.DataFrame({"ok": [all(m in preloaded for m in ("pyspark.worker", "streaming.state.function",
                                                                  "streaming.read.source", "streaming.ingest.parsing"))] * len(f),
                            "zips": [zips] * len(f), "read": [len(read)] * len(f)})


def test_workers_start_with_their_modules_imported_and_do_not_reread_zips(spark):
    rows = spark.range(0, 100, numPartitions=4).mapInPandas(_started_warm, "ok boolean, zips long, read long") \
        .distinct().collect()
    assert rows and all(r.ok for r in rows), rows
    # PySpark is on the workers' path as pyspark.zip: there are zip importers, and none re-reads
    assert all(r.zips > 0 and r.read == 0 for r in rows), rows
