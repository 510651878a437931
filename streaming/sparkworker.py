"""Spark's Python worker daemon for this job (``spark.python.daemon.module``).

PySpark forks every Python worker from one daemon process.  The quality gate builds its
great-expectations objects once per process (``streaming.quality._gx``: ~2 s of imports and
~2 s of building on this machine), and a Spark task runs in whichever pooled worker is free —
the source's reader, the parse-and-gate step and the state function all share the pool.  So
without this, a batch whose parse lands in a worker that has not parsed before pays ~3-4 s of
CPU there (measured: 64k events parsed in 0.7 s by a warm worker, 3.0-3.5 s by a cold one),
and it happens again and again as the pool rotates.  Here the daemon builds them before it
forks: every worker starts warm (copy-on-write; building them starts no thread, which matters
before a fork), and ``gc.freeze()`` keeps the collector away from what they made."""

from __future__ import annotations


def main() -> None:
    import gc

    from streaming import quality

    quality.warm_up()
    from pyspark import daemon

    # what exists now is never collected: the collector in a worker then does not walk (and
    # touch, un-sharing the pages of) the hundreds of thousands of objects GX made
    gc.freeze()

    daemon.manager()


if __name__ == "__main__":
    main()
