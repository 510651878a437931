"""The probe's cycles while one broker is paused (SIGSTOP), on the real 3-broker cluster.

Issue 33: a paused broker answers nothing and closes nothing, so every request sent to it waits
its whole timeout.  This benchmark runs the probe (``Probe.run()``, in this process) against the
real cluster with the monitor's own events topic there (RF 3, min ISR 1), a producer and a
committing consumer group, then pauses the broker that coordinates the group (so that the
coordinator requests, the group listing, the metadata and the offsets all meet it), resumes it,
and pauses it again each repeat.  Per observation it records when it started, how long it took
and its phases (wrapped methods), and per metadata refresh its outcome.

Printed and written (``bench/results/probe-pause.json``), per state (healthy / paused / after):

- the cycle (``Probe.last_cycle_s``: the refreshes since the previous observation + the
  observation) p50 / p95 / max;
- the gap between observation starts (what the job's SourceSilent and PartitionUnobserved see)
  and between successful metadata refreshes (MetadataStale), max;
- the share of partitions whose offsets each observation reported, min;
- phases: wall seconds per observation, max, for committed / group_states / watermarks / metadata.

    python bench/probe_pause_bench.py                       # interval 5 s, 2 pauses of 40 s
    python bench/probe_pause_bench.py --interval 10 --pause 30 --repeats 1 --label before
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import sys
import threading
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka_monitor.local.kafka_cluster import KafkaCluster  # noqa: E402
from kafka_monitor.local.workload import consume_loop, produce_loop  # noqa: E402
from monitor.probe import Probe  # noqa: E402
from monitor.probe_config import ProbeConfig  # noqa: E402

EVENTS = "kafka-monitor.events"
TOPIC = "pause.orders"
GROUP = "pause-app"
#: (method, phase): a method of the probe, or of one of its parts ("part.method")
PHASES = [("_committed_offsets", "committed"), ("_group_states", "group_states"), ("_watermarks", "watermarks"),
          ("refresh_metadata", "metadata"), ("topic_configs.min_isr", "min_isr")]


class Recorder:
    """Observations and refreshes of one probe, stamped with the state of the fault."""

    def __init__(self, probe: Probe) -> None:
        self.state = "healthy"
        self.observations: list[dict] = []
        self.refreshes: list[dict] = []
        self._phases: dict[str, float] = collections.defaultdict(float)
        self._main = None
        for method, phase in PHASES:
            self._wrap(probe, method, phase)
        if hasattr(probe._coordinator, "collect"):  # the coordinator's answers are waited for here
            self._wrap(probe._coordinator, "collect", "committed")
        observe, refresh = probe.observe, probe.refresh_metadata
        self._probe = probe

        def timed_observe() -> None:
            t0 = time.monotonic()
            state = self.state
            observe()
            p = probe
            seen = self._last_offsets
            self.observations.append({"at": t0, "state": state, "state_after": self.state,
                                      "cycle_s": p.last_cycle_s, "observe_s": time.monotonic() - t0,
                                      "partitions": len(p._watched_partitions), "offsets": seen,
                                      "phases": {k: round(v, 3) for k, v in self._phases.items()}})
            self._phases.clear()

        def timed_refresh() -> bool:
            t0 = time.monotonic()
            ok = refresh()
            self.refreshes.append({"at": t0, "state": self.state, "ok": bool(ok), "s": time.monotonic() - t0})
            return ok

        self._last_offsets = 0
        watermarks = probe._watermarks

        def counted(*a, **kw):
            out = watermarks(*a, **kw)
            self._last_offsets = len(out[0])
            return out

        probe._watermarks = counted
        probe.observe, probe.refresh_metadata = timed_observe, timed_refresh

    def _wrap(self, probe: Any, method: str, phase: str) -> None:
        part, _, method = method.rpartition(".")
        owner = getattr(probe, part) if part else probe
        fn: Callable[..., Any] = getattr(owner, method)

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*a, **kw)
            finally:
                self._phases[phase] += time.monotonic() - t0
        setattr(owner, method, timed)


def coordinator_of(cluster: KafkaCluster, group: str, timeout: float = 60.0) -> int:
    """The broker coordinating ``group`` (asked again while the coordinator moves)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            d = cluster.admin().describe_consumer_groups([group], request_timeout=10)[group].result()
            if d.coordinator is not None:
                return d.coordinator.id
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def summarize(rec: Recorder, interval: float) -> dict:
    out = {}
    obs = rec.observations
    for state in ("healthy", "paused", "after"):
        sel = [o for o in obs if o["state"] == state or o["state_after"] == state]
        if not sel:
            continue
        cycles = [o["cycle_s"] for o in sel if o["cycle_s"] is not None]
        idx = [i for i, o in enumerate(obs) if o in sel]
        gaps = [obs[i + 1]["at"] - obs[i]["at"] for i in idx if i + 1 < len(obs)]
        ok = [r["at"] for r in rec.refreshes if r["ok"]]
        spans = [(r["at"], r["state"]) for r in rec.refreshes]
        refresh_gaps = [b - a for a, b in zip(ok, ok[1:])
                        if any(s == state for t, s in spans if a <= t <= b)]
        phases = {name: round(max(o["phases"].get(name, 0.0) for o in sel), 2) for _, name in PHASES}
        out[state] = {
            "observations": len(sel),
            "cycle_s": {"p50": round(pct(cycles, 0.5), 2), "p95": round(pct(cycles, 0.95), 2),
                        "max": round(max(cycles), 2) if cycles else None},
            "observation_gap_max_s": round(max(gaps), 2) if gaps else None,
            "refresh_ok_gap_max_s": round(max(refresh_gaps), 2) if refresh_gaps else None,
            "refreshes_failed": sum(1 for r in rec.refreshes if r["state"] == state and not r["ok"]),
            "offsets_seen_min_share": round(min(o["offsets"] / o["partitions"] for o in sel if o["partitions"]), 2)
            if any(o["partitions"] for o in sel) else None,
            "phase_max_s": phases,
            "over_interval": sum(1 for c in cycles if c > interval),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=5.0, help="the probe's interval_s (default 5)")
    ap.add_argument("--pause", type=float, default=40.0, help="seconds each pause lasts (default 40)")
    ap.add_argument("--repeats", type=int, default=2, help="pauses, each followed by a recovery (default 2)")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds healthy before and after each pause")
    ap.add_argument("--label", default="", help="a label stored with the results (e.g. before)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/probe-pause.json"))
    ap.add_argument("--baseline", default=None, help="a results file of an earlier run (e.g. the code before a "
                    "change): its summary is stored with this run's, under 'baseline'")
    args = ap.parse_args()

    cluster = KafkaCluster(keep_work_dir=bool(os.environ.get("KAFKA_MONITOR_KEEP_KAFKA")))
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        t0 = time.monotonic()
        cluster.start()
        print(f"cluster up in {time.monotonic() - t0:.0f}s: {cluster.bootstrap_servers}", flush=True)
        cluster.create_topic(EVENTS, partitions=6, rf=3, config={"min.insync.replicas": "1"})
        cluster.create_topic(TOPIC, partitions=12, rf=3, config={"min.insync.replicas": "2"})
        bs = cluster.bootstrap_servers
        threads = [threading.Thread(target=produce_loop, args=(bs, stop), kwargs={"topic": TOPIC, "rate_per_s": 100},
                                    daemon=True),
                   threading.Thread(target=consume_loop, args=(bs, stop), daemon=True,
                                    kwargs={"topic": TOPIC, "group": GROUP, "pause_s": 0})]
        for t in threads:
            t.start()
        probe = Probe(ProbeConfig(bootstrap_servers=bs, events_topic=EVENTS, cluster="pause", source="pause-bench",
                                  interval_s=args.interval, topics_exclude="^(__|kafka-monitor)"))
        rec = Recorder(probe)
        probe_stop = threading.Event()
        runner = threading.Thread(target=probe.run, args=(probe_stop,), name="probe", daemon=True)
        runner.start()
        time.sleep(args.settle)
        # the same broker every repeat: after a pause the coordinator answers NOT_COORDINATOR for
        # a while (the group's load moves), so it is found once, on the healthy cluster
        victim = coordinator_of(cluster, GROUP)
        for i in range(args.repeats):
            print(f"pause {i + 1}: broker {victim} (coordinator of {GROUP}) for {args.pause:.0f}s", flush=True)
            rec.state = "paused"
            cluster.pause_broker(victim)
            try:
                time.sleep(args.pause)
            finally:
                cluster.resume_broker(victim)
            rec.state = "after"
            print(f"resumed {victim}", flush=True)
            time.sleep(args.settle)
        probe_stop.set()
        runner.join(60)
        probe.close(flush_timeout=5)
        summary = summarize(rec, args.interval)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        cluster.stop()
    result = {"benchmark": "probe-pause", "label": args.label, "interval_s": args.interval, "pause_s": args.pause,
              "repeats": args.repeats, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "summary": summary, "warnings": probe.warnings,
              "baseline": ({k: v for k, v in json.loads(pathlib.Path(args.baseline).read_text()).items()
                            if k in ("label", "summary", "warnings", "interval_s", "pause_s", "repeats")}
                           if args.baseline else None),
              "observations": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in o.items()}
                               for o in rec.observations]}
    print(json.dumps(summary, indent=1))
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
