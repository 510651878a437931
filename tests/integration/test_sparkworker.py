"""The job's Python worker daemon (streaming.sparkworker): every Spark Python worker starts with
the quality gate's great-expectations objects built, and with them frozen out of the collector."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def _probe(frames):
    import gc
    import os

    import pandas as pd

    from streaming import quality

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
