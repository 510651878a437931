"""ELR benchmark: what the probe's eligible-leader-replica watcher (``monitor/elr.py``) costs.

The watcher's sweep asks kafka-python's ``KafkaAdminClient`` for the finalized features (one
ApiVersions v3+ request) and then every topic's partitions, 2,000 a DescribeTopicPartitions
request (the broker's cursor paging).  librdkafka's mock cluster has no DescribeTopicPartitions,
and a real Kafka with 100,000 partitions does not fit a 2-core machine, so the broker is
``bench/dtp_broker.py``: a fake that speaks just those three APIs (and Metadata) with
kafka-python's own protocol classes, in a process of its own (its CPU is not counted), with its
answers encoded once at start (a sweep's time is the client's).  Topics of 100 partitions,
replicas [1, 2, 3]; one partition in 97 has ISR [1] and eligible leader replicas [2, 3] (the
watcher keeps those, as on a cluster with a few unhealthy partitions), the rest a full ISR.

Per size (``--partitions``), ``--runs`` runs, each with a fresh broker and watcher: one warm-up
sweep (it also creates the client: bootstrap, connection), then ``--sweeps`` measured sweeps,
called as the watcher's thread calls them (``ElrWatcher.sweep()``).  Per sweep:

- ``wall_s``: the sweep, wall clock;
- ``cpu_s``: the process's CPU (``time.process_time``) during it: the calling thread and
  kafka-python's I/O thread, where the answers are decoded and turned into dicts (nothing else
  runs in the process meanwhile).  This is the time the sweep can hold the GIL against the
  probe's main loop;
- ``thread_cpu_s``: ``last_sweep["cpu_seconds"]``, the CPU of the thread that called sweep()
  (the watcher's own loop over the answers): the I/O thread's part is not in it;
- ``requests``: DescribeTopicPartitions requests (``last_sweep``), plus the one for the features;
- ``entries``: partitions kept (not fully in sync, or with an ELR);
- ``broker_cpu_s``: the fake broker's CPU, to show it is not the bottleneck;
- ``breakdown_cpu_s``: the watcher's loop (``thread_cpu_s``), kafka-python's decoding of the
  answers (one 2,000-partition answer decoded alone, times the requests), and the rest of its
  I/O thread (the answers made into dicts, its event loop).

And per run, on the last sweep's answer: a ``look()`` at one topic (the on-demand path, what the
probe wakes when the metadata shows an ISR the answer did not), ``--looks`` times; and
``elr_of`` over every partition as a metadata refresh calls it (``monitor/topology.py``: once per
partition per refresh, on the probe's main thread).  Correctness is checked in every run: the
entries are exactly the unhealthy partitions, ``elr_of`` gives ((2, 3), ()) for one of them and
((), ()) for a healthy one, and a look keeps the other topics' entries; otherwise the benchmark
stops with an error.

Figures are medians over the sweeps of a run, then over runs; CPU-s per 1,000 partitions per
sweep, and the sweep's CPU as a share of the watcher's default 60 s interval
(``elr_interval_s``: its average load) and of the probe's default 10 s interval (the interval a
sweep falls into: the most it can take from one probe cycle under the GIL).

``--with-probe N`` also measures the probe itself at N partitions with the watcher on its thread:
``bench/probe_bench.py``'s probe (librdkafka's mock cluster, every partition in a consumer group,
``Probe.run()`` at the 10 s interval, no phase timers) with ``elr_interval_s`` 0 (off), and with
the watcher sweeping a fake broker of as many partitions every ``--probe-elr-interval`` seconds
(default 10: a sweep in about every probe interval, six times the default's rate: the worst
case; the fake broker's topics have other names than the mock's, so the probe never wakes a
look).  ``--probe-runs`` runs of each, alternated (off, on, off, on: both see the machine's load
alike), of ``--probe-cycles`` cycles after 2 warm-up cycles: the probe's cycle wall time and CPU
per interval (all its threads: the watcher's and kafka-python's included), off and on, and the
CPU of the watcher's two threads (its own and its client's I/O thread) and of the probe's main
thread per interval (``/proc``, 10 ms ticks).

    python bench/elr_bench.py                                      # 10k, 30k, 100k; 3 runs x 5 sweeps
    python bench/elr_bench.py --partitions 100000 --runs 1 --sweeps 3
    python bench/elr_bench.py --partitions 100000 --with-probe 100000

Prints a table and writes ``bench/results/elr.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)
from dtp_broker import topic_name, unhealthy  # noqa: E402  (bench/dtp_broker.py)
from monitor.elr import ElrWatcher  # noqa: E402

TOPIC_PARTITIONS = 100
UNHEALTHY_EVERY = 97  # one partition in 97 (~1%) has ISR [1] and ELR [2, 3]
PREFIX = "elr-"
PAGE = 2000  # the watcher's default page, Kafka's max.request.partition.size.limit
ELR_INTERVAL_S = 60.0  # the probe's default elr_interval_s
PROBE_INTERVAL_S = 10.0  # the probe's default interval_s


def proc_cpu_s(pid: int) -> float:
    """User + system CPU of a process (``/proc/<pid>/stat``)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class FakeBroker:
    """bench/dtp_broker.py in a child process; stopped by its PID."""

    def __init__(self, topics: int, partitions: int, prefix: str = PREFIX, every: int = UNHEALTHY_EVERY) -> None:
        cmd = [sys.executable, str(ROOT / "bench" / "dtp_broker.py"), "--topics", str(topics),
               "--partitions", str(partitions), "--prefix", prefix, "--unhealthy-every", str(every)]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("BOOTSTRAP "):
            self.stop()
            raise RuntimeError(f"dtp_broker did not start: {line!r}")
        self.bootstrap = line.split()[1]
        self.start_s = time.perf_counter() - t0

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class BenchError(RuntimeError):
    pass


def expected_entries(n_topics: int, partitions: int) -> set[tuple[str, int]]:
    return {(topic_name(PREFIX, t), p) for t in range(n_topics) for p in range(partitions)
            if unhealthy(t, p, partitions, UNHEALTHY_EVERY)}


def check(w: ElrWatcher, n_topics: int, partitions: int, expected: set[tuple[str, int]]) -> dict[str, Any]:
    """The answer is the broker's: fail loudly otherwise."""
    if w.available is not True or w.last_sweep is None:
        raise BenchError(f"no sweep answered (available={w.available}, failures={w.failures})")
    if set(w._entries) != expected:
        raise BenchError(f"entries: {len(w._entries)} kept, {len(expected)} expected "
                         f"({len(set(w._entries) ^ expected)} differ)")
    bad_t, bad_p = sorted(expected)[len(expected) // 2]
    got = w.elr_of(bad_t, bad_p, 1, [1], [1, 2, 3])
    if got != ((2, 3), ()):
        raise BenchError(f"elr_of({bad_t}, {bad_p}) of an unhealthy partition: {got!r}, expected ((2, 3), ())")
    good = next((topic_name(PREFIX, t), p) for t in range(n_topics) for p in range(partitions)
                if not unhealthy(t, p, partitions, UNHEALTHY_EVERY))
    got = w.elr_of(good[0], good[1], 1, [1, 2, 3], [1, 2, 3])
    if got != ((), ()):
        raise BenchError(f"elr_of({good[0]}, {good[1]}) of a healthy partition: {got!r}, expected ((), ())")
    if w.elr_of(bad_t, bad_p, 1, [1, 2], [1, 2, 3]) is not None:  # another ISR than the answer's
        raise BenchError("elr_of with an ISR the answer did not see should be None")
    want_requests = -(-n_topics * partitions // PAGE)
    if int(w.last_sweep["requests"]) != want_requests or int(w.last_sweep["topics"]) != n_topics:
        raise BenchError(f"last_sweep {w.last_sweep}: expected {want_requests} requests and {n_topics} topics")
    return {"unhealthy": (bad_t, bad_p), "healthy": good}


def measure_sweeps(w: ElrWatcher, broker: FakeBroker, sweeps: int) -> list[dict[str, float]]:
    out = []
    for _ in range(sweeps):
        b0, w0, c0 = broker.cpu_s(), time.perf_counter(), time.process_time()
        w.sweep()
        wall, cpu, bcpu = time.perf_counter() - w0, time.process_time() - c0, broker.cpu_s() - b0
        if w.last_sweep is None or w.failures:
            raise BenchError(f"sweep failed ({w.failures} failures)")
        ls = w.last_sweep
        out.append({"wall_s": wall, "cpu_s": cpu, "thread_cpu_s": ls["cpu_seconds"], "sweep_seconds": ls["seconds"],
                    "requests": ls["requests"] + 1, "describe_topic_partitions_requests": ls["requests"],
                    "entries": ls["partitions_listed"], "topics": ls["topics"], "broker_cpu_s": bcpu,
                    "rss_mb": rss_mb()})
    return out


def measure_looks(w: ElrWatcher, n_topics: int, looks: int, expected: set[tuple[str, int]]) -> list[dict[str, float]]:
    out = []
    for i in range(looks):
        topic = topic_name(PREFIX, (i * 37) % n_topics)
        w0, c0 = time.perf_counter(), time.process_time()
        w.look({topic})
        out.append({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0})
    if w.failures or w.looks < looks:
        raise BenchError(f"look failed ({w.failures} failures)")
    if set(w._entries) != expected:
        raise BenchError(f"after the looks: {len(w._entries)} entries, {len(expected)} expected")
    return out


def measure_elr_of(w: ElrWatcher, n_topics: int, partitions: int, repeat: int = 3) -> dict[str, float]:
    """``elr_of`` for every partition as a metadata refresh calls it (the metadata's ISR is full
    where the answer saw it full, [1] where it saw [1]); the best of ``repeat``."""
    calls = [(topic_name(PREFIX, t), p, 1,
              (1,) if unhealthy(t, p, partitions, UNHEALTHY_EVERY) else (1, 2, 3), (1, 2, 3))
             for t in range(n_topics) for p in range(partitions)]
    elr_of, best, misses = w.elr_of, float("inf"), 0
    for _ in range(repeat):
        c0 = time.perf_counter()
        for name, p, leader, isr, replicas in calls:
            if elr_of(name, p, leader, isr, replicas) is None:
                misses += 1
        best = min(best, time.perf_counter() - c0)
    if misses:
        raise BenchError(f"elr_of gave None {misses} times for partitions the answer saw")
    return {"calls": len(calls), "seconds": best, "us_per_call": best / len(calls) * 1e6}


def decode_page_s(n_topics: int, partitions: int, repeat: int = 5) -> dict[str, float]:
    """kafka-python's decoding of one full answer (``PAGE`` partitions) alone, in this thread: the
    part of a request's CPU that is the protocol classes' (the best of ``repeat``)."""
    from dtp_broker import Cluster
    from kafka.protocol.admin import DescribeTopicPartitionsResponse

    body = Cluster(PREFIX, n_topics, partitions, UNHEALTHY_EVERY).body((), PAGE, None)
    best = float("inf")
    for _ in range(repeat):
        c0 = time.thread_time()
        DescribeTopicPartitionsResponse.decode(body, version=0)
        best = min(best, time.thread_time() - c0)
    return {"bytes": len(body), "cpu_s": best}


def one_run(n_partitions: int, sweeps: int, looks: int) -> dict[str, Any]:
    n_topics = max(1, n_partitions // TOPIC_PARTITIONS)
    n = n_topics * TOPIC_PARTITIONS
    expected = expected_entries(n_topics, TOPIC_PARTITIONS)
    gc.collect()
    broker = FakeBroker(n_topics, TOPIC_PARTITIONS)
    w = ElrWatcher({"bootstrap.servers": broker.bootstrap}, ELR_INTERVAL_S, 30.0, cluster_name="bench")
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        w.sweep()  # warm-up: creates the client (bootstrap, connection)
        first = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}
        check(w, n_topics, TOPIC_PARTITIONS, expected)
        per = measure_sweeps(w, broker, sweeps)
        checked = check(w, n_topics, TOPIC_PARTITIONS, expected)
        lk = measure_looks(w, n_topics, looks, expected)
        eo = measure_elr_of(w, n_topics, TOPIC_PARTITIONS)
        dec = decode_page_s(n_topics, TOPIC_PARTITIONS)
    finally:
        w.stop()
        broker.stop()
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    cpu = med(per, "cpu_s")
    return {
        "partitions": n, "topics": n_topics, "broker_start_s": broker.start_s,
        "wall_s": med(per, "wall_s"), "cpu_s": cpu, "thread_cpu_s": med(per, "thread_cpu_s"),
        "cpu_s_per_1000_partitions": cpu / (n / 1000),
        "requests": med(per, "requests"), "entries": med(per, "entries"), "expected_entries": len(expected),
        "broker_cpu_s": med(per, "broker_cpu_s"), "rss_mb": max(r["rss_mb"] for r in per),
        "look_wall_s": med(lk, "wall_s"), "look_cpu_s": med(lk, "cpu_s"),
        "elr_of_every_partition_s": eo["seconds"], "elr_of_us_per_call": eo["us_per_call"],
        "page_bytes": dec["bytes"], "decode_page_cpu_s": dec["cpu_s"],
        "first_sweep": first, "checked": checked, "sweeps": per, "looks": lk,
    }


def median_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["partitions", "topics", "wall_s", "cpu_s", "thread_cpu_s", "cpu_s_per_1000_partitions", "requests",
            "entries", "expected_entries", "broker_cpu_s", "look_wall_s", "look_cpu_s", "elr_of_every_partition_s",
            "elr_of_us_per_call", "broker_start_s", "page_bytes", "decode_page_cpu_s"]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["rss_mb"] = max(r["rss_mb"] for r in runs)
    out["first_sweep_wall_s"] = statistics.median(r["first_sweep"]["wall_s"] for r in runs)
    out["first_sweep_cpu_s"] = statistics.median(r["first_sweep"]["cpu_s"] for r in runs)
    # where a sweep's CPU goes: the watcher's own loop (the calling thread), kafka-python's
    # decoding of the answers, and the rest of its I/O thread (the answers as dicts, the event loop)
    pages = out["requests"] - 1
    out["breakdown_cpu_s"] = {"watcher_loop": out["thread_cpu_s"], "decode": out["decode_page_cpu_s"] * pages,
                              "io_thread_rest": out["cpu_s"] - out["thread_cpu_s"] - out["decode_page_cpu_s"] * pages}
    out["share_of_elr_interval"] = out["cpu_s"] / ELR_INTERVAL_S
    out["share_of_probe_interval"] = out["cpu_s"] / PROBE_INTERVAL_S
    out["sweep_cpu_s_range"] = [min(s["cpu_s"] for r in runs for s in r["sweeps"]),
                                max(s["cpu_s"] for r in runs for s in r["sweeps"])]
    out["sweep_wall_s_range"] = [min(s["wall_s"] for r in runs for s in r["sweeps"]),
                                 max(s["wall_s"] for r in runs for s in r["sweeps"])]
    out["runs"] = runs
    return out


# -- the probe with the watcher on its thread (--with-probe) ------------------------------------

def threads_cpu_s(names: tuple[str, ...]) -> float:
    """CPU of this process's threads whose names start with one of ``names`` (``/proc``, 10 ms ticks)."""
    total = 0.0
    for t in threading.enumerate():
        if t.native_id is not None and t.name.startswith(names):
            try:
                fields = pathlib.Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


#: the watcher's threads: its own, and its kafka-python client's I/O thread
ELR_THREADS = ("elr", "kafka-io-kafka-monitor-elr")

def probe_run(n_partitions: int, elr_interval_s: float, cycles: int) -> dict[str, Any]:
    """probe_bench.py's probe at ``n_partitions`` (no phase timers), its ELR watcher off
    (``elr_interval_s`` 0) or sweeping a fake broker of as many partitions."""
    import probe_bench as pb  # bench/probe_bench.py
    from monitor.probe import Probe
    from monitor.probe_config import ProbeConfig

    n_topics = max(1, n_partitions // TOPIC_PARTITIONS)
    gc.collect()
    mc = pb.MockClusterProcess(n_topics, TOPIC_PARTITIONS)
    fake: Optional[FakeBroker] = None
    probe = None
    try:
        groups = pb.commit_groups(mc.bootstrap, n_topics, pb.GROUP_TOPICS)
        probe = Probe(ProbeConfig(bootstrap_servers=mc.bootstrap, interval_s=PROBE_INTERVAL_S, source="bench",
                                  cluster="bench", topics_include="^bench-", request_timeout_s=120,
                                  elr_interval_s=elr_interval_s))
        if elr_interval_s > 0:
            # the mock cluster has no DescribeTopicPartitions: the watcher asks the fake broker
            # (its topics are other names, so the probe's metadata never asks it for a look)
            fake = FakeBroker(n_topics, TOPIC_PARTITIONS)
            probe.elr = ElrWatcher({"bootstrap.servers": fake.bootstrap}, elr_interval_s, 120.0, cluster_name="bench")
        pb.answer_groups(probe, groups)
        # the watcher's threads' CPU at each observation's start (where drive() closes an interval)
        marks: list[tuple[float, float]] = []
        observe = probe.observe

        def marked_observe() -> None:
            marks.append((threads_cpu_s(ELR_THREADS), threads_cpu_s(("MainThread",))))
            observe()
        probe.observe = marked_observe  # type: ignore[method-assign]
        per_cycle: list[dict] = []
        first: dict[str, float] = {}
        pb.drive(probe, mc, None, pb.WARMUP_CYCLES, cycles, per_cycle, first)
        marks.append((threads_cpu_s(ELR_THREADS), threads_cpu_s(("MainThread",))))
        marks = marks[-(cycles + 1):]
        for c, a, b in zip(per_cycle, marks, marks[1:]):
            c["elr_threads_cpu_s"], c["main_thread_cpu_s"] = b[0] - a[0], b[1] - a[1]
        elr = probe.elr
        sweeps = elr.sweeps if elr is not None else 0
        last_sweep = dict(elr.last_sweep) if elr is not None and elr.last_sweep else None
        failures = elr.failures if elr is not None else 0
    finally:
        if probe is not None:
            probe.close()
        mc.stop()
        if fake is not None:
            fake.stop()
    med = lambda key: statistics.median(c[key] for c in per_cycle)  # noqa: E731
    return {"partitions": n_topics * TOPIC_PARTITIONS, "elr_interval_s": elr_interval_s,
            "cycle_wall_s": med("cycle_wall_s"), "cycle_wall_s_max": max(c["cycle_wall_s"] for c in per_cycle),
            "interval_wall_s": med("interval_wall_s"), "interval_cpu_s": med("interval_cpu_s"),
            "interval_cpu_s_max": max(c["interval_cpu_s"] for c in per_cycle),
            "elr_threads_cpu_s": med("elr_threads_cpu_s"), "main_thread_cpu_s": med("main_thread_cpu_s"),
            "observation_lag_s_max": max((c["observation_lag_s"] or 0.0) for c in per_cycle),
            "dropped": sum(c["dropped"] for c in per_cycle), "elr_sweeps": sweeps, "elr_failures": failures,
            "elr_last_sweep": last_sweep, "cycles": per_cycle}


def machine() -> dict[str, Any]:
    info = report.machine_info()
    import kafka

    info["kafka_python"] = getattr(kafka, "__version__", "?")
    info["nice"] = os.nice(0)
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[10000, 30000, 100000],
                    help="cluster sizes (topics of 100 partitions; default 10000 30000 100000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per size, each with a fresh broker and watcher")
    ap.add_argument("--sweeps", type=int, default=5, help="measured sweeps per run, after one warm-up sweep")
    ap.add_argument("--looks", type=int, default=10, help="looks at one topic per run")
    ap.add_argument("--with-probe", type=int, default=0, metavar="N",
                    help="also run the probe at N partitions with the watcher off and on (see above)")
    ap.add_argument("--probe-elr-interval", type=float, default=PROBE_INTERVAL_S,
                    help="the watcher's interval in the --with-probe run (default 10)")
    ap.add_argument("--probe-cycles", type=int, default=5, help="measured probe cycles in each --with-probe run")
    ap.add_argument("--probe-runs", type=int, default=1,
                    help="--with-probe runs of each (off, on, off, on, ...: alternated, so that both see the "
                         "machine's load alike; default 1)")
    ap.add_argument("--note", default="", help="free text stored with the results (load on the machine, ...)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "elr.json"),
                    help="the results file (default bench/results/elr.json)")
    args = ap.parse_args()
    mach = machine()
    results: list[dict[str, Any]] = []
    probe_results: list[dict[str, Any]] = []
    probe_summary: dict[str, Any] = {}

    def save() -> None:
        mach["loadavg_at_end"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
        report.write(args.out, "elr", machine=mach, note=args.note, runs=args.runs, sweeps=args.sweeps,
                     looks=args.looks, page=PAGE, topic_partitions=TOPIC_PARTITIONS,
                     unhealthy_every=UNHEALTHY_EVERY, elr_interval_s=ELR_INTERVAL_S,
                     probe_interval_s=PROBE_INTERVAL_S,
                     broker="bench/dtp_broker.py (fake: ApiVersions, Metadata, DescribeTopicPartitions), own process",
                     results=results, **({"with_probe": probe_results} if probe_results else {}),
                     **({"with_probe_summary": probe_summary} if probe_summary else {}))

    for n in args.partitions:
        runs = []
        for r in range(args.runs):
            print(f"[bench] {n} partitions, run {r + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            runs.append(one_run(n, args.sweeps, args.looks))
            x = runs[-1]
            print(f"[bench]   sweep {x['wall_s']:.3f} s wall, {x['cpu_s']:.3f} CPU-s "
                  f"({x['thread_cpu_s']:.3f} in the calling thread), {x['requests']:.0f} requests, "
                  f"{x['entries']:.0f} kept; look {x['look_wall_s'] * 1000:.1f} ms", file=sys.stderr, flush=True)
        results.append(median_of_runs(runs))
        save()
    if args.with_probe:
        for interval in [0.0, args.probe_elr_interval] * args.probe_runs:
            print(f"[bench] probe at {args.with_probe} partitions, elr_interval_s {interval:g} ...",
                  file=sys.stderr, flush=True)
            probe_results.append(probe_run(args.with_probe, interval, args.probe_cycles))
            x = probe_results[-1]
            print(f"[bench]   cycle {x['cycle_wall_s']:.2f} s (max {x['cycle_wall_s_max']:.2f}), "
                  f"{x['interval_cpu_s']:.2f} CPU-s per interval ({x['elr_threads_cpu_s']:.2f} in the watcher's "
                  f"threads), {x['elr_sweeps']} sweeps",
                  file=sys.stderr, flush=True)
            save()
    if probe_results:
        summary = {}
        for label, on in (("off", False), ("on", True)):
            rows = [x for x in probe_results if (x["elr_interval_s"] > 0) == on]
            summary[label] = {"runs": len(rows), "cycle_wall_s": statistics.median(x["cycle_wall_s"] for x in rows),
                              "cycle_wall_s_max": max(x["cycle_wall_s_max"] for x in rows),
                              "interval_cpu_s": statistics.median(x["interval_cpu_s"] for x in rows),
                              "interval_cpu_s_max": max(x["interval_cpu_s_max"] for x in rows),
                              "elr_threads_cpu_s": statistics.median(x["elr_threads_cpu_s"] for x in rows),
                              "main_thread_cpu_s": statistics.median(x["main_thread_cpu_s"] for x in rows),
                              "elr_sweeps": sum(x["elr_sweeps"] for x in rows)}
        probe_summary.update(summary)
        save()
    print(f"{'partitions':>10} {'sweep wall s':>12} {'sweep CPU s':>11} {'(thread)':>9} {'CPU s/1k part':>13} "
          f"{'requests':>8} {'kept':>6} {'% of 60 s':>9} {'% of 10 s':>9} {'look ms':>8} {'elr_of ms':>9}")
    for m in results:
        print(f"{m['partitions']:>10} {m['wall_s']:>12.3f} {m['cpu_s']:>11.3f} {m['thread_cpu_s']:>9.3f} "
              f"{m['cpu_s_per_1000_partitions']:>13.4f} {m['requests']:>8.0f} {m['entries']:>6.0f} "
              f"{100 * m['share_of_elr_interval']:>8.2f}% {100 * m['share_of_probe_interval']:>8.2f}% "
              f"{1000 * m['look_wall_s']:>8.1f} {1000 * m['elr_of_every_partition_s']:>9.1f}")
    for x in probe_results:
        print(f"probe at {x['partitions']} partitions, elr_interval_s {x['elr_interval_s']:g}: cycle "
              f"{x['cycle_wall_s']:.2f} s (max {x['cycle_wall_s_max']:.2f}), {x['interval_cpu_s']:.2f} CPU-s per "
              f"{PROBE_INTERVAL_S:g} s interval ({x['elr_threads_cpu_s']:.2f} in the watcher's threads, "
              f"{x['main_thread_cpu_s']:.2f} in the main thread), {x['elr_sweeps']} sweeps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
