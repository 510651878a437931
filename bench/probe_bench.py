"""Probe benchmark: the probe's own wall and CPU time per observation cycle, per phase.

librdkafka's mock cluster (3 brokers) runs in a process of its own (``bench/mock_cluster_server.py``),
so the CPU figures are the probe's alone (Python + librdkafka's threads, and the child process it
asks group coordinators from), not the brokers'.  Topics of 100 partitions, replication factor 3;
consumer groups of 10 topics each (``--group-topics``), so that every partition has a committed
offset (as many group partitions as partitions); the events topic (6 partitions) on the same
mock cluster.  The mock does not implement ListGroups (librdkafka 2.16), so the benchmark answers
the probe's group listing with those groups; their committed offsets come from the mock
(OffsetFetch, with the partitions named: the mock answers nothing to "all partitions").

Each run starts the mock cluster and lets the probe run as ``kafka-monitor probe`` does
(``Probe.run()``: its own schedule of metadata refreshes and observations every ``--interval``
seconds, and its polling in between); the first two cycles are warm-up (bootstrap:
registration of every topic, every partition's metadata sent; then the schedule settles), the
next ``--cycles`` are measured.  A cycle's work is the metadata refreshes since the previous
observation, the observation, and the wait until every event of it is acknowledged; its
interval runs from its observation's start to the next one's.  Per cycle:

- ``cycle_wall_s``: refreshes + observation + delivery, wall clock (idle time between them left out);
- ``cycle_cpu_s``: the probe's CPU time (all threads, its coordinator child's included) during that;
- ``interval_cpu_s``: the same over the interval (what the probe costs per
  interval, idle work such as the client's statistics included);
- ``cpu_s_per_1000_partitions_per_cycle``: ``interval_cpu_s`` per 1,000 partitions;
- ``observation_lag_s``: how late the observation started after its schedule (the heartbeat's
  ``observation_lag_ms``);
- ``phases``: wall, process CPU and main-thread CPU per phase over the interval, exclusive (a
  phase's time does not include the phases called from it): metadata (the refresh and its
  partition_metadata events), leader_epochs and stats (the client's statistics: waiting for and
  reading them, and their callback; code before 2026-12-07 only, when the epochs came from there), min_isr, committed, group_states,
  watermarks, events (serializing and enqueueing events), delivery, other, idle (the probe's
  wait between cycles: librdkafka's threads writing statistics and sending, delivery reports).

Figures are medians over the cycles of a run, and medians over runs.  The phase timers wrap
the probe's methods (a few microseconds per call; with the per-event ``emit`` of the old code
that is ~2-3% of its cost); ``--no-phases`` measures without them.

    python bench/probe_bench.py                                  # 10k, 30k, 100k; 3 runs x 5 cycles
    python bench/probe_bench.py --partitions 10000 --runs 1 --cycles 3
    python bench/probe_bench.py --label before --out /tmp/probe-before.json
    python bench/probe_bench.py --baseline /tmp/probe-before.json   # adds the before figures to probe.json
    PROBE_BENCH_CODE=/tmp/old python bench/probe_bench.py ...   # measure the monitor/ package in /tmp/old

Prints a table and writes ``bench/results/probe.json``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import gc
import importlib
import json
import os
import pathlib
import select
import statistics
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: another copy of the code to measure (a directory holding monitor/), for A/B runs in one sitting
CODE = pathlib.Path(os.environ.get("PROBE_BENCH_CODE", ROOT)).resolve()
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(CODE))
sys.path.insert(0, str(ROOT / "bench"))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

import report  # noqa: E402  (bench/report.py)
from monitor import probe as probe_mod  # noqa: E402
from monitor.probe import Probe  # noqa: E402
from monitor.probe_config import ProbeConfig  # noqa: E402

TOPIC_PARTITIONS = 100  # partitions per topic: 10,000 partitions = 100 topics
EVENTS_TOPIC = "kafka-monitor.events"
GROUP_TOPICS = 10  # topics per consumer group: 1,000 group partitions each

#: (module, class, method, phase): methods that exist in this version of the code are timed (an
#: older copy, PROBE_BENCH_CODE, has on Probe what is now in the probe's parts)
PHASE_METHODS = [
    ("monitor.probe", "Probe", "refresh_metadata", "metadata"),
    ("monitor.topology", "ProbeTopologyMixin", "refresh_metadata", "metadata"),
    ("monitor.probe", "Probe", "_leader_epochs", "leader_epochs"),
    ("monitor.leader_epochs", "LeaderEpochs", "leader_epochs", "leader_epochs"),
    ("monitor.probe", "Probe", "_on_stats", "stats"),
    ("monitor.leader_epochs", "LeaderEpochs", "on_stats", "stats"),
    ("monitor.probe", "Probe", "_topic_min_isr", "min_isr"),
    ("monitor.topic_configs", "TopicConfigs", "min_isr", "min_isr"),
    ("monitor.probe", "Probe", "_committed_offsets", "committed"),
    ("monitor.offsets", "ProbeOffsetsMixin", "_committed_offsets", "committed"),
    ("monitor.coordinator", "CoordinatorClient", "collect", "committed"),  # waiting for the child's answers
    ("monitor.probe", "Probe", "_group_states", "group_states"),
    ("monitor.offsets", "ProbeOffsetsMixin", "_group_states", "group_states"),
    ("monitor.probe", "Probe", "_watermarks", "watermarks"),
    ("monitor.offsets", "ProbeOffsetsMixin", "_watermarks", "watermarks"),
    ("monitor.probe", "Probe", "_wait", "idle"),
    ("monitor.emitter", "EventEmitter", "emit", "events"),
    ("monitor.emitter", "EventEmitter", "emit_rows", "events"),
]
PHASES = ["metadata", "leader_epochs", "stats", "min_isr", "committed", "group_states", "watermarks", "events",
          "delivery", "other", "idle"]


def _module(name: str) -> Any:
    """The module ``name`` of the code measured, or None where that copy has no such module."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def child_cpu_s(probe: Probe) -> float:
    """CPU time of the probe's coordinator child (monitor.coordinator), which asks the committed
    offsets: counted with the probe's own (the phases' CPU is this process's only)."""
    proc = getattr(probe._coordinator, "_proc", None)
    if proc is None or proc.poll() is not None:
        return 0.0
    try:
        fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _clocks() -> tuple[float, float, float]:
    return time.perf_counter(), time.process_time(), time.thread_time()


class PhaseTimer:
    """Exclusive wall / process CPU / main-thread CPU per phase, from wrapped methods (main thread
    only; calls from other threads run untimed)."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.stack: list[str] = []
        self.mark = _clocks()
        self.totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])

    def reset(self) -> None:
        self.totals.clear()
        self.mark = _clocks()

    def _charge(self, name: Optional[str] = None) -> None:
        now = _clocks()
        t = self.totals[name or (self.stack[-1] if self.stack else "other")]
        for i in range(3):
            t[i] += now[i] - self.mark[i]
        self.mark = now

    def enter(self, name: str) -> None:
        self._charge()
        self.stack.append(name)

    def leave(self) -> None:
        self._charge()
        self.stack.pop()

    def wrap(self, fn: Callable, name: str) -> Callable:
        timer = self

        def timed(*a: Any, **kw: Any) -> Any:
            if threading.get_ident() != timer.main:
                return fn(*a, **kw)
            timer.enter(name)
            try:
                return fn(*a, **kw)
            finally:
                timer.leave()
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def install(self) -> Callable[[], None]:
        saved = []
        for module, cls_name, attr, name in PHASE_METHODS:
            cls = getattr(_module(module), cls_name, None)
            fn = cls.__dict__.get(attr) if cls is not None else None
            if fn is None:
                continue
            saved.append((cls, attr, fn))
            setattr(cls, attr, self.wrap(fn, name))

        def uninstall() -> None:
            for cls, attr, fn in saved:
                setattr(cls, attr, fn)
        return uninstall

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {k: {"wall_s": v[0], "cpu_s": v[1], "main_thread_cpu_s": v[2]} for k, v in self.totals.items()}


class MockClusterProcess:
    """bench/mock_cluster_server.py in a child process; stopped by its PID."""

    def __init__(self, topics: int, partitions: int, extra_topics: Sequence[str] = ()) -> None:
        """``extra_topics``: more topics, each ``name:partitions:replication``."""
        cmd = [sys.executable, str(ROOT / "bench" / "mock_cluster_server.py"), "--brokers", "3",
               "--topics", "bench-", str(topics), str(partitions), "3", "--topic", f"{EVENTS_TOPIC}:6:3"]
        for t in extra_topics:
            cmd += ["--topic", t]
        # a deadline proportional to its work rather than none (its start has hung: see
        # mock_cluster_server.py on the mock's missed wake-ups)
        deadline_s = 60 + topics * partitions / 2000
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], deadline_s)
        line = out.readline() if ready else ""
        if not line.startswith("BOOTSTRAP "):
            self.stop()
            why = f"printed {line!r}" if ready else f"printed nothing in {deadline_s:.0f} s"
            raise RuntimeError(f"mock cluster did not start: {why}")
        self.bootstrap = line.split()[1]

    def cpu_s(self) -> float:
        try:
            fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _groups(n_topics: int, group_topics: int) -> dict[str, list[TopicPartition]]:
    """bench-group-<i> -> the partitions it commits on (topics i*group_topics .. +group_topics)."""
    return {f"bench-group-{g}": [TopicPartition(f"bench-{t}", p) for t in range(g * group_topics,
                                                                            min(n_topics, (g + 1) * group_topics))
                                 for p in range(TOPIC_PARTITIONS)]
            for g in range((n_topics + group_topics - 1) // group_topics)}


def commit_groups(bootstrap: str, n_topics: int, group_topics: int) -> dict[str, list[TopicPartition]]:
    """The bench's consumer groups (``_groups``), each with offset 0 committed on its partitions."""
    groups = _groups(n_topics, group_topics)
    for gid, tps in groups.items():
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": gid, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(tp.topic, tp.partition, 0) for tp in tps], asynchronous=False)
        c.close()
    return groups


def answer_groups(probe: Probe, groups: dict[str, list[TopicPartition]]) -> None:
    """The mock does not implement ListGroups (librdkafka 2.16: _UNSUPPORTED_FEATURE): the group
    list is answered here; their committed offsets come from the mock (OffsetFetch), whose answer
    for "all partitions" is nothing: the bench names them."""
    listing = SimpleNamespace(valid=[SimpleNamespace(group_id=g) for g in groups], errors=[])
    ops = getattr(probe, "_ops", probe._admin)  # the client the probe asks for groups
    ops.list_consumer_groups = lambda **kw: _done(listing)
    coordinator = probe._coordinator
    send = coordinator.send  # what committed() and the probe's cycle (send, then collect) go through

    def send_named(asks: dict, wait_s: float) -> None:
        if asks.get("committed"):
            asks = {**asks, "committed": {g: [(tp.topic, tp.partition) for tp in groups[g]] for g in asks["committed"]}}
        send(asks, wait_s)
    coordinator.send = send_named  # type: ignore[method-assign]


def _done(value: Any) -> concurrent.futures.Future:
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_result(value)
    return f


def rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


#: what has been measured so far, for the memory watchdog to save before it stops the benchmark
PARTIAL: dict[str, Any] = {"results": [], "current": None}


def watchdog(max_rss_mb: float, save: Callable[[str], None]) -> None:
    """Stop the benchmark (saving what it has) when the process's RSS passes ``max_rss_mb``: the
    old probe queues every statistics document it has not parsed yet (76 MB each at 100,000
    partitions), and the machine is shared."""
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if rss_mb() > max_rss_mb:
                print(f"[bench] RSS above {max_rss_mb:.0f} MB: stopped", file=sys.stderr, flush=True)
                save(f"stopped by the memory watchdog: RSS above {max_rss_mb:.0f} MB")
                os._exit(3)
    threading.Thread(target=watch, daemon=True).start()


WARMUP_CYCLES = 2  # the bootstrap cycle, and one for the refresh schedule to settle


def drive(probe: Probe, mc: "MockClusterProcess", timer: Optional[PhaseTimer], warmup: int, cycles: int,
          out: list[dict], first: dict[str, float]) -> None:
    """Run ``probe.run()`` — its own schedule of refreshes and observations, and its idle polling —
    and measure each cycle.  A cycle's work is the refreshes since the previous observation,
    the observation, and the wait until its events are all acknowledged (the flush: the
    "delivery" phase); its interval runs from one observation's start to the next one's, so
    that it holds everything the probe does per interval, idle time included."""
    stop = threading.Event()
    refresh, observe = probe.refresh_metadata, probe.observe
    state: dict[str, Any] = {"done": 0, "work_wall": 0.0, "work_cpu": 0.0, "pending": None,
                             "seq0": probe.emitter._seq, "dropped0": probe.emitter.dropped, "broker0": mc.cpu_s()}

    def probe_cpu() -> float:
        return time.process_time() + child_cpu_s(probe)

    def timed_refresh() -> bool:
        w0, c0 = time.perf_counter(), probe_cpu()
        try:
            return refresh()
        finally:
            state["work_wall"] += time.perf_counter() - w0
            state["work_cpu"] += probe_cpu() - c0

    def timed_observe() -> None:
        w0, c0 = time.perf_counter(), probe_cpu()
        pending = state["pending"]
        if pending is not None:  # the previous cycle's interval ends here
            pending["interval_wall_s"] = w0 - pending.pop("_w0")
            pending["interval_cpu_s"] = c0 - pending.pop("_c0")
            pending["phases"] = timer.snapshot() if timer else {}
            out.append(pending)
            state["pending"] = None
            if len(out) >= cycles:
                stop.set()
                return
        if timer:
            timer.reset()
        observe()
        if timer:
            timer.enter("delivery")
        left = probe.emitter.flush(120)
        if timer:
            timer.leave()
        wall = state["work_wall"] + time.perf_counter() - w0
        cpu = state["work_cpu"] + probe_cpu() - c0
        seq, dropped, broker = probe.emitter._seq, probe.emitter.dropped, mc.cpu_s()
        cycle = {"_w0": w0, "_c0": c0, "cycle_wall_s": wall, "cycle_cpu_s": cpu,
                 "probe_cycle_s": probe.last_cycle_s, "observation_lag_s": probe.last_lag_s,
                 "events": seq - state["seq0"], "dropped": dropped - state["dropped0"], "undelivered": left,
                 "broker_cpu_s": broker - state["broker0"], "rss_mb": rss_mb()}
        state.update(work_wall=0.0, work_cpu=0.0, seq0=seq, dropped0=dropped, broker0=broker)
        state["done"] += 1
        if state["done"] == 1:
            first.update(wall_s=wall, cpu_s=cpu)
        if state["done"] > warmup:
            state["pending"] = cycle

    probe.refresh_metadata, probe.observe = timed_refresh, timed_observe  # type: ignore[method-assign]
    probe.run(stop)


def one_run(n_partitions: int, cycles: int, interval_s: float, phases: bool, group_topics: int = GROUP_TOPICS) -> dict:
    n_topics = max(1, n_partitions // TOPIC_PARTITIONS)
    n = n_topics * TOPIC_PARTITIONS
    gc.collect()  # the previous run's clients (in cycles with the answers patched in below) and their threads
    mc = MockClusterProcess(n_topics, TOPIC_PARTITIONS)
    timer = PhaseTimer()
    uninstall = timer.install() if phases else (lambda: None)
    probe = None
    try:
        groups = commit_groups(mc.bootstrap, n_topics, group_topics)
        probe = Probe(ProbeConfig(bootstrap_servers=mc.bootstrap, interval_s=interval_s, source="bench",
                                  cluster="bench", topics_include="^bench-", request_timeout_s=120))
        answer_groups(probe, groups)
        per_cycle: list[dict] = []
        first: dict[str, float] = {}
        PARTIAL["current"] = {"partitions": n, "first_cycle": first, "cycles": per_cycle}
        drive(probe, mc, timer if phases else None, WARMUP_CYCLES, cycles, per_cycle, first)
    finally:
        if probe is not None:
            probe.close()
        uninstall()
        mc.stop()
    med = lambda key: statistics.median(c[key] for c in per_cycle)  # noqa: E731
    lags = [c["observation_lag_s"] for c in per_cycle if c["observation_lag_s"] is not None]
    out = {
        "partitions": n,
        "group_partitions": sum(len(v) for v in groups.values()),
        "groups": len(groups),
        "events_per_cycle": med("events"),
        "cycle_wall_s": med("cycle_wall_s"),
        "cycle_cpu_s": med("cycle_cpu_s"),
        "interval_cpu_s": med("interval_cpu_s"),
        "cpu_s_per_1000_partitions_per_cycle": med("interval_cpu_s") / (n / 1000),
        "events_per_s": statistics.median(c["events"] / c["cycle_wall_s"] for c in per_cycle),
        "broker_cpu_s_per_cycle": med("broker_cpu_s"),
        "observation_lag_s": statistics.median(lags) if lags else None,
        "dropped": sum(c["dropped"] for c in per_cycle),
        "rss_mb": max(c["rss_mb"] for c in per_cycle),
        "first_cycle": first,
        "cycles": per_cycle,
    }
    if phases:
        out["phases"] = {p: {k: statistics.median(c["phases"].get(p, {}).get(k, 0.0) for c in per_cycle)
                             for k in ("wall_s", "cpu_s", "main_thread_cpu_s")} for p in PHASES}
    return out


def median_of_runs(runs: list[dict]) -> dict:
    keys = ["partitions", "group_partitions", "groups", "events_per_cycle", "cycle_wall_s", "cycle_cpu_s", "interval_cpu_s",
            "cpu_s_per_1000_partitions_per_cycle", "events_per_s", "broker_cpu_s_per_cycle"]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["dropped"] = sum(r["dropped"] for r in runs)
    out["rss_mb"] = max(r["rss_mb"] for r in runs)
    out["first_cycle_wall_s"] = statistics.median(r["first_cycle"]["wall_s"] for r in runs)
    out["first_cycle_cpu_s"] = statistics.median(r["first_cycle"]["cpu_s"] for r in runs)
    if all("phases" in r for r in runs):
        out["phases"] = {p: {k: statistics.median(r["phases"][p][k] for r in runs)
                             for k in ("wall_s", "cpu_s", "main_thread_cpu_s")} for p in PHASES}
    out["runs"] = runs
    return out


def machine() -> dict:
    info = report.machine_info()
    import confluent_kafka
    info["confluent_kafka"] = confluent_kafka.version()[0]
    info["librdkafka"] = confluent_kafka.libversion()[0]
    info["code"] = str(pathlib.Path(probe_mod.__file__).parent)
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[10000, 30000, 100000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--interval", type=float, default=10.0, help="the probe's interval_s (default 10, its default)")
    ap.add_argument("--no-phases", action="store_true", help="do not time phases (no wrappers)")
    ap.add_argument("--label", default="", help="a name for this code version (before, after, ...)")
    ap.add_argument("--baseline", help="a results file of this benchmark to include as the comparison")
    ap.add_argument("--note", default="", help="free text stored with the results (load on the machine, ...)")
    ap.add_argument("--group-topics", type=int, default=GROUP_TOPICS,
                    help=f"topics per consumer group (default {GROUP_TOPICS}: 1,000 group partitions each)")
    ap.add_argument("--max-rss-mb", type=float, default=8000, help="stop (saving what was measured) above this RSS")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "probe.json"))
    args = ap.parse_args()
    mach = machine()
    extra: dict[str, Any] = {}
    if args.baseline:
        base = json.loads(pathlib.Path(args.baseline).read_text())
        # report.write makes the path portable (relative to the checkout, or <tmp>/...)
        extra["baseline"] = {"file": str(pathlib.Path(args.baseline).resolve()), "label": base.get("label"),
                             "when": base.get("when"), "note": base.get("note"),
                             "results": [{k: v for k, v in r.items() if k != "runs"} for r in base["results"]]}
    results: list[dict] = PARTIAL["results"]

    def save(stopped: str = "") -> None:
        mach["loadavg_at_end"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
        more = dict(extra)
        if stopped:
            more["stopped"] = stopped
            more["incomplete_run"] = PARTIAL["current"]
        report.write(args.out, "probe", machine=mach, label=args.label, note=args.note, runs=args.runs,
                     cycles=args.cycles, interval_s=args.interval, group_topics=args.group_topics,
                     broker="librdkafka mock cluster, own process",
                     results=results, **more)

    watchdog(args.max_rss_mb, save)
    for n in args.partitions:
        runs = []
        for r in range(args.runs):
            print(f"[bench] {n} partitions, run {r + 1}/{args.runs} ...", file=sys.stderr, flush=True)
            runs.append(one_run(n, args.cycles, args.interval, not args.no_phases, args.group_topics))
            x = runs[-1]
            print(f"[bench]   cycle {x['cycle_wall_s']:.2f} s wall, {x['cycle_cpu_s']:.2f} CPU-s; "
                  f"{x['cpu_s_per_1000_partitions_per_cycle']:.4f} CPU-s/1k partitions/interval",
                  file=sys.stderr, flush=True)
        results.append(median_of_runs(runs))
        save()
    print(f"{'partitions':>10} {'events/cycle':>12} {'cycle wall s':>12} {'cycle CPU s':>11} "
          f"{'CPU s/1k part/cycle':>20} {'dropped':>8}")
    for m in results:
        print(f"{m['partitions']:>10} {m['events_per_cycle']:>12.0f} {m['cycle_wall_s']:>12.2f} "
              f"{m['cycle_cpu_s']:>11.2f} {m['cpu_s_per_1000_partitions_per_cycle']:>20.4f} {m['dropped']:>8}")
        for p, v in m.get("phases", {}).items():
            if v["wall_s"] or v["cpu_s"]:
                print(f"{'':>10}   {p:<14} {v['wall_s']:>7.3f} s wall {v['cpu_s']:>7.3f} CPU-s "
                      f"({v['main_thread_cpu_s']:.3f} in the main thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
