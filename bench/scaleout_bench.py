"""Scale-out benchmark (issue 30): the job on local[2] against a 2-worker standalone cluster
(1 core, 1 GiB each), the python source against Spark's kafka source, the HDFS-backed state
store against RocksDB, then the driver's serial share of a batch and what Amdahl's law makes
of it on more executors.

Each configuration is one ``bench/job_bench.py`` process (a SparkSession's master is fixed for
its life), one size at a time, ``--runs`` runs, medians taken by job_bench.  Configurations
change one thing at a time from the base (local, python, hdfs), plus the all-cluster one:

    python bench/scaleout_bench.py                              # 100k and 300k partitions, 3 runs
    python bench/scaleout_bench.py --sizes 100000:10000 --runs 1

The serial part is what only the driver does in a steady batch: the source's latestOffset,
planning, the offset and commit logs, and the sink after the rows are collected (sink_rows +
exporter apply + alerts publish).  Everything else (the tasks: read, parse, gate, shuffle,
state) runs on the executors' cores.  Projection for N executors of one core:
T(N) = serial + (T(2) - serial) * 2 / N, rate(N) = rows / T(N), stated as a projection.

Prints a table and writes bench/results/scaleout.json, keeping the results of the sizes and
configurations this sitting did not run (each result says its sitting).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)

#: (name, --master, --source, --state-store)
CONFIGS = [
    ("local/python/hdfs", "local", "python", "hdfs"),
    ("cluster/python/hdfs", "cluster", "python", "hdfs"),
    ("local/spark-kafka/hdfs", "local", "spark-kafka", "hdfs"),
    ("local/python/rocksdb", "local", "python", "rocksdb"),
    ("cluster/spark-kafka/rocksdb", "cluster", "spark-kafka", "rocksdb"),
]
SERIAL_PHASES = ("latestOffset", "queryPlanning", "walCommit", "commitOffsets")
SERIAL_SINK = ("sink_rows_s", "exporter_apply_s", "alerts_publish_s")


def serial_share(m: dict) -> dict:
    """The driver's serial seconds in a steady batch (medians), its share of the batch p50, and the
    projected batch time and rate on 4, 8 and 16 one-core executors (Amdahl)."""
    t = m.get("batch_p50_s")
    if not t:
        return {}
    serial = sum(m["phase_median_s"].get(k, 0) for k in SERIAL_PHASES) \
        + sum(m["breakdown"].get(k, 0) for k in SERIAL_SINK)
    serial = min(serial, t)
    rows = m.get("steady_rows_per_batch") or 0
    out = {"serial_s": serial, "serial_fraction": serial / t}
    for n in (4, 8, 16):
        tn = serial + (t - serial) * 2 / n
        out[f"projected_batch_s_{n}"] = tn
        out[f"projected_rows_per_s_{n}"] = rows / tn if tn else None
    return out


def run_config(name: str, master: str, source: str, store: str, size: str, args) -> dict:
    out = pathlib.Path(tempfile.mkstemp(prefix="km-scaleout-", suffix=".json")[1])
    cmd = [sys.executable, str(ROOT / "bench" / "job_bench.py"), "--sizes", size, "--runs", str(args.runs),
           "--master", master, "--source", source, "--state-store", store, "--out", str(out),
           "--steady-cycles", str(args.steady_cycles)]
    print(f"[scaleout] {name} {size}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        # the whole output (the JVM's cause is far above the Python traceback), for the operator
        log = out.with_suffix(".log")
        log.write_text(proc.stdout + proc.stderr)
        lines = proc.stderr.strip().splitlines()
        cause = [x for x in lines if "Caused by" in x or "Error" in x][:5]
        tail = "\n".join(cause + lines[-20:])
        print(f"[scaleout] {name} {size} failed (exit {proc.returncode}; whole output in {log}):\n{tail}",
              file=sys.stderr, flush=True)
        return {"config": name, "size": size, "error": tail}
    m = json.loads(out.read_text())["results"][0]
    out.unlink()
    m.update(config=name, size=size, **serial_share(m))
    print(f"[scaleout]   drain {m['drain_events_per_s']:.0f} ev/s, p50 {m['batch_p50_s']:.2f} s, "
          f"serial {m.get('serial_fraction', 0):.0%}", file=sys.stderr, flush=True)
    return m


def kept(path: str, results: list[dict]) -> list[dict]:
    """This sitting's results plus those of the file's other sizes and configurations (one
    sitting per size: 300,000 partitions take about two hours), each stamped with its sitting."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for m in results:
        m.setdefault("sitting", when)
    try:
        old = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return results
    done = {(m.get("config"), m.get("size")) for m in results}
    before = [m for m in old.get("results", []) if (m.get("config"), m.get("size")) not in done]
    for m in before:
        m.setdefault("sitting", old.get("when"))
    return before + results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["100000:10000", "300000:10000"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steady-cycles", type=int, default=6)
    ap.add_argument("--configs", nargs="+", default=[c[0] for c in CONFIGS], choices=[c[0] for c in CONFIGS])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scaleout.json"))
    args = ap.parse_args()
    results = [run_config(*c, size, args) for size in args.sizes for c in CONFIGS if c[0] in args.configs]
    print(f"{'config':<28} {'partitions':>10} {'drain ev/s':>10} {'p50 s':>6} {'p95 s':>6} {'serial':>6} "
          f"{'x4 ev/s':>8} {'x16 ev/s':>8} {'driver MB':>9} {'exec MB':>8} {'py MB':>7}")
    for m in results:
        if "error" in m:
            print(f"{m['config']:<28} {m['size']:>10} failed")
            continue
        f = lambda v, fmt: format(v, fmt) if v is not None else "-"  # noqa: E731
        print(f"{m['config']:<28} {m['partitions']:>10} {f(m['drain_events_per_s'], '>10.0f')} "
              f"{f(m['batch_p50_s'], '>6.2f')} {f(m['batch_p95_s'], '>6.2f')} {f(m.get('serial_fraction'), '>6.0%')} "
              f"{f(m.get('projected_rows_per_s_4'), '>8.0f')} {f(m.get('projected_rows_per_s_16'), '>8.0f')} "
              f"{f(m['jvm_peak_rss_mb'], '>9.0f')} {f(m.get('executors_peak_rss_mb'), '>8.0f')} "
              f"{f(m['python_workers_peak_rss_mb'], '>7.0f')}")
    report.write(args.out, "scaleout", args=vars(args), results=kept(args.out, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
