"""Soak benchmark (issue 31): a day of operation compressed into ``--hours`` of wall time.

On the real 3-broker Kafka cluster (kafka_monitor/local/kafka_cluster.py), in the user's layout (the events
and alerts topics on the watched cluster), it runs the probe (``kafka-monitor probe``), the job
(``kafka-monitor job``) and a Prometheus server scraping the job and itself, while a churn
driver (tests/support/churn.py) replays a day at ``--speed`` simulated seconds per wall second:
topics created and deleted, partitions added, groups committing, going empty and deleted,
producers on and off.  On top of it: a broker restarted every ``--broker-restart-h`` simulated
hours (controlled), the probe restarted twice, the job stopped with SIGTERM and started again
on its checkpoint three times.

Every ``--sample`` seconds it records: RSS, open file descriptors and threads of the probe, the
job's driver (Python), its JVM, its Python workers and Prometheus; the JVM's heap used
(``jstat -gc``); the job's state keys, ``/metrics`` series and open alerts; batch
duration p50/p95 over the last sample (Prometheus ``quantile_over_time``); checkpoint bytes and
files, the state store's bytes, the quarantine directory's bytes; the churn's live topics and
groups.  At the end it writes the samples to ``--out`` (JSON), draws each series as a small plot
on one page (``--png``, matplotlib), and prints a verdict per series: **bounded** when the
maximum of the last half of the run is within ``--margin`` (and a small absolute slack) of the
maximum of the half before, else **growing**, with the least-squares slope per hour over the
last half.

    python bench/soak_bench.py                         # 2 h, a day at 12x
    python bench/soak_bench.py --hours 0.1 --speed 120 # a 6-minute smoke run of the same plan
    python bench/soak_bench.py --compare OLD.json NEW.json  # two runs' verdicts side by side
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
from job_bench import cmdline, descendants  # noqa: E402
from kafka_monitor.local.broker import free_port  # noqa: E402
from kafka_monitor.local.kafka_cluster import KafkaCluster  # noqa: E402
from tests.support.churn import Churn  # noqa: E402
from tests.support.prometheus import PrometheusServer  # noqa: E402

EVENTS, ALERTS = "kafka-monitor.events", "kafka-monitor.alerts"

#: (series, unit, absolute slack under which a rise is noise)
SERIES = [
    ("probe_rss_mb", "MB", 20), ("probe_fds", "", 10), ("probe_threads", "", 4),
    ("driver_rss_mb", "MB", 30), ("driver_fds", "", 10), ("driver_threads", "", 4),
    ("jvm_rss_mb", "MB", 50), ("jvm_heap_used_mb", "MB", 50), ("jvm_fds", "", 20), ("jvm_threads", "", 10),
    ("workers_rss_mb", "MB", 50), ("workers", "", 1), ("workers_fds", "", 10),
    ("prometheus_rss_mb", "MB", 30), ("prometheus_head_series", "", 200),
    ("state_keys", "", 10), ("state_entities", "", 50), ("state_mb", "MB", 1),
    ("metrics_series", "", 50), ("open_alerts", "", 5),
    ("batch_p50_s", "s", 0.5), ("batch_p95_s", "s", 1.0),
    ("checkpoint_mb", "MB", 2), ("checkpoint_files", "", 50), ("state_store_mb", "MB", 2), ("quarantine_mb", "MB", 1),
    ("live_topics", "", 5), ("live_groups", "", 5),
]


class Proc:
    """A restartable command in its own process group, its output appended to ``log``."""

    def __init__(self, name: str, argv: list[str], log: pathlib.Path, env: Optional[dict] = None):
        self.name, self.argv, self.log_path, self.env = name, argv, log, env
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **(self.env or {})})

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to the group, then SIGKILL after ``timeout``."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        except ProcessLookupError:
            pass

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None


class Ops:
    """Broker restarts on one long-lived thread, so that the main loop goes on sampling: a broker
    dies with the thread that started it (PR_SET_PDEATHSIG is per thread), so not a thread per restart."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, name="soak-ops", daemon=True).start()

    def _run(self) -> None:
        while True:
            what, fn = self._q.get()
            try:
                fn()
            except Exception as e:
                print(f"[soak] {what} failed: {e!r}", file=sys.stderr, flush=True)

    def submit(self, what: str, fn) -> None:
        self._q.put((what, fn))


def proc_stats(pids: list[int]) -> tuple[float, int, int]:
    """(RSS MB, open fds, threads) summed over ``pids``."""
    rss = fds = threads = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return rss / 1024, fds, threads


def heap_used_mb(pid: Optional[int]) -> Optional[float]:
    """The JVM's heap in use (survivor, eden and old generation used), from ``jstat -gc``."""
    if pid is None or not shutil.which("jstat"):
        return None
    try:
        out = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True, timeout=20).stdout.split("\n")
        cols = dict(zip(out[0].split(), out[1].split()))
        return sum(float(cols[k]) for k in ("S0U", "S1U", "EU", "OU")) / 1024
    except (subprocess.SubprocessError, OSError, IndexError, KeyError, ValueError):
        return None


def dir_size(path: pathlib.Path) -> tuple[float, int]:
    total = files = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(dirpath, n))
                files += 1
            except OSError:
                pass
    return total / 2**20, files


def scrape(port: int) -> dict[str, Any]:
    """Series count, state keys, entities and bytes (a job that serves them), open alerts, and the
    entities dropped so far by reason (counters: recorded, not judged) from the job's /metrics."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    series = keys = alerts = 0
    out: dict[str, Any] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        name, _, value = line.rpartition(" ")
        if name.startswith("kafka_monitor_job_state_keys"):
            keys += float(value)
        elif name.startswith("kafka_monitor_alert_active{") and float(value) == 1:
            alerts += 1
        elif name.startswith("kafka_monitor_job_state_entities{"):
            out["state_entities"] = out.get("state_entities", 0) + float(value)
        elif name == "kafka_monitor_job_state_bytes":
            out["state_mb"] = float(value) / 2**20
        elif name.startswith("kafka_monitor_entities_removed_total{"):
            why = name.split('reason="', 1)[1].split('"', 1)[0]
            out[f"removed_{why}"] = out.get(f"removed_{why}", 0) + float(value)
    return {"metrics_series": series, "state_keys": keys, "open_alerts": alerts, **out}


def prom_value(prom: PrometheusServer, expr: str) -> Optional[float]:
    try:
        r = prom.query(expr)
        return float(r[0]["value"][1]) if r else None
    except Exception:
        return None


def sample(t0: float, churn: Churn, probe: Proc, job: Proc, prom: PrometheusServer, metrics_port: int,
           ckpt: pathlib.Path, window_s: float) -> dict[str, Any]:
    s: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1), "sim_h": round(churn.sim_hours, 2)}
    probe_pids = [probe.pid] + descendants(probe.pid) if probe.pid else []
    s["probe_rss_mb"], s["probe_fds"], s["probe_threads"] = proc_stats(probe_pids)
    jvm = workers = []
    if job.pid:
        kids = descendants(job.pid)
        jvm = [p for p in kids if "java" in cmdline(p).split("\0")[0]]
        workers = [p for p in kids if p not in jvm and "python" in cmdline(p).split("\0")[0]]
        s["driver_rss_mb"], s["driver_fds"], s["driver_threads"] = proc_stats([job.pid])
    s["jvm_rss_mb"], s["jvm_fds"], s["jvm_threads"] = proc_stats(jvm)
    s["jvm_heap_used_mb"] = heap_used_mb(jvm[0] if jvm else None)
    s["workers_rss_mb"], s["workers_fds"], _ = proc_stats(workers)
    s["workers"] = len(workers)
    s["prometheus_rss_mb"], _, _ = proc_stats([prom.proc.pid] if prom.proc else [])
    s["prometheus_head_series"] = prom_value(prom, "prometheus_tsdb_head_series")
    s.update(scrape(metrics_port))
    w = f"{max(int(window_s), 30)}s"
    s["batch_p50_s"] = prom_value(prom, f"quantile_over_time(0.5, kafka_monitor_job_last_trigger_duration_seconds[{w}])")
    s["batch_p95_s"] = prom_value(prom, f"quantile_over_time(0.95, kafka_monitor_job_last_trigger_duration_seconds[{w}])")
    s["checkpoint_mb"], s["checkpoint_files"] = dir_size(ckpt)
    s["state_store_mb"], _ = dir_size(ckpt / "state")
    s["quarantine_mb"], _ = dir_size(ckpt / "quarantine")
    topics, groups = churn.live()
    s["live_topics"], s["live_groups"] = len(topics), len(groups)
    return s


def verdicts(samples: list[dict], margin: float) -> dict[str, dict]:
    """Per series: bounded or growing (the last half's maximum against the half before's), and
    the least-squares slope per hour over the last half."""
    out = {}
    if len(samples) < 4:
        return out
    end = samples[-1]["t_s"]
    mid = end / 2
    for name, unit, slack in SERIES:
        pts = [(s["t_s"], s.get(name)) for s in samples if s.get(name) is not None]
        first = [v for t, v in pts if t < mid]
        last = [(t, v) for t, v in pts if t >= mid]
        if not first or len(last) < 2:
            continue
        before, after = max(first), max(v for _, v in last)
        n = len(last)
        mt = sum(t for t, _ in last) / n
        mv = sum(v for _, v in last) / n
        var = sum((t - mt) ** 2 for t, _ in last)
        slope = (sum((t - mt) * (v - mv) for t, v in last) / var * 3600) if var else 0.0
        bounded = after <= before * (1 + margin) + slack
        out[name] = {"verdict": "bounded" if bounded else "growing", "first_half_max": before,
                     "last_half_max": after, "slope_per_hour": slope, "unit": unit}
    return out


def plot(samples: list[dict], events: list[tuple[float, str]], path: pathlib.Path, title: str) -> Optional[pathlib.Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[soak] matplotlib missing (pip install -e .[bench]): no plot page", file=sys.stderr)
        return None
    names = [(n, u) for n, u, _ in SERIES if any(s.get(n) is not None for s in samples)]
    cols = 4
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(16, 2.2 * rows), squeeze=False)
    for ax, (name, unit) in zip(axes.flat, names):
        pts = [(s["t_s"] / 3600, s[name]) for s in samples if s.get(name) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1)
        for t, what in events:
            ax.axvline(t / 3600, color={"job": "red", "probe": "orange", "broker": "grey"}[what], lw=0.6, alpha=0.6)
        ax.set_title(f"{name} ({unit})" if unit else name, fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(title + "  (lines: red job restart, orange probe restart, grey broker restart; x in hours)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return path


def compare(before_path: str, after_path: str) -> int:
    """Print two soak results' verdicts side by side (markdown), per series."""
    runs = [json.loads(pathlib.Path(p).read_text()) for p in (before_path, after_path)]
    names = [n for n, _, _ in SERIES if any(n in r.get("verdicts", {}) for r in runs)]
    print("| series | before: verdict, 1st / 2nd half max | after: verdict, 1st / 2nd half max |")
    print("|---|---|---|")
    for n in names:
        cells = []
        for r in runs:
            v = r.get("verdicts", {}).get(n)
            cells.append("-" if v is None else
                         f"{v['verdict']}, {v['first_half_max']:,.1f} / {v['last_half_max']:,.1f} {v['unit']}".rstrip())
        print(f"| {n} | {cells[0]} | {cells[1]} |")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--compare"]:
        if len(sys.argv) != 4:
            print("usage: soak_bench.py --compare BEFORE.json AFTER.json", file=sys.stderr)
            return 2
        return compare(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=2.0, help="wall-clock length of the run (default 2)")
    ap.add_argument("--speed", type=float, default=12.0, help="simulated seconds per wall second (default 12: a day in 2 h)")
    ap.add_argument("--sample", type=float, default=60.0, help="seconds between samples (default 60)")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--broker-restart-h", type=float, default=4.0, help="simulated hours between broker restarts")
    ap.add_argument("--probe-interval", type=float, default=10.0)
    ap.add_argument("--trigger", type=float, default=10.0, help="the job's trigger interval (s)")
    ap.add_argument("--margin", type=float, default=0.10, help="bounded: last half's max within this share of the first's")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak.json"))
    ap.add_argument("--png", default=str(ROOT / "bench" / "results" / "soak.png"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoint)")
    args = ap.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="km-soak-"))
    print(f"[soak] work directory {work}; {args.hours} h at {args.speed}x", file=sys.stderr, flush=True)
    cluster = KafkaCluster()
    ops = Ops()
    churn = probe = job = prom = None
    samples: list[dict] = []
    events: list[tuple[float, str]] = []
    t0 = time.monotonic()
    try:
        cluster.start()
        boot = cluster.bootstrap_servers
        cluster.create_topic(EVENTS, partitions=3, rf=3)
        cluster.create_topic(ALERTS, partitions=1, rf=3)
        ckpt = work / "checkpoint"
        metrics_port = free_port()
        cli = [sys.executable, "-m", "kafka_monitor.cli"]
        probe = Proc("probe", cli + ["probe", "--bootstrap-servers", boot, "--events-topic", EVENTS, "--cluster", "soak",
                                     "--interval", str(args.probe_interval), "--topics", r"^soak\."],
                     work / "probe.log")
        job = Proc("job", cli + ["job", "--bootstrap-servers", boot, "--events-topic", EVENTS, "--alerts-topic", ALERTS,
                                 "--checkpoint", str(ckpt), "--trigger", str(args.trigger),
                                 "--metrics-port", str(metrics_port)], work / "job.log")
        prom_port = free_port()
        prom = PrometheusServer(
            "global:\n  scrape_interval: 10s\n  evaluation_interval: 10s\nscrape_configs:\n"
            f"  - job_name: kafka-monitor\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
            f"  - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{prom_port}']\n",
            work / "prometheus", port=prom_port).start()
        churn = Churn(boot, "soak", seed=args.seed, speed=args.speed).start()
        probe.start()
        job.start()
        t0 = time.monotonic()
        total = args.hours * 3600
        restarts = [(job, [0.25, 0.5, 0.75]), (probe, [0.35, 0.7])]  # fractions of the run
        broker_every = args.broker_restart_h * 3600 / args.speed
        next_broker, broker_i = broker_every, 0
        next_sample = 0.0
        while (now := time.monotonic() - t0) < total:
            for proc, at in restarts:
                if at and now >= at[0] * total:
                    at.pop(0)
                    events.append((now, proc.name))
                    print(f"[soak] {now / 60:.0f} min: {proc.name} stopped (SIGTERM) and started", file=sys.stderr,
                          flush=True)
                    proc.stop()
                    proc.start()
            if now >= next_broker:
                next_broker += broker_every
                b = cluster.broker_ids[broker_i % len(cluster.broker_ids)]
                broker_i += 1
                events.append((now, "broker"))
                print(f"[soak] {now / 60:.0f} min: broker {b} restarted", file=sys.stderr, flush=True)
                ops.submit(f"restart of broker {b}", lambda b=b: cluster.restart_broker(b))
            if now >= next_sample:
                next_sample += args.sample
                s = sample(t0, churn, probe, job, prom, metrics_port, ckpt, args.sample)
                samples.append(s)
                print(f"[soak] {s['t_s'] / 60:5.1f} min, sim {s['sim_h']:5.1f} h: topics {s['live_topics']}, "
                      f"groups {s['live_groups']}, series {s.get('metrics_series')}, keys {s.get('state_keys')}, "
                      f"jvm {s['jvm_rss_mb']:.0f} MB, ckpt {s['checkpoint_files']} files", file=sys.stderr, flush=True)
            time.sleep(1.0)
    finally:
        for p in (churn,):
            if p is not None:
                p.stop()
        for p in (job, probe):
            if p is not None:
                p.stop()
        if prom is not None:
            prom.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    v = verdicts(samples, args.margin)
    print(f"{'series':<24} {'verdict':<8} {'1st half max':>12} {'2nd half max':>12} {'slope/h':>10}")
    for name, r in v.items():
        print(f"{name:<24} {r['verdict']:<8} {r['first_half_max']:>12.1f} {r['last_half_max']:>12.1f} {r['slope_per_hour']:>10.2f}")
    title = f"kafka-monitor soak: {args.hours} h wall, {args.speed}x ({samples[-1]['sim_h'] if samples else 0:.0f} simulated h)"
    png = plot(samples, events, pathlib.Path(args.png), title)
    report.write(args.out, "soak", args=vars(args), churn=vars(churn.counts) if churn else {},
                 events=events, verdicts=v, samples=samples, png=str(png) if png else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
