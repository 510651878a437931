"""What reading every watched topic's ``min.insync.replicas`` costs the probe, on real Kafka.

Issue 33: a runtime change of ``min.insync.replicas`` (per topic, or the brokers' default)
changes what acks=all writes survive, so the probe should see it within an interval or two,
not ``config_refresh_s`` = 300 s later.  DescribeConfigs is per topic, not per partition, and a
broker answers it from its metadata image: the cost grows with the topics.  100k partitions
are a few thousand topics (at 20 partitions each, 5,000), so this creates ``--topics`` topics of
one partition each on a one-broker KRaft cluster (``kafka_monitor.local.kafka_cluster``;
partitions would only slow the setup) and times, ``--repeats`` times each:

- ``describe_configs``: one call for every topic, until every future answered and each topic's
  value was read.  The broker answers every config entry of each topic (33 on Kafka 4): the
  protocol can name the keys wanted, but confluent-kafka's ``describe_configs`` does not send
  them (``ConfigResource(set_config=...)`` still gets all 33);
- the probe's re-reads as its refreshes run them (``TopicConfigs.min_isr``, ``config_refresh_s``
  0: at every call, at most ``CONFIG_REREAD_MAX`` topics, the answer used at the next call):
  the calls until every topic was read again once, the longest call (what a refresh waits),
  and the CPU of the round (``time.process_time``: this process, librdkafka's threads
  included), per topic;
- the probe's first read of every topic (``min_isr`` with nothing read yet: it waits).

Medians are printed and written to ``bench/results/config-cost.json``.

    python bench/config_cost_bench.py                   # 5,000 topics, 5 repeats
    python bench/config_cost_bench.py --topics 500 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType  # noqa: E402

from kafka_monitor.local.kafka_cluster import KafkaCluster  # noqa: E402
from monitor.probe import Probe  # noqa: E402
from monitor.probe_config import ProbeConfig  # noqa: E402
from monitor.topic_configs import CONFIG_REREAD_MAX  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], list[float], Any]:
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return walls, cpus, out


def create(admin: AdminClient, names: list[str], log: Callable[[str], None]) -> None:
    batch = 500
    for i in range(0, len(names), batch):
        futs = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1)
                                    for n in names[i:i + batch]], request_timeout=120)
        for f in futs.values():
            f.result(180)
        log(f"created {min(i + batch, len(names))}/{len(names)} topics")
    deadline = time.monotonic() + 300
    while True:  # the broker answers DescribeConfigs from its metadata image, which follows a moment later
        known = admin.list_topics(timeout=60).topics
        if all(n in known and known[n].error is None for n in names):
            return
        if time.monotonic() > deadline:
            raise SystemExit("the created topics did not all appear in the metadata within 300 s")
        time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=5000, help="topics to create and describe (default 5000)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each way (default 5)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/config-cost.json"))
    args = ap.parse_args()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    names = [f"cfg.t{i:05d}" for i in range(args.topics)]
    with KafkaCluster(broker_ids=(1,), broker_heap="1G") as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap_servers})
        t = time.perf_counter()
        create(admin, names, log)
        log(f"{len(names)} topics in {time.perf_counter() - t:.0f} s")

        def all_entries() -> tuple[int, dict]:  # noqa: E306
            futs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names], request_timeout=120)
            entries, values = 0, {}
            for res, fut in futs.items():
                got = fut.result()
                entries += len(got)
                e = got.get("min.insync.replicas")
                values[res.name] = None if e is None else int(e.value)
            return entries, values

        probe = Probe(ProbeConfig(bootstrap_servers=c.bootstrap_servers, events_topic="cfg.events",
                                  config_refresh_s=0.0))
        configs = probe.topic_configs
        try:
            def probe_call() -> dict:
                configs._read_at.clear()
                return configs.min_isr(names)

            def reread_round() -> dict:
                """The probe's re-reads as its refreshes run them (config_refresh_s 0): calls of
                min_isr, 0.2 s apart, until every topic was read again once."""
                reads0, calls, call_s = configs.config_reads, 0, []
                while configs.config_reads - reads0 < len(names):
                    w = time.perf_counter()
                    configs.min_isr(names, 1)
                    call_s.append(time.perf_counter() - w)
                    calls += 1
                    time.sleep(0.2)
                return {"calls": calls, "call_s_max": round(max(call_s), 4)}

            results: dict[str, Any] = {}
            configs.min_isr(names, 1)  # the first reads
            walls, cpus, out = timed(reread_round, args.repeats)
            sleeps = [0.2 * r["calls"] for r in [out]]
            results["probe_reread_round"] = {
                "what": f"every topic read again once, CONFIG_REREAD_MAX = {CONFIG_REREAD_MAX} a call",
                "cpu_s_median": round(statistics.median(cpus), 4), "calls": out["calls"],
                "call_s_max_last": out["call_s_max"],
                "cpu_ms_per_topic": round(1000 * statistics.median(cpus) / len(names), 3),
                "wall_s_median_without_sleeps": round(statistics.median(walls) - sleeps[0], 4)}
            log(f"probe re-read round: {out['calls']} calls, cpu median {statistics.median(cpus):.3f} s "
                f"({1000 * statistics.median(cpus) / len(names):.3f} ms a topic), longest call {out['call_s_max']:.3f} s")
            for label, fn in (("describe_configs", all_entries), ("probe", probe_call)):
                fn()  # warm: connections, the broker's first answer
                walls, cpus, out = timed(fn, args.repeats)
                values = out if label == "probe" else out[1]
                assert len(values) == len(names) and all(v is not None for v in values.values()), label
                results[label] = {"wall_s_median": round(statistics.median(walls), 4),
                                  "wall_s": [round(w, 4) for w in walls],
                                  "cpu_s_median": round(statistics.median(cpus), 4),
                                  "entries": None if label == "probe" else out[0]}
                log(f"{label}: wall median {statistics.median(walls):.3f} s, cpu median "
                    f"{statistics.median(cpus):.3f} s" + ("" if label == "probe" else f", {out[0]} entries"))
        finally:
            probe.close(flush_timeout=1)
    record = {"what": "describe_configs of every topic's min.insync.replicas", "topics": args.topics,
              "repeats": args.repeats, "results": results,
              "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    pathlib.Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    log(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
