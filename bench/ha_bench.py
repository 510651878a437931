"""Probes of an HA group on a real cluster (issue 49): what 1 and 3 probes ask of the brokers, and
how long a killed probe's shards go unobserved.

A cluster of the launcher's own (one controller, three brokers) with Kafka's request logger on
(``KafkaCluster(request_log=True)``: every completed request, with its client id, in each
broker's ``kafka-request.log``); ``--topics`` topics of ``--partitions`` partitions with writes
flowing to the first two and two consumer groups committing; the events topic on the same
cluster.  Probes are ``kafka-monitor probe`` processes with ``--ha-group``, 64 shards, every
second, the quorum every 10 s, and ``-X client.id=<source>``, so that the brokers' request log
names the probe of every request (the group membership's own clients are named
``kafka-monitor-ha-<source>`` and ``kafka-monitor-ha-claims-<source>``).

1. **Requests and events, 1 and 3 probes.**  One probe alone in a group, then three in another:
   once every shard is held, for ``--window`` seconds, the requests per API the brokers logged for
   the probes (per second), and the events per second the probes sent (read back from the
   events topic; a liveness event counts once).  The membership's requests (JoinGroup, SyncGroup,
   Heartbeat, the claims' Produce) are counted apart from the probing.
2. **Handover, ``--kills`` times.**  With the three probes running, one is SIGKILLed (in turn);
   timed from the kill to the moment every partition of its shards has been observed by another
   probe (the first such ``partition_offsets``'s ``observed_at``); then a new probe takes its
   place and the next kill waits until all three hold shards again.  p50 and p95.

    python bench/ha_bench.py                     # ~8 min on 2 cores
    python bench/ha_bench.py --kills 3 --window 15

Prints each figure, and writes bench/results/ha.json.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402  (bench/report.py)

SHARDS = 64
PREFIX = "hab"
_REQUEST = re.compile(r'"clientId":"([^"]*)","requestApiKeyName":"([A-Z_]+)"')
#: what a request of these APIs asks for, counted in its body: partitions (ListOffsets), groups
#: (OffsetFetch, DescribeGroups), named topics (Metadata: "topics":null asks for every topic)
_ITEMS = {"LIST_OFFSETS": re.compile(rb'"partitionIndex"'), "OFFSET_FETCH": re.compile(rb'"groupId"'),
          "DESCRIBE_GROUPS": re.compile(rb'"groups":\[([^\]]*)\]')}
MEMBERSHIP_APIS = ("JOIN_GROUP", "SYNC_GROUP", "HEARTBEAT", "LEAVE_GROUP", "FIND_COORDINATOR")


class RequestLog:
    """The brokers' request logs, read from where the last ``since()`` left them."""

    def __init__(self, files: list[Path]):
        self.files = files
        self.at = {f: 0 for f in files}

    def mark(self) -> None:
        self.at = {f: (f.stat().st_size if f.exists() else 0) for f in self.files}

    def count(self, names: list[str]) -> dict[str, dict[str, int]]:
        """Requests since the mark, by API: {"probing": ..., "membership": ...} for the clients
        of the probes ``names``; "items": what the probing requests asked for (``_ITEMS``), the
        topics named in Metadata requests and the partitions in the Metadata answers (whole and
        named: what the brokers described), and "metadata_all_topics": the Metadata requests for
        every topic."""
        out: dict[str, dict[str, int]] = {"probing": {}, "membership": {}, "items": {}, "metadata_all_topics": {}}
        for f in self.files:
            if not f.exists():
                continue
            with open(f, "rb") as fh:
                fh.seek(self.at[f])
                for raw in fh:
                    m = _REQUEST.search(raw[:400].decode("utf-8", "replace"))
                    if m is None:
                        continue
                    client, api = m.group(1), m.group(2)
                    owner = next((n for n in names if client == n or client.endswith(f"-{n}")), None)
                    if owner is None:
                        continue
                    kind = "membership" if client.startswith("kafka-monitor-ha-") else "probing"
                    out[kind][api] = out[kind].get(api, 0) + 1
                    if kind != "probing":
                        continue
                    body, _, answer = raw.partition(b',"response":')
                    if api == "METADATA":  # what the brokers answered: partitions, whole listings and named
                        out["items"]["METADATA_PARTITIONS_ANSWERED"] = (out["items"].get("METADATA_PARTITIONS_ANSWERED", 0)
                                                                        + answer.count(b'"partitionIndex"'))
                    if api in _ITEMS:
                        found = _ITEMS[api].findall(body)
                        n = (sum(x.count(b'"') // 2 for x in found) if api == "DESCRIBE_GROUPS" else len(found))
                        out["items"][api] = out["items"].get(api, 0) + n
                    elif api == "METADATA" and b'"topics":null' in body:
                        out["metadata_all_topics"]["METADATA"] = out["metadata_all_topics"].get("METADATA", 0) + 1
                    elif api == "METADATA":  # topics by name (an HA probe's own, a leader looked up)
                        out["items"]["METADATA_NAMED_TOPICS"] = (out["items"].get("METADATA_NAMED_TOPICS", 0)
                                                                 + body.count(b'"name":'))
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=24, help="topics watched (default 24)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")
    ap.add_argument("--window", type=float, default=30.0, help="seconds counted with 1 and with 3 probes (default 30)")
    ap.add_argument("--kills", type=int, default=10, help="probes killed, one after the other (default 10)")
    ap.add_argument("--version", default=None, help="Kafka version (default: the launcher's)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ha.json"))
    args = ap.parse_args()

    from kafka_monitor.local.kafka_cluster import KafkaCluster
    from monitor.contract import EVENT_TYPES
    from tests.conftest import wait_for
    from tests.support.ha_probes import ProbeProcess
    from tests.support.kraft_stack import Committer, Tail
    from tests.support.real_cluster import MultiTopicWriter

    tmp = Path(tempfile.mkdtemp(prefix="ha-bench-"))
    figures: dict[str, Any] = {"settings": {"topics": args.topics, "partitions": args.partitions, "shards": SHARDS,
                                            "interval_s": 1, "window_s": args.window, "kills": args.kills,
                                            "session_timeout_s": 10}}
    with ExitStack() as s:
        c = KafkaCluster(version=args.version, request_log=True)
        s.callback(c.stop)
        print("starting a cluster (1 controller, 3 brokers, request log on)...", flush=True)
        c.start()
        topics = [f"{PREFIX}.{i}" for i in range(args.topics)]
        for t in topics:
            c.create_topic(t, partitions=args.partitions)
        events = f"{PREFIX}.events"
        c.create_topic(events, partitions=6)
        parts = {(t, p) for t in topics for p in range(args.partitions)}
        writer = MultiTopicWriter(c.bootstrap_servers, topics[:2]).start()
        s.callback(writer.stop)
        for i in range(2):
            app = Committer(c.bootstrap_servers, topic=topics[i], group=f"{PREFIX}-app{i}")
            app.start()
            s.callback(app.stop)
        tail = Tail(c.bootstrap_servers, events, EVENT_TYPES, name="ha-bench")
        tail.start()
        s.callback(tail.stop)
        log = RequestLog(c.request_log_files())
        probes: dict[str, ProbeProcess] = {}

        def add(name: str, group: str) -> ProbeProcess:
            p = probes[name] = ProbeProcess(name, c.bootstrap_servers, events, group, SHARDS, rf"^{PREFIX}\.",
                                            f"^{PREFIX}-", "ha-bench", tmp,
                                            ("--quorum-interval", "10", "--elr-interval", "0", "-X",
                                             f"client.id={name}"))
            s.callback(p.stop)
            return p

        def holdings(names: list[str], since: int) -> dict[str, set[int]]:
            last: dict[str, Any] = {}
            for e in list(tail.events):
                if e.type == "ha_member" and e.source in names and e.observed_at >= since:
                    last[e.source] = e
            return {n: set(e.data.held) for n, e in last.items()}

        def covered(names: list[str], since: int) -> bool:
            h = holdings(names, since)
            return len(h) == len(names) and all(h.values()) and set().union(*h.values()) == set(range(SHARDS)) \
                and sum(len(v) for v in h.values()) == SHARDS

        def window(names: list[str]) -> dict[str, Any]:
            wait_for(lambda: covered(names, int(time.time() * 1000) - 1500), timeout=120,
                     what=f"{len(names)} probe(s) holding the {SHARDS} shards")
            time.sleep(3)
            log.mark()
            t0 = int(time.time() * 1000)
            time.sleep(args.window)
            t1 = int(time.time() * 1000)
            time.sleep(2)  # the last events and requests written
            counted = log.count(names)
            seen = {(e.event_id) for e in list(tail.events) if e.source in names and t0 <= e.observed_at < t1}
            observed = [e for e in list(tail.events) if e.type == "partition_offsets" and e.source in names
                        and t0 <= e.observed_at < t1 and (e.data.topic, e.data.partition) in parts]
            by_part: dict[tuple, set] = {}
            for e in observed:
                by_part.setdefault((e.data.topic, e.data.partition), set()).add(e.source)
            secs = (t1 - t0) / 1000
            cycles = len({(e.source, e.observed_at) for e in list(tail.events) if e.type == "heartbeat"
                          and e.source in names and t0 <= e.observed_at < t1})
            return {"probes": len(names), "cycles_per_s": round(cycles / secs, 2),
                    "items_per_s": {api: round(n / secs, 1) for api, n in sorted(counted["items"].items())},
                    "metadata_all_topics_per_s": round(counted["metadata_all_topics"].get("METADATA", 0) / secs, 2),
                    "requests_per_s": {k: {api: round(n / secs, 2) for api, n in sorted(counted[k].items())}
                                       for k in ("probing", "membership")},
                    "probing_requests_per_s": round(sum(counted["probing"].values()) / secs, 2),
                    "events_per_s": round(len(seen) / secs, 1),
                    "partition_offsets_per_s": round(len(observed) / secs, 1),
                    "partitions_observed": len(by_part), "partitions_observed_by_two": sum(len(v) > 1 for v in
                                                                                          by_part.values())}

        print("1 probe...", flush=True)
        add("hb-solo", "bench-one")
        one = window(["hb-solo"])
        probes.pop("hb-solo").stop()
        print(json.dumps(one, indent=1), flush=True)
        print("3 probes...", flush=True)
        names = ["hb-0", "hb-1", "hb-2"]
        for n in names:
            add(n, "bench-three")
        three = window(names)
        print(json.dumps(three, indent=1), flush=True)
        figures["requests"] = {"one_probe": one, "three_probes": three}
        ratio = {api: round(three["requests_per_s"]["probing"].get(api, 0) / v, 2)
                 for api, v in one["requests_per_s"]["probing"].items() if v}
        figures["requests"]["three_over_one"] = ratio
        print("3 probes / 1 probe, requests per API:", ratio, flush=True)
        # per round of the whole group: a probe of three cycles faster (a third of the work), so
        # per second both the requests and what they ask grow with the rounds
        per_round = {api: round((three["items_per_s"].get(api, 0) / three["cycles_per_s"] * 3)
                                / (v / one["cycles_per_s"]), 2)
                     for api, v in one["items_per_s"].items() if v and one["cycles_per_s"] and three["cycles_per_s"]}
        figures["requests"]["items_per_group_round_three_over_one"] = per_round
        print("3 probes / 1 probe, what the requests ask per round of the group:", per_round, flush=True)
        rounds = {api: round((three["requests_per_s"]["probing"].get(api, 0) / three["cycles_per_s"] * 3)
                             / (v / one["cycles_per_s"]), 2)
                  for api, v in one["requests_per_s"]["probing"].items() if v and three["cycles_per_s"]}
        rounds["METADATA_ALL_TOPICS"] = round((three["metadata_all_topics_per_s"] / three["cycles_per_s"] * 3)
                                              / (one["metadata_all_topics_per_s"] / one["cycles_per_s"]), 2)
        figures["requests"]["requests_per_group_round_three_over_one"] = rounds
        print("3 probes / 1 probe, requests per round of the group:", rounds, flush=True)

        handovers: list[float] = []
        for k in range(args.kills):
            live = [n for n in names if probes[n].proc.poll() is None]
            wait_for(lambda live=live: covered(live, int(time.time() * 1000) - 1500), timeout=120,
                     what="every shard held by the live probes")
            victim = live[k % len(live)]
            mine = holdings(live, int(time.time() * 1000) - 1500)[victim]
            lost = {tp for tp in parts if _shard(tp[0]) in mine}
            killed_at = int(time.time() * 1000)
            probes[victim].signal(signal.SIGKILL)

            def taken(lost=lost, victim=victim, killed_at=killed_at) -> Optional[int]:
                first: dict[tuple, int] = {}
                for e in list(tail.events):
                    if e.type == "partition_offsets" and e.source != victim and e.observed_at >= killed_at:
                        tp = (e.data.topic, e.data.partition)
                        if tp in lost:
                            first.setdefault(tp, e.observed_at)
                return max(first.values()) if len(first) == len(lost) else None
            at = wait_for(taken, timeout=90, what=f"{victim}'s partitions observed by the others")
            handovers.append((at - killed_at) / 1000)
            print(f"kill {k + 1}: {victim} ({len(mine)} shards, {len(lost)} partitions) observed again after "
                  f"{handovers[-1]:.1f} s", flush=True)
            probes.pop(victim).stop()
            names = [n for n in names if n != victim] + [f"hb-{3 + k}"]
            add(names[-1], "bench-three")
        figures["handover_s"] = {"samples": handovers, "p50": round(statistics.median(handovers), 2),
                                 "p95": round(_p95(handovers), 2)}
        print(f"handover: p50 {figures['handover_s']['p50']} s, p95 {figures['handover_s']['p95']} s", flush=True)
    path = report.write(args.out, "ha", **figures)
    print(f"wrote {path}")
    return 0


def _shard(topic: str) -> int:
    from monitor.shards import shard_of

    return shard_of(topic, SHARDS)


def _p95(xs: list[float]) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(0.95 * len(ys)) - 1))]


if __name__ == "__main__":
    sys.exit(main())
