"""What a lagging consumer's group partition costs the state function, by how long it has been
watched.

A group partition whose consumer lags and commits every cycle is a dict in its bucket, folded by
the lag rules at each observation and pickled with the bucket each batch (docs/state.md). Its
lists fill over time: the history in ``window`` observations, the waits in 8, the trend in ten
30-s samples (5 min), the drift in ten 3-min samples (30 min), the HW marks towards 32 over hours
(``streaming/rules/lag.py``). So a consumer watched for hours costs more per observation than
one watched for a few cycles, which is all ``job_bench.py`` and ``state_bench.py`` ever see.

Here ``--group-partitions`` such group partitions (each lags by 1,000-1,500 records and commits
1,000 further every 10-s cycle, as in ``job_bench.py``) go through the job's state function in
one bucket, one observation each per batch, as Spark hands it over (pandas frames of parsed
events, the state kept as its stored bytes between batches). At each age in ``--ages`` (cycles
watched) the next ``--timed`` batches are timed; medians per group partition: the state
function's whole call, its load (unpickling the bucket), the rules (``fold``), its store
(pickling it), and the stored bytes.  ``--runs`` repeats it all; the table gives the medians of
the runs, and each run's ratio of the oldest age's call to age 17's (``job_bench.py``'s oldest),
which a noisy machine moves less than the figures themselves.

    python bench/lag_age_bench.py                  # ~20 min on 2 cores (3 runs)

Prints a table and writes bench/results/lag-age.json.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import pyarrow as pa  # noqa: E402

import report  # noqa: E402  (bench/report.py)
from monitor.contract import Event, GroupOffsets  # noqa: E402
from state_bench import _timed  # noqa: E402
from streaming.ingest import parsing  # noqa: E402
from streaming.state import function as st  # noqa: E402
from tests.support.state_fakes import FakeState  # noqa: E402  (the part of GroupState the function uses)

CYCLE_MS = 10_000


def cycle_frame(n: int, cycle: int, t_ms: int):
    """One cycle's group_offsets of ``n`` lagging group partitions, parsed as the job parses them."""
    evs = []
    for j in range(n):
        committed, hw = 1000 * cycle + j % 500, 1000 * (cycle + 1) + j
        evs.append(Event.of(GroupOffsets(group=f"g{j // 100}", topic=f"t{j % 100 // 10}", partition=j % 10,
                                         committed_offset=committed, high_watermark=hw, hw_observed_at=t_ms),
                            cluster="bench", source="bench-probe", seq=cycle * n + j + 1, observed_at=t_ms))
    return parsing.parse_values(pa.array([e.to_json() for e in evs], pa.binary())).to_pandas()


def run(n: int, ages: list[int], timed: int) -> list[dict]:
    fn = st.make_state_function(st.StateConfig(run_id="bench"))
    state = FakeState()
    t0 = int(time.time() * 1000) - (max(ages) + timed + 1) * CYCLE_MS
    out = []
    cycle = 0
    for age in sorted(ages):
        while cycle < age:  # watched this long, untimed
            list(fn((0,), iter([cycle_frame(n, cycle, t0 + cycle * CYCLE_MS)]), state))
            cycle += 1
        rows = []
        for _ in range(timed):
            frame = cycle_frame(n, cycle, t0 + cycle * CYCLE_MS)
            spent: dict = defaultdict(float)
            t = time.perf_counter()
            with _timed(spent):
                list(fn((0,), iter([frame]), state))
            rows.append({"call_s": time.perf_counter() - t, **{k: spent[k] for k in ("_load", "fold", "_store")}})
            cycle += 1
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        got = {"age_cycles": age, "watched_min": round(age * CYCLE_MS / 60_000, 1),
               "stored_bytes_per_gp": round(len(state.value[0]) / n, 1),
               **{f"{k.strip('_').removesuffix('_s')}_us_per_gp": round(v / n * 1e6, 2) for k, v in med.items()}}
        out.append(got)
        print(f"  age {age} cycles: {got}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group-partitions", type=int, default=1000)
    ap.add_argument("--ages", type=int, nargs="+", default=[6, 17, 60, 360, 2160],
                    help="cycles (10 s) watched before a measurement: 17 is job_bench's oldest, 2160 six hours")
    ap.add_argument("--timed", type=int, default=7, help="batches timed at each age")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/lag-age.json"))
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1} of {args.runs}", file=sys.stderr)
        runs.append(run(args.group_partitions, args.ages, args.timed))
    results = [{k: (v if k in ("age_cycles", "watched_min") else statistics.median(r[j][k] for r in runs))
                for k, v in runs[0][j].items()} for j in range(len(runs[0]))]
    print(f"{'age (cycles)':>12} {'watched':>9} {'stored B':>9} {'call us':>8} {'load us':>8} {'rules us':>9} "
          f"{'store us':>9}   (per group partition and batch, medians of {args.runs} runs)")
    for r in results:
        print(f"{r['age_cycles']:>12} {r['watched_min']:>7} m {r['stored_bytes_per_gp']:>9.0f} {r['call_us_per_gp']:>8.1f} "
              f"{r['load_us_per_gp']:>8.1f} {r['fold_us_per_gp']:>9.1f} {r['store_us_per_gp']:>9.1f}")
    ratios = None
    if 17 in args.ages and len(args.ages) > 1:
        ratios = [round(max(r, key=lambda x: x["age_cycles"])["call_us_per_gp"]
                        / next(x for x in r if x["age_cycles"] == 17)["call_us_per_gp"], 2) for r in runs]
        print(f"the oldest age's call / age 17's, per run: {ratios}")
    report.write(args.out, "lag-age", args=vars(args), results=results, oldest_over_17_per_run=ratios, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
