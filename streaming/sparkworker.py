"""Spark's Python worker daemon for this job (``spark.python.daemon.module``).

PySpark forks every Python worker from one daemon process.  The quality gate builds its
great-expectations objects once per process (``streaming.ingest.quality._gx``: ~2 s of imports and
~2 s of building on this machine), and a Spark task runs in whichever pooled worker is free —
the source's reader, the parse-and-gate step and the state function all share the pool.  So
without this, a batch whose parse lands in a worker that has not parsed before pays ~3-4 s of
CPU there (measured: 64k events parsed in 0.7 s by a warm worker, 3.0-3.5 s by a cold one),
and it happens again and again as the pool rotates.  Here the daemon builds them before it
forks: every worker starts warm (copy-on-write; building them starts no thread, which matters
before a fork), and ``gc.freeze()`` keeps the collector away from what they made.

The daemon also imports what every worker imports before its first task and keeps a new
worker's first task from re-reading the zip archives on its path (see ``main``): a new worker's
first task went from ~0.5 s to ~0.1 s more than a reused worker's."""

from __future__ import annotations

import sys

#: the modules a forked worker starts with (set in the daemon, before it forks)
PRELOADED: frozenset = frozenset()


def main() -> None:
    import gc

    from streaming.ingest import quality

    quality.warm_up()
    # what each worker imports before its first task: PySpark's worker, its data source and
    # Arrow conversion modules (loaded from pyspark.zip, where there is no compiled cache, so
    # every forked worker compiled them from source again) and this job's own modules
    import pyspark.sql.conversion  # noqa: F401
    import pyspark.sql.worker.plan_data_source_read  # noqa: F401
    import pyspark.worker  # noqa: F401
    from pyspark import daemon

    import streaming.ingest.parsing  # noqa: F401
    import streaming.read.source  # noqa: F401
    import streaming.state.function  # noqa: F401

    # A new worker puts the task's files directory on sys.path and then calls
    # importlib.invalidate_caches(), which makes every zipimporter (one per package directory
    # inside pyspark.zip, the py4j zip and the spark-core jar) read its whole archive's directory
    # again: 0.15-0.3 s per new worker.  Those archives do not change under a running worker; a
    # zip added later (--py-files) gets its own importer when it is first used.
    import zipimport

    setattr(zipimport.zipimporter, "invalidate_caches", lambda self: None)  # noqa: B010
    global PRELOADED
    PRELOADED = frozenset(sys.modules)

    # what exists now is never collected: the collector in a worker then does not walk (and
    # touch, un-sharing the pages of) the hundreds of thousands of objects GX made
    gc.freeze()

    daemon.manager()


if __name__ == "__main__":
    main()
