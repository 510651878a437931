"""HA CPU benchmark: what each probe of an HA group costs, in CPU, with 1, 2 and 4 probes sharing
one cluster of 100,000 partitions (issue 49).

librdkafka's mock cluster (3 brokers, ``bench/mock_cluster_server.py``) runs in a process of its
own and holds everything: the watched topics (100 partitions each, replication factor 3), the
events topic, and the shard topic of each group (64 shards).  Its consumer groups carry the HA
group's cooperative-sticky membership (the mock coordinates classic groups).  The consumer groups
and committed offsets are probe_bench's (groups of ``--group-topics`` topics, every partition
committed; the mock does not implement ListGroups, so the listing is answered in the probe
process, as probe_bench does).

Each probe is a process of its own (``--child``), running ``Probe.run()`` as ``kafka-monitor
probe --ha-group`` does, and prints after each observation its CPU time so far (its threads,
and the child process it asks group coordinators from), the shards it holds and the partitions it
watches.  A run starts ``n`` probes in a fresh group, waits until the group has settled (all 64
shards held, no change for ``--warmup`` observations of every probe), then measures ``--cycles``
observations of each probe: its CPU over those intervals (idle work included) divided by the
observations.  The mock's own CPU over the same window is reported too (what the brokers' side
of n probes costs, here the mock's).

Two cores run everything (the probes, the mock): with several probes their cycles overlap, which
stretches wall times but not CPU time.  Figures are medians over the probes of a run, then over
runs.

    python bench/ha_cpu_bench.py                                # 100k partitions, 1 2 4 probes, 3 runs
    python bench/ha_cpu_bench.py --partitions 10000 --probes 1 2 --runs 1 --cycles 3
    python bench/ha_cpu_bench.py --label before --out /tmp/ha-cpu-before.json
    python bench/ha_cpu_bench.py --baseline /tmp/ha-cpu-before.json   # adds those figures to the file

Prints a table and writes ``bench/results/ha-cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import probe_bench as pb  # noqa: E402  (bench/probe_bench.py: the mock, groups, CPU readers)
import report  # noqa: E402  (bench/report.py)

SHARDS = 64


def shard_topic(group: str) -> str:
    from monitor.shards import shard_topic as name
    return name(group)


# -- one probe (a child process) --------------------------------------------------------------------

def child(args: argparse.Namespace) -> int:
    from monitor.probe import Probe
    from monitor.probe_config import ProbeConfig

    n_topics = max(1, args.partitions // pb.TOPIC_PARTITIONS)
    groups = pb._groups(n_topics, args.group_topics)
    probe = Probe(ProbeConfig(bootstrap_servers=args.bootstrap, interval_s=args.interval, source=args.source,
                              cluster="bench", topics_include="^bench-", request_timeout_s=120,
                              ha_group=args.ha_group, shards=SHARDS))
    pb.answer_groups(probe, groups)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    observe = probe.observe

    def reported() -> None:
        observe()
        owned = probe.membership.owned() if probe.membership is not None else {}
        print(json.dumps({"t": time.monotonic(), "cpu_s": time.process_time() + pb.child_cpu_s(probe),
                          "cycles": probe.cycles, "held": len(owned), "partitions": len(probe._watched_partitions),
                          "events": probe.emitter._seq, "rss_mb": pb.rss_mb()}), flush=True)

    probe.observe = reported  # type: ignore[method-assign]
    try:
        probe.run(stop)
    finally:
        probe.close()
    return 0


# -- the benchmark ---------------------------------------------------------------------------------

class Child:
    """One probe process and the lines it printed (a reader thread puts them on a queue)."""

    def __init__(self, args: argparse.Namespace, bootstrap: str, group: str, source: str) -> None:
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", "--bootstrap", bootstrap,
               "--ha-group", group, "--source", source, "--interval", str(args.interval),
               "--partitions", str(args.partitions), "--group-topics", str(args.group_topics)]
        self.source = source
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: list[dict] = []
        self._q: "queue.Queue[dict]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._q.put(json.loads(line))

    def drain(self) -> None:
        while True:
            try:
                self.lines.append(self._q.get_nowait())
            except queue.Empty:
                return

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def settled_since(children: list[Child], warmup: int) -> Optional[list[int]]:
    """Each child's line index from which the window may start: the group holds all shards and
    no child's count has changed for ``warmup`` observations; None while not settled."""
    starts = []
    for c in children:
        if len(c.lines) < warmup + 1:
            return None
        last = c.lines[-1]["held"]
        same = 0
        for line in reversed(c.lines):
            if line["held"] != last:
                break
            same += 1
        if same < warmup + 1:
            return None
        starts.append(len(c.lines) - 1)
    if sum(c.lines[-1]["held"] for c in children) != SHARDS:
        return None
    return starts


def one_run(args: argparse.Namespace, mc: pb.MockClusterProcess, n: int, run: int) -> dict:
    group = f"bench-n{n}-r{run}"
    children = [Child(args, mc.bootstrap, group, f"probe-{i}") for i in range(n)]
    try:
        deadline = time.monotonic() + args.settle_timeout
        starts = None
        while starts is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} probes did not settle within {args.settle_timeout:.0f}s: "
                                   f"{[c.lines[-1] if c.lines else None for c in children]}")
            for c in children:
                if c.proc.poll() is not None:
                    raise RuntimeError(f"probe {c.source} exited with {c.proc.returncode}")
            time.sleep(0.5)
            for c in children:
                c.drain()
            starts = settled_since(children, args.warmup)
        broker0 = mc.cpu_s()
        t0 = time.monotonic()
        while not all(len(c.lines) - 1 - s >= args.cycles for c, s in zip(children, starts)):
            if time.monotonic() - t0 > args.cycles * args.interval * 4 + 120:
                raise RuntimeError(f"{n} probes: {args.cycles} observations not done in time")
            time.sleep(0.5)
            for c in children:
                c.drain()
        broker_s = mc.cpu_s() - broker0
        window_s = time.monotonic() - t0
        probes = []
        for c, s in zip(children, starts):
            a, b = c.lines[s], c.lines[s + args.cycles]
            cycles = b["cycles"] - a["cycles"]
            held = [line["held"] for line in c.lines[s:s + args.cycles + 1]]
            probes.append({"source": c.source, "shards": b["held"], "partitions": b["partitions"],
                           "cpu_s_per_cycle": (b["cpu_s"] - a["cpu_s"]) / cycles,
                           "interval_s": (b["t"] - a["t"]) / cycles,
                           "events_per_cycle": (b["events"] - a["events"]) / cycles, "rss_mb": b["rss_mb"],
                           "held_changed": len(set(held)) > 1})
        return {"probes": n, "run": run, "per_probe": probes,
                "total_cpu_s_per_cycle": sum(p["cpu_s_per_cycle"] for p in probes),
                "broker_cpu_s_per_cycle": broker_s / window_s * args.interval}
    finally:
        for c in children:
            c.stop()


def summarize(runs: list[dict], partitions: int) -> dict:
    k = partitions / 1000
    per_probe = [statistics.median(p["cpu_s_per_cycle"] for p in r["per_probe"]) for r in runs]
    worst = [max(p["cpu_s_per_cycle"] for p in r["per_probe"]) for r in runs]
    total = [r["total_cpu_s_per_cycle"] for r in runs]
    return {"probes": runs[0]["probes"], "runs": len(runs),
            "cpu_s_per_cycle_per_probe": statistics.median(per_probe),
            "cpu_s_per_cycle_busiest_probe": statistics.median(worst),
            "cpu_s_per_1000_partitions_per_cycle_per_probe": statistics.median(per_probe) / k,
            "cpu_s_per_1000_partitions_per_cycle_all_probes": statistics.median(total) / k,
            "total_cpu_s_per_cycle": statistics.median(total),
            "partitions_per_probe": statistics.median(p["partitions"] for r in runs for p in r["per_probe"]),
            "events_per_cycle_all_probes": statistics.median(sum(p["events_per_cycle"] for p in r["per_probe"])
                                                             for r in runs),
            "broker_cpu_s_per_cycle": statistics.median(r["broker_cpu_s_per_cycle"] for r in runs),
            "rss_mb_per_probe": statistics.median(p["rss_mb"] for r in runs for p in r["per_probe"]),
            "interval_s": statistics.median(p["interval_s"] for r in runs for p in r["per_probe"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=100_000)
    ap.add_argument("--probes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=5, help="observations measured per probe and run")
    ap.add_argument("--warmup", type=int, default=2, help="observations with no shard moving before measuring")
    ap.add_argument("--interval", type=float, default=10.0, help="the probes' interval_s (default 10, its default)")
    ap.add_argument("--group-topics", type=int, default=pb.GROUP_TOPICS)
    ap.add_argument("--settle-timeout", type=float, default=300.0)
    ap.add_argument("--label", default="", help="a name for this code version (before, after, ...)")
    ap.add_argument("--baseline", help="a results file of this benchmark to include as the comparison")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ha-cpu.json"))
    # a probe process (started by the benchmark itself)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--ha-group", help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the probes and the mock stopped too
    n_topics = max(1, args.partitions // pb.TOPIC_PARTITIONS)
    partitions = n_topics * pb.TOPIC_PARTITIONS
    shard_topics = [f"{shard_topic(f'bench-n{n}-r{r}')}:{SHARDS}:3" for n in args.probes for r in range(args.runs)]
    print(f"[ha-cpu] mock cluster: {partitions:,} partitions; committing the groups' offsets", flush=True)
    mc = pb.MockClusterProcess(n_topics, pb.TOPIC_PARTITIONS, extra_topics=shard_topics)
    results = []
    try:
        pb.commit_groups(mc.bootstrap, n_topics, args.group_topics)
        for n in args.probes:
            runs = []
            for r in range(args.runs):
                t0 = time.monotonic()
                one = one_run(args, mc, n, r)
                runs.append(one)
                print(f"[ha-cpu] {n} probe(s), run {r + 1}/{args.runs}: CPU-s per cycle per probe "
                      f"{[round(p['cpu_s_per_cycle'], 2) for p in one['per_probe']]}, all "
                      f"{one['total_cpu_s_per_cycle']:.2f}, mock {one['broker_cpu_s_per_cycle']:.2f} "
                      f"({time.monotonic() - t0:.0f}s)", flush=True)
            results.append({**summarize(runs, partitions), "each_run": runs})
    finally:
        mc.stop()
    one_probe = results[0]["cpu_s_per_cycle_per_probe"] if results and results[0]["probes"] == 1 else None
    head = ["probes", "partitions/probe", "CPU-s/cycle/probe", "busiest", "per 1k part.", "all probes",
            "per probe / 1 probe", "mock CPU-s/cycle", "RSS MB/probe"]
    print("  ".join(f"{h:>12}" for h in head))
    for s in results:
        row = [s["probes"], f"{s['partitions_per_probe']:,.0f}", f"{s['cpu_s_per_cycle_per_probe']:.2f}",
               f"{s['cpu_s_per_cycle_busiest_probe']:.2f}", f"{s['cpu_s_per_1000_partitions_per_cycle_per_probe']:.4f}",
               f"{s['total_cpu_s_per_cycle']:.2f}",
               f"{s['cpu_s_per_cycle_per_probe'] / one_probe:.2f}" if one_probe else "-",
               f"{s['broker_cpu_s_per_cycle']:.2f}", f"{s['rss_mb_per_probe']:.0f}"]
        print("  ".join(f"{v:>12}" for v in row))
    figures: dict[str, Any] = {"label": args.label, "note": args.note,
                               "settings": {"partitions": partitions, "shards": SHARDS, "interval_s": args.interval,
                                            "runs": args.runs, "cycles": args.cycles, "warmup": args.warmup,
                                            "group_topics": args.group_topics},
                               "results": results}
    if args.baseline:
        figures["baseline"] = json.loads(pathlib.Path(args.baseline).read_text())
    report.write(args.out, "ha-cpu", machine=report.machine_info(), **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
