"""The state stage alone: the job's state function and the driver's sink, in one process, no Spark.

Events as ``bench/job_bench.py`` makes them (one observation cycle per 10 s: a partition_offsets
per partition, a partition_metadata on change and every 6th cycle, a group_offsets per group
partition, a heartbeat) are parsed as the job parses them, split into buckets, and handed to the
state function bucket by bucket, as pandas frames, with its state kept between batches as Spark
keeps it (the stored bytes).  A batch is half a cycle (the job's 5 s trigger against the probe's
10 s interval).  The first ``--warm`` cycles fill the state and are not timed; then per batch:

- ``state``: the state function over every bucket (one core's work is about half of it);
- per phase inside it (cumulative seconds, from the stages ``update_bucket`` calls): load,
  fold_columns (quiet and new partitions), fold (dict rules), tick/evict, output rows, store;
- ``output_to_arrow``: the output frames to Arrow (PySpark does it in the workers);
- ``sink``: ``sinks.batch.sink_rows``, ``Exporter.apply`` (the driver).

Medians over the timed batches.  What it does not see: Spark's scheduling, the Kafka source, the
parse and the quality gate (the framework's floor, ``job_bench.py --state noop``), the state
store's JVM side and the Arrow hand-over between the JVM and the workers.

    python bench/state_bench.py --sizes 100000:10000 300000:10000

Prints a table and writes bench/results/state.json.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
import zlib
from collections import defaultdict
from contextlib import contextmanager

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

import report  # noqa: E402  (bench/report.py)
from job_bench import ISR_EVERY, cycle_events  # noqa: E402
from streaming import job  # noqa: E402
from streaming.sinks.batch import sink_rows  # noqa: E402
from streaming.ingest import parsing  # noqa: E402
from streaming.sinks.exporter import Exporter  # noqa: E402
from streaming.state import function as st  # noqa: E402
from streaming.state import rows as st_rows  # noqa: E402
from tests.support.state_fakes import FakeState  # noqa: E402  (the part of GroupState the function uses)

PHASES = ("_load", "fold_columns", "fold", "tick", "evict_stale", "_frame", "pack_block", "_store")


@contextmanager
def _timed(spent: dict):
    """Wrap the state module's stage functions to add their wall time to ``spent``."""
    saved = {n: getattr(st, n) for n in PHASES}

    def wrap(name, f):
        def g(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t
        return g

    for n, f in saved.items():
        setattr(st, n, wrap(n, f))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(st, n, f)


def _frames(n_parts: int, n_pairs: int, cycle: int, t_ms: int, buckets: int,
            idle_groups: float = 0.0, isr_every: int = ISR_EVERY) -> list[dict[int, pd.DataFrame]]:
    """One cycle's rows as two batches, each {bucket: frame} as the state function gets them."""
    evs = cycle_events(n_parts, n_pairs, cycle, t_ms, idle_groups=idle_groups, isr_every=isr_every)
    values = pa.array([e.to_json() for e in evs], pa.binary())
    flat = parsing.parse_values(values)
    keys = flat.column("bucket_key").to_pylist()
    bucket = np.array([zlib.crc32(k.encode()) % buckets for k in keys], np.int64)
    flat = flat.append_column("bucket", pa.array(bucket))
    half = flat.num_rows // 2
    out = []
    for part in (flat.slice(0, half), flat.slice(half)):
        b = part.column("bucket").to_numpy()
        out.append({k: part.filter(pa.array(b == k)).to_pandas() for k in range(buckets)})
    return out


def one_size(n_parts: int, n_pairs: int, warm: int, timed: int, buckets: int, idle_groups: float = 0.0,
             isr_every: int = ISR_EVERY) -> dict:
    fn = st.make_state_function(st.StateConfig(run_id="bench"))
    states = {k: FakeState() for k in range(buckets)}
    exporter = Exporter(max_series=10_000_000)
    t0 = int(time.time() * 1000) - (warm + timed) * 10_000
    rows: list[dict] = []
    batch_id = 0
    for cycle in range(warm + timed):
        for batch in _frames(n_parts, n_pairs, cycle, t0 + cycle * 10_000, buckets, idle_groups, isr_every):
            spent: dict = defaultdict(float)
            outs = []
            t = time.perf_counter()
            with _timed(spent):
                for k, frame in batch.items():
                    if len(frame):
                        outs += list(fn((k,), iter([frame]), states[k]))
            state_s = time.perf_counter() - t
            # the output frames to Arrow, as PySpark does in the workers
            t = time.perf_counter()
            schema = pa.schema([(n, {"long": pa.int64(), "double": pa.float64(), "string": pa.string(),
                                     "binary": pa.binary()}[ty]) for n, ty in st_rows.OUTPUT_COLUMNS])
            table = pa.concat_tables([pa.Table.from_pandas(o, schema=schema, preserve_index=False) for o in outs])
            spent["output_to_arrow"] = time.perf_counter() - t
            t = time.perf_counter()
            got = sink_rows(table)
            exporter.apply([r for r in got if r["kind"] != "quarantine_event"], batch_id=batch_id)
            sink_s = time.perf_counter() - t
            batch_id += 1
            stored = sum(len(s.value[0]) for s in states.values() if s.value is not None)
            if cycle >= warm:
                rows.append({"rows": sum(len(f) for f in batch.values()), "state_s": state_s, "sink_s": sink_s,
                             "stored_bytes": stored, **{f"{k}_s": v for k, v in spent.items()}})
                print(f"  {n_parts:,} partitions, cycle {cycle} batch {batch_id}: {rows[-1]['rows']:,} rows, "
                      f"state {state_s:.2f} s, sink {sink_s:.2f} s", file=sys.stderr)
    exporter.shutdown()
    med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in rows[0] if k.endswith("_s")}
    return {"partitions": n_parts, "group_partitions": n_pairs, "idle_groups": idle_groups, "isr_every": isr_every,
            "buckets": buckets,
            "batches": len(rows),
            "rows_per_batch": statistics.median(r["rows"] for r in rows),
            "stored_mb": rows[-1]["stored_bytes"] / 1e6, "median_s": med}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["100000:10000", "300000:10000"],
                    help="partitions:group_partitions")
    ap.add_argument("--warm", type=int, default=3, help="cycles that fill the state, not timed")
    ap.add_argument("--timed", type=int, default=3, help="cycles timed (two batches each)")
    ap.add_argument("--buckets", type=int, default=job.JobConfig.buckets)
    ap.add_argument("--idle-groups", type=float, default=0.0,
                    help="share of group partitions whose consumer sits at the HW of a partition nobody writes to "
                         "(at rest in columns after the lag rules' window of such cycles: give --warm 11 or more)")
    ap.add_argument("--isr-every", type=int, default=ISR_EVERY,
                    help="one partition in this many has its ISR shrink each cycle (0: none; bench/job_bench.py)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/state.json"))
    args = ap.parse_args()
    results = []
    for size in args.sizes:
        parts, pairs = (int(x) for x in size.split(":"))
        results.append(one_size(parts, pairs, args.warm, args.timed, args.buckets, args.idle_groups, args.isr_every))
    print(f"{'partitions':>10} {'rows/batch':>10} {'state s':>8} {'sink s':>7} {'stored MB':>9}  phases (s)")
    for r in results:
        m = r["median_s"]
        phases = " ".join(f"{k[:-2]}={v:.3f}" for k, v in m.items() if k not in ("state_s", "sink_s"))
        print(f"{r['partitions']:>10,} {r['rows_per_batch']:>10,.0f} {m['state_s']:>8.2f} {m['sink_s']:>7.2f} "
              f"{r['stored_mb']:>9.1f}  {phases}")
    report.write(args.out, "state", args=vars(args), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
