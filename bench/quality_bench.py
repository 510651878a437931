"""Quality-gate benchmark: what great-expectations costs per micro-batch.

Measures ``streaming.ingest.quality.validate_frame`` on frames shaped like what ``mapInPandas`` hands
over (PySpark 4: bigint -> nullable Int64, array<bigint> -> numpy arrays, strings -> object),
with the event mix of a watched cluster (35% partition_metadata, 35% partition_offsets, 29%
group_offsets, 1% heartbeat), for 1k, 10k and 100k rows: median of 5 runs, wall and CPU time,
clean frames and frames with 1% bad rows (which need GX's second, COMPLETE pass).  Also:

* the fixed cost per call (a 1-row frame, and the intercept of a line through the sizes),
* the one-off cost per Python process: importing great_expectations and building the
  context + suite (measured in a fresh interpreter, as a Spark Python worker pays it),
* why two passes: the suite run once with COMPLETE vs BOOLEAN_ONLY on the same frame,
* the share of a 3 s micro-batch, for one call and per micro-batch on 2 cores when the gate
  runs once per task (``gate_batches``).

    python bench/quality_bench.py              # 1k, 10k, 100k rows, 5 runs each
    python bench/quality_bench.py --runs 3 --sizes 1000 10000
    python bench/quality_bench.py --spark      # also in Spark (local[2]): the wirings compared

With ``--spark`` it also times a count over a cached parse()-shaped DataFrame (10k and 100k
rows, 2 partitions) four ways: no Python stage; an identity ``mapInPandas`` (the price of a
Python stage alone: every column through Arrow and back); ``mapInPandas(gate_batches)``; and
the iterator pandas UDF ``reason_batches`` over a struct of the 15 columns it reads.  The first
run of each Python worker also reports what importing GX and building the suite cost there.

Prints a table and writes bench/results/quality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import warnings
from typing import Iterable, Iterator, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from monitor.gcpause import gc_paused  # noqa: E402
from streaming.ingest import quality as q  # noqa: E402

BATCH_S = 3.0
CORES = 2
LONGS = ["seq", "observed_at", "partition", "leader", "leader_epoch", "min_insync_replicas", "high_watermark",
         "log_start_offset", "last_stable_offset", "committed_offset", "interval_ms", "events_dropped"]
TYPES = np.array(["partition_metadata", "partition_offsets", "group_offsets", "heartbeat"], dtype=object)


# -- the wirings compared with --spark: the gate as a mapInPandas function and as an iterator
# pandas UDF.  The job validates in parse_values instead; these live here, where they are
# measured (defined in this script so that Spark pickles them by value for its workers).

#: at most this many rows are validated together by gate_batches / reason_batches
MAX_ROWS_PER_VALIDATION = 200_000


def gate(pdf: pd.DataFrame) -> pd.DataFrame:
    """``pdf`` with ``reason`` set for the rows that fail the suite.  Columns, dtypes, index and
    every other value are left as they were (rows with an upstream reason keep it)."""
    return _with_reasons(pdf, q.validate_frame(pdf).to_numpy())


def _with_reasons(pdf: pd.DataFrame, reasons: np.ndarray) -> pd.DataFrame:
    bad = pd.notna(reasons)
    if not bad.any():
        return pdf
    out = pdf.copy(deep=False)  # the caller's frame is not modified
    col = pdf["reason"].to_numpy(dtype=object, copy=True)
    col[bad] = reasons[bad]
    reason = pd.Series(col, index=pdf.index)
    try:  # keep the column's dtype (object from Spark; pandas' "string" also works)
        reason = reason.astype(pdf["reason"].dtype)
    except (TypeError, ValueError):  # e.g. an all-null float column in a hand-made frame
        reason = reason.astype(object)
    out["reason"] = reason
    return out


def gate_batches(frames: Iterable[pd.DataFrame], max_rows: Optional[int] = None) -> Iterator[pd.DataFrame]:
    """The ``mapInPandas`` function: ``parsed.mapInPandas(gate_batches, parsed.schema)``.

    Spark hands a task its rows as Arrow batches of ``spark.sql.execution.arrow.maxRecordsPerBatch``
    (10,000) rows.  GX's fixed cost is per validation, so the frames of a task are validated
    together (up to ``max_rows`` rows at a time: bounded memory) and then yielded one by one,
    unchanged except for ``reason``."""
    with gc_paused():
        for chunk in _chunks(frames, max_rows or MAX_ROWS_PER_VALIDATION):
            yield from _gate_many(chunk)


def reason_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.Series]:
    """An iterator pandas UDF body (``Iterator[pd.DataFrame] -> Iterator[pd.Series]``): the
    reason of each row, upstream reason first, else the gate's, else None.  Feed it
    ``F.struct(*q.INPUT_COLUMNS)``: only these columns make the round trip to Python (the raw
    text and everything else stay in the JVM), and one string column comes back.  Like
    ``gate_batches``, a task's batches are validated together (up to
    ``MAX_ROWS_PER_VALIDATION`` rows).  The signature is what ``F.pandas_udf`` infers an
    iterator UDF from: keep it to this one argument."""
    with gc_paused():
        for chunk in _chunks(frames, MAX_ROWS_PER_VALIDATION):
            yield from _reasons_many(chunk)


def _chunks(frames: Iterable[pd.DataFrame], max_rows: int) -> Iterator[list[pd.DataFrame]]:
    """A task's frames in runs of about ``max_rows`` rows (each run is validated at once)."""
    buf: list[pd.DataFrame] = []
    rows = 0
    for pdf in frames:
        buf.append(pdf)
        rows += len(pdf)
        if rows >= max_rows:
            yield buf
            buf, rows = [], 0
    if buf:
        yield buf


def _reasons_many(frames: list[pd.DataFrame]) -> Iterator[pd.Series]:
    together = _concat(frames) if len(frames) > 1 else frames[0]
    got = q.validate_frame(together).to_numpy()
    if "reason" in together.columns:
        upstream = together["reason"].to_numpy(dtype=object)
        got = np.where(pd.isna(upstream), got, upstream)
    start = 0
    for f in frames:
        yield pd.Series(got[start:start + len(f)], dtype=object)
        start += len(f)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    cols = [c for c in q.INPUT_COLUMNS if c in frames[0].columns]
    with warnings.catch_warnings():  # all-null columns in some chunks: pandas' concat FutureWarning
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat([f[cols] for f in frames], ignore_index=True)


def _gate_many(frames: list[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    if len(frames) == 1:
        yield gate(frames[0])
        return
    reasons = q.validate_frame(_concat(frames)).to_numpy()
    start = 0
    for f in frames:
        yield _with_reasons(f, reasons[start:start + len(f)])
        start += len(f)


def frame(n: int, bad_frac: float = 0.0, seed: int = 7) -> pd.DataFrame:
    """n rows shaped like parse()'s output as mapInPandas delivers it; ``bad_frac`` of the
    rows break one rule each (ISR outside replicas, HW < log start, a -1001, interval 0)."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(4, size=n, p=[0.35, 0.35, 0.29, 0.01])
    bad = rng.random(n) < bad_frac
    i = np.arange(n)
    part = i % 1000
    df = pd.DataFrame({
        "reason": np.full(n, None, dtype=object),
        "raw": np.full(n, '{"schema":"kafka-monitor/v1","type":"partition_offsets","data":{}}' * 3, dtype=object),
        "entity": np.array([f"partition|k/t/{p}" for p in part], dtype=object),
        "type": TYPES[kind], "cluster": "k", "source": "probe",
    })
    cols: dict[str, list] = {c: [None] * n for c in LONGS}
    cols["seq"] = list(i)
    cols["observed_at"] = list(1_700_000_000_000 + i)
    for j in range(n):
        k = kind[j]
        if k < 3:
            cols["partition"][j] = int(part[j])
        if k == 0:
            cols["leader"][j], cols["leader_epoch"][j], cols["min_insync_replicas"][j] = 1, 5, 2
        elif k == 1:
            cols["high_watermark"][j] = 10_000 + j
            cols["log_start_offset"][j] = 10**9 if bad[j] else 100
            cols["last_stable_offset"][j] = 10_000 + j
        elif k == 2:
            cols["committed_offset"][j] = 9_000 + j
            cols["high_watermark"][j] = -1001 if bad[j] else 10_000 + j
        else:
            cols["interval_ms"][j] = 0 if bad[j] else 5_000
            cols["events_dropped"][j] = 0
    for c in LONGS:
        df[c] = pd.array(cols[c], dtype="Int64")
    replicas, isr_ok, isr_bad, empty = np.array([1, 2, 3]), np.array([1, 2, 3]), np.array([1, 9]), np.array([], np.int64)
    pmd = kind == 0
    df["replicas"] = pd.Series([replicas if m else None for m in pmd], dtype=object)
    df["isr"] = pd.Series([(isr_bad if b else isr_ok) if m else None for m, b in zip(pmd, bad)], dtype=object)
    df["offline_replicas"] = pd.Series([empty if m else None for m in pmd], dtype=object)
    df["topic"] = np.where(kind < 3, "t", None).astype(object)
    df["group"] = np.where(kind == 2, "g", None).astype(object)
    return df


def timed(fn, runs: int) -> dict:
    walls, cpus = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "runs_wall_s": walls}


def import_cost() -> dict:
    """Import + build in a fresh interpreter (what each Spark Python worker pays once).

    Run as a script, not ``python -c``: importing great_expectations imports
    pyspark.sql.connect, whose dependency check calls sys.exit(0) when ``__main__`` has neither
    ``__spec__`` nor ``__file__`` (it takes that for a doctest run) - the interpreter then
    exits silently with status 0."""
    out = subprocess.run([sys.executable, __file__, "--import-only"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not line:
        raise RuntimeError(f"import probe failed: {out.stderr[-2000:]}")
    return json.loads(line[-1])


def _import_only() -> None:
    t0 = time.perf_counter()
    from streaming.ingest import quality as q

    info = q.warm_up()
    t1 = time.perf_counter()
    q.validate_frame(frame(1))
    first = time.perf_counter() - t1
    print(json.dumps({"import_gx_s": info["import_s"], "import_and_build_s": t1 - t0,
                      "first_validate_s": first}))


SPARK_SCHEMA = [("reason", "string"), ("raw", "string"), ("entity", "string"), ("type", "string"),
                ("cluster", "string"), ("source", "string"), ("topic", "string"), ("group", "string")] + [
    (c, "bigint") for c in LONGS] + [(c, "array<bigint>") for c in ("replicas", "isr", "offline_replicas")]


def _spark_rows(df: pd.DataFrame) -> list[tuple]:
    cols = [c for c, _ in SPARK_SCHEMA]
    out = []
    for rec in df[cols].astype(object).itertuples(index=False):
        out.append(tuple(None if (v is None or v is pd.NA or (isinstance(v, float) and v != v))
                         else (v.tolist() if isinstance(v, np.ndarray) else v) for v in rec))
    return out


def spark_bench(sizes: list[int], runs: int, bad_frac: float, partitions: int = 2) -> dict:
    """Time the wirings in a real local[2] session (see the module docstring)."""
    import tempfile

    from pyspark.sql import functions as F

    from streaming.ingest import quality as q
    from streaming.job import JobConfig, spark_session, stop_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session(JobConfig(bootstrap_servers="unused:9092", checkpoint_dir=tempfile.mkdtemp(),
                                    master="local[2]", shuffle_partitions=2), app_name="quality-bench")
    out: dict = {"partitions": partitions, "master": "local[2]", "results": []}
    try:
        schema = ", ".join(f"`{n}` {t}" for n, t in SPARK_SCHEMA)

        def worker_cost(it):  # what the first gate call in a fresh Python worker pays
            t0 = time.perf_counter()
            from streaming.ingest import quality as wq

            info = wq.warm_up()
            for _ in it:  # drain the task's input
                pass
            yield pd.DataFrame({"pid": [os.getpid()], "import_gx_s": [info["import_s"]],
                                "import_and_build_s": [time.perf_counter() - t0]})

        def identity(it):
            for f in it:
                yield f

        reason_udf = F.pandas_udf(reason_batches, "string")
        for n in sizes:
            df = spark.createDataFrame(_spark_rows(frame(n, bad_frac)), schema).repartition(partitions).cache()
            df.count()
            if not out.get("workers"):
                out["workers"] = [r.asDict() for r in df.mapInPandas(
                    worker_cost, "pid long, import_gx_s double, import_and_build_s double").collect()]
            variants = {
                "no_python_stage": df,
                "identity_mapInPandas": df.mapInPandas(identity, df.schema),
                "mapInPandas_gate_batches": df.mapInPandas(gate_batches, df.schema),
                "pandas_udf_reason_batches": df.withColumn("reason", reason_udf(F.struct(*q.INPUT_COLUMNS))),
            }
            verdicts = {}
            for name, v in variants.items():  # warm-up run (every worker imports GX once)
                verdicts[name] = sorted((str(r["reason"]), r["count"]) for r in v.groupBy("reason").count().collect())
            times: dict[str, list[float]] = {k: [] for k in variants}
            for _ in range(runs):
                for name, v in variants.items():
                    t0 = time.perf_counter()
                    v.groupBy("reason").count().collect()
                    times[name].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            out["results"].append({
                "rows": n, "median_s": med, "runs_s": times,
                "gate_over_identity_mapInPandas_s": med["mapInPandas_gate_batches"] - med["identity_mapInPandas"],
                "mapInPandas_gate_over_no_python_s": med["mapInPandas_gate_batches"] - med["no_python_stage"],
                "pandas_udf_over_no_python_s": med["pandas_udf_reason_batches"] - med["no_python_stage"],
                "same_verdicts": verdicts["mapInPandas_gate_batches"] == verdicts["pandas_udf_reason_batches"],
                "quarantined": sum(c for r, c in verdicts["pandas_udf_reason_batches"] if r != "None"),
            })
            df.unpersist()
    finally:
        stop_spark(spark)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--bad-frac", type=float, default=0.01)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "quality.json"))
    ap.add_argument("--spark", action="store_true", help="also compare the wirings in Spark local[2]")
    ap.add_argument("--spark-sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--import-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.import_only:
        _import_only()
        return

    once = import_cost()
    from streaming.ingest import quality as q

    q.warm_up()
    g = q._gx()
    q.validate_frame(frame(1_000, args.bad_frac))  # first-call warm-up (lazy imports inside GX)

    one_row = frame(1)
    fixed = timed(lambda: q.validate_frame(one_row), args.runs)
    results = []
    for n in args.sizes:
        clean, dirty = frame(n), frame(n, args.bad_frac)
        narrowed = q._narrow(clean, np.arange(n))
        r_clean = timed(lambda clean=clean: q.validate_frame(clean), args.runs)
        pass1 = q.LAST.get("pass1_s")
        r_dirty = timed(lambda dirty=dirty: q.validate_frame(dirty), args.runs)
        last_dirty = dict(q.LAST)
        bad_rows = int(q.validate_frame(dirty).notna().sum())
        r_narrow = timed(lambda clean=clean, n=n: q._narrow(clean, np.arange(n)), args.runs)
        r_bool = timed(lambda nw=narrowed: g.validate(nw, g.suite, "BOOLEAN_ONLY"), args.runs)
        r_complete = timed(lambda nw=narrowed: g.validate(nw, g.suite, q._COMPLETE), args.runs)
        results.append({
            "rows": n,
            "validate_frame_clean_s": r_clean["wall_s"], "validate_frame_clean_cpu_s": r_clean["cpu_s"],
            "validate_frame_1pct_bad_s": r_dirty["wall_s"], "validate_frame_1pct_bad_cpu_s": r_dirty["cpu_s"],
            "bad_rows_found": bad_rows, "failed_expectations": last_dirty.get("failed_expectations"),
            "gx_pass1_boolean_only_s": r_bool["wall_s"], "gx_single_pass_complete_s": r_complete["wall_s"],
            "narrow_and_derive_s": r_narrow["wall_s"], "last_pass1_s": pass1,
            "us_per_row_clean": r_clean["wall_s"] / n * 1e6,
            "share_of_3s_batch_one_call": r_clean["wall_s"] / BATCH_S,
            "runs_clean_s": r_clean["runs_wall_s"], "runs_1pct_bad_s": r_dirty["runs_wall_s"],
        })

    # fixed cost: a 1-row call, and the intercept of a least-squares line through the sizes.
    # CPU time is the basis of the estimates: on a shared machine wall time also counts waiting
    # for a core, CPU time is what the gate takes away from the batch.
    xs = np.array([r["rows"] for r in results], dtype=float)
    ys = np.array([r["validate_frame_clean_cpu_s"] for r in results])
    slope, intercept = (np.polyfit(xs, ys, 1) if len(xs) >= 2 else (ys[0] / xs[0], 0.0))
    slope = max(float(slope), 0.0)

    def per_batch(rows: int, tasks: int) -> dict:
        """The gate's share of a 3 s micro-batch on 2 cores when it runs once per task
        (gate_batches): tasks x fixed cost + rows x per-row cost, in CPU seconds."""
        cpu = tasks * fixed["cpu_s"] + rows * slope
        return {"rows": rows, "tasks": tasks, "gate_cpu_s": cpu, "share_of_3s_on_2_cores": cpu / (CORES * BATCH_S)}

    report = {
        "benchmark": "quality",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "great_expectations": __import__("great_expectations").__version__,
        "expectations_in_suite": len(g.expectations), "rules": list(q.RULES),
        "runs": args.runs, "bad_frac": args.bad_frac, "batch_s": BATCH_S,
        "per_process_once": once,
        "fixed_per_call_s": fixed["wall_s"], "fixed_per_call_cpu_s": fixed["cpu_s"],
        "fit_cpu": {"intercept_s": float(intercept), "us_per_row": slope * 1e6},
        "results": results,
        "per_micro_batch_estimates": [per_batch(r, t) for r, t in
                                      ((10_000, 2), (100_000, 2), (100_000, 6), (200_000, 6))],
    }
    if args.spark:
        report["spark"] = spark_bench(args.spark_sizes, args.runs, args.bad_frac)
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")

    print(f"great-expectations {report['great_expectations']}, {len(g.expectations)} expectations, "
          f"{os.cpu_count()} cpus, load {report['machine']['load_avg_1m']:.1f}, median of {args.runs}")
    print(f"once per Python process: import GX {once['import_gx_s']:.2f}s, import+build "
          f"{once['import_and_build_s']:.2f}s, first validate {once['first_validate_s']:.2f}s")
    print(f"fixed cost per call (1 row): {fixed['wall_s'] * 1000:.0f} ms wall, {fixed['cpu_s'] * 1000:.0f} ms CPU; "
          f"CPU fit over the sizes: {intercept * 1000:.0f} ms + {slope * 1e6:.2f} us/row")
    hdr = (f"{'rows':>8} {'clean s':>8} {'cpu s':>7} {'1% bad s':>9} {'bad':>6} {'narrow s':>9} "
           f"{'GX bool s':>10} {'GX COMPLETE s':>14} {'us/row':>7} {'of 3 s':>7}")
    print(hdr)
    for r in results:
        print(f"{r['rows']:>8} {r['validate_frame_clean_s']:>8.3f} {r['validate_frame_clean_cpu_s']:>7.3f} "
              f"{r['validate_frame_1pct_bad_s']:>9.3f} {r['bad_rows_found']:>6} {r['narrow_and_derive_s']:>9.3f} "
              f"{r['gx_pass1_boolean_only_s']:>10.3f} {r['gx_single_pass_complete_s']:>14.3f} "
              f"{r['us_per_row_clean']:>7.1f} {r['share_of_3s_batch_one_call']:>7.1%}")
    print("per micro-batch, once per task, on 2 cores:")
    for e in report["per_micro_batch_estimates"]:
        print(f"  {e['rows']:>7} rows in {e['tasks']} tasks: {e['gate_cpu_s']:.2f} s CPU = "
              f"{e['share_of_3s_on_2_cores']:.1%} of a 3 s batch")
    if args.spark:
        sp = report["spark"]
        for w in sp.get("workers", []):
            print(f"Spark Python worker {w['pid']}: import GX {w['import_gx_s']:.2f}s, "
                  f"import+build {w['import_and_build_s']:.2f}s (once per worker)")
        print(f"Spark local[2], {sp['partitions']} partitions, count by reason, median of {args.runs} (s):")
        print(f"{'rows':>8} {'no Python':>10} {'identity mIP':>13} {'mIP gate':>9} {'UDF gate':>9} "
              f"{'GX in mIP':>10}")
        for r in sp["results"]:
            m = r["median_s"]
            print(f"{r['rows']:>8} {m['no_python_stage']:>10.2f} {m['identity_mapInPandas']:>13.2f} "
                  f"{m['mapInPandas_gate_batches']:>9.2f} {m['pandas_udf_reason_batches']:>9.2f} "
                  f"{r['gate_over_identity_mapInPandas_s']:>10.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
