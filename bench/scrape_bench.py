"""Scrape benchmark: what `/metrics` costs at scale, and what scrapes cost the sink.

The job's exporter (``streaming.sinks.exporter.Exporter``, served as ``kafka-monitor job`` serves it)
filled as the sink fills it at N partitions and N group partitions (every partition's HW and
every group partition's commit and lag moving each batch): a ``partition_block`` row and one
``group_partition`` row per group partition per batch, as ``streaming.sinks.batch.sink_rows`` hands them over.
Measured in one process, like the job's driver:

- a scrape's latency (HTTP GET of /metrics from another thread, text format, with and without
  gzip), its size and the number of series;
- the sink's ``apply()`` time per batch alone, and while a scraper hits /metrics ``--rate``
  times a second (the driver's GIL is shared: a scrape's rendering is the sink's loss).

    python bench/scrape_bench.py --partitions 10000 100000

Prints a table and writes bench/results/scrape.json.  Figures are medians.
"""

from __future__ import annotations

import argparse
import gzip
import os
import pathlib
import statistics
import sys
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
from streaming.sinks.exporter import Exporter  # noqa: E402

TOPIC_PARTITIONS = 100


def batch_rows(n: int, b: int) -> list[dict]:
    """Batch ``b`` of the sink's rows at ``n`` partitions and ``n`` group partitions."""
    topics = [f"bench-{i // TOPIC_PARTITIONS}" for i in range(n)]
    parts = [i % TOPIC_PARTITIONS for i in range(n)]
    cols = {"cluster": ["c"] * n, "topic": topics, "partition": parts,
            "high_watermark": [1000 * b + i for i in range(n)], "log_start_offset": [0] * n,
            "last_stable_offset": [None] * n, "leader": [1 + i % 3 for i in range(n)], "replicas": [3] * n,
            "isr": [3] * n}
    rows = [{"kind": "partition_block", "action": "upsert", "rows": n, "columns": cols}]
    for i in range(n):
        rows.append({"kind": "group_partition", "action": "upsert", "cluster": "c",
                     "consumer_group": f"g-{i // (10 * TOPIC_PARTITIONS)}", "topic": topics[i], "partition": parts[i],
                     "committed_offset": 1000 * b + i - 5, "lag": 5 + b % 3, "lag_seconds": 0.5, "lag_status": "OK"})
    return rows


def scrape(url: str, gz: bool) -> tuple[float, int, int]:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gz else {})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        body = r.read()
        enc = r.headers.get("Content-Encoding")
    took = time.perf_counter() - t0
    text = gzip.decompress(body) if enc == "gzip" else body
    return took, len(body), sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))


def one_size(n: int, batches: int, rate: float, scrapes: int) -> dict:
    ex = Exporter(max_series=20 * n + 1000)
    port = ex.serve(0)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        applies: list[float] = []
        for b in range(batches):  # the sink alone
            rows = batch_rows(n, b)
            t0 = time.perf_counter()
            ex.apply(rows, batch_id=b)
            applies.append(time.perf_counter() - t0)
        plain = [scrape(url, False) for _ in range(scrapes)]
        zipped = [scrape(url, True) for _ in range(scrapes)]
        # the sink while a scraper hits /metrics `rate` times a second
        stop = threading.Event()
        during: list[float] = []

        def scraper():
            while not stop.is_set():
                t0 = time.perf_counter()
                during.append(scrape(url, True)[0])
                stop.wait(max(0.0, 1.0 / rate - (time.perf_counter() - t0)))
        threads = [threading.Thread(target=scraper, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        loaded: list[float] = []
        for b in range(batches, 2 * batches):
            rows = batch_rows(n, b)
            t0 = time.perf_counter()
            ex.apply(rows, batch_id=b)
            loaded.append(time.perf_counter() - t0)
        stop.set()
        for t in threads:
            t.join(120)
    finally:
        ex.shutdown()
    med = statistics.median
    p95 = lambda xs: sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)]  # noqa: E731
    return {"partitions": n, "group_partitions": n, "series": plain[0][2],
            "scrape_s_p50": med(x[0] for x in plain), "scrape_s_p95": p95([x[0] for x in plain]),
            "scrape_gzip_s_p50": med(x[0] for x in zipped), "bytes": plain[0][1], "bytes_gzip": zipped[0][1],
            "apply_s_p50": med(applies), "apply_s_p50_while_scraped": med(loaded),
            "scrapes_during_batches": len(during), "scrape_s_p50_during_batches": med(during) if during else None,
            "scrape_s_p95_during_batches": p95(during) if during else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--batches", type=int, default=5, help="sink batches per measurement (default 5)")
    ap.add_argument("--rate", type=float, default=10.0, help="scrapes per second while the sink runs (default 10)")
    ap.add_argument("--scrapes", type=int, default=5, help="scrapes per latency measurement (default 5)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scrape.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    results = []
    for n in args.partitions:
        print(f"[bench] {n} partitions ...", file=sys.stderr, flush=True)
        r = one_size(n, args.batches, args.rate, args.scrapes)
        results.append(r)
        print(f"[bench]   {r['series']} series: scrape p50 {r['scrape_s_p50']:.2f} s ({r['bytes'] / 1e6:.0f} MB; "
              f"gzip {r['scrape_gzip_s_p50']:.2f} s, {r['bytes_gzip'] / 1e6:.1f} MB); apply {r['apply_s_p50']:.2f} s, "
              f"{r['apply_s_p50_while_scraped']:.2f} s while scraped ({r['scrapes_during_batches']} scrapes, "
              f"p50 {r['scrape_s_p50_during_batches'] or 0:.2f} s)", file=sys.stderr, flush=True)
    report.write(args.out, "scrape", {"loadavg_start": load0, "loadavg_end": os.getloadavg()},
                 label=args.label, batches=args.batches, rate=args.rate, results=results)


if __name__ == "__main__":
    main()
