"""kafka-monitor replay's cost at a cluster's size, no Spark: an archive is written by the job's
state function and sink (the archive on) over the cycles ``bench/state_bench.py`` makes, then
replayed, timed, and checked to reproduce the job's transitions.

Per size: the job's state function per batch (with the archive's packing), the replay's per batch
(reading the batch's files, rebuilding the frames, the state function), events per second, the
archive's bytes, and the replay process's peak RSS.

    python bench/replay_bench.py --sizes 10000:10000 --cycles 12

Prints a table and writes bench/results/replay.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402

from state_bench import _frames  # noqa: E402
from streaming.job import JobConfig, state_config  # noqa: E402
from streaming.replay.engine import replay  # noqa: E402
from streaming.replay.source import ArchiveReader  # noqa: E402
from streaming.sinks.archive import ArchiveFiles  # noqa: E402
from streaming.state import function as st  # noqa: E402
from tests.support.archive_job import KeptAlerts, _Output  # noqa: E402
from streaming.sinks.batch import ExporterSink  # noqa: E402
from streaming.sinks.exporter import Exporter  # noqa: E402
from tests.support.state_fakes import FakeState  # noqa: E402


def one_size(n_parts: int, n_pairs: int, cycles: int, buckets: int, work: str) -> dict:
    d = f"{work}/archive-{n_parts}"
    cfg = state_config(JobConfig("-", "-"), run_id="bench", archive=True)
    fn = st.make_state_function(cfg)
    states = {k: FakeState() for k in range(buckets)}
    alerts = KeptAlerts()
    sink = ExporterSink(Exporter(max_series=10_000_000), alerts, archive=ArchiveFiles(d, query_id="bench",
                                                                                      retention_h=0))
    t0 = int(time.time() * 1000) - cycles * 10_000
    job_s, n_rows, batch_id = [], 0, 0
    for cycle in range(cycles):
        for batch in _frames(n_parts, n_pairs, cycle, t0 + cycle * 10_000, buckets):
            t = time.perf_counter()
            outs = []
            for k, frame in batch.items():
                if len(frame):
                    outs += list(fn((k,), iter([frame]), states[k]))
            job_s.append(time.perf_counter() - t)
            n_rows += sum(len(f) for f in batch.values())
            sink(_Output(pa.Table.from_pandas(pd.concat(outs, ignore_index=True), preserve_index=False)), batch_id)
            batch_id += 1
    size = sum(p.stat().st_size for p in pathlib.Path(d).rglob("*.parquet"))
    reader = ArchiveReader(d)
    batches = reader.batches(t0 - 3_600_000, t0 + (cycles + 1) * 10_000)
    per: list[float] = []
    last = [time.perf_counter()]

    def progress(p):
        now = time.perf_counter()
        per.append(now - last[0])
        last[0] = now

    t = time.perf_counter()
    res = replay(reader, batches, state_config(JobConfig("-", "-"), run_id="replay"), progress=progress)
    replay_s = time.perf_counter() - t
    same = [{k: v for k, v in r.items() if k != "query_id"} for r in res.transitions] == alerts.records()
    out = {"partitions": n_parts, "group_partitions": n_pairs, "buckets": buckets, "batches": res.batches,
           "events": res.rows, "transitions": len(res.transitions), "reproduced": same,
           "job_state_s_per_batch": statistics.median(job_s), "replay_s_per_batch": statistics.median(per),
           "replay_s": replay_s, "events_per_s": res.rows / replay_s, "archive_bytes": size,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    shutil.rmtree(d, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["10000:10000"], help="partitions:group partitions")
    ap.add_argument("--cycles", type=int, default=12, help="probe cycles (two batches each)")
    ap.add_argument("--buckets", type=int, default=16)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="replay-bench-")
    results = []
    try:
        for s in args.sizes:
            parts, pairs = (int(x) for x in s.split(":"))
            r = one_size(parts, pairs, args.cycles, args.buckets, work)
            results.append(r)
            print(f"{parts:,} partitions, {pairs:,} group partitions: {r['batches']} batches of "
                  f"{r['events'] / r['batches']:,.0f} events; job state {r['job_state_s_per_batch']:.2f} s/batch, "
                  f"replay {r['replay_s_per_batch']:.2f} s/batch ({r['events_per_s']:,.0f} events/s), "
                  f"reproduced {r['reproduced']}, archive {r['archive_bytes'] / 1e6:.1f} MB, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = ROOT / "bench" / "results" / "replay.json"
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results},
                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
