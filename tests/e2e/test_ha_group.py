"""Three probes of one HA group on the shared real cluster, to the job's /metrics (issue 49).

    shared KRaft cluster: 16 topics of 2 partitions (one in each shard), a consumer group committing on them; the
      events topic, and the HA group's shard topic and consumer group, on the same cluster
      -> 3 probe processes (--ha-group, 16 shards, every second; no supervisor: each process is
         the member, as a host would be)
      -> the Spark job (trigger 1 s) -> /metrics

In order, on one running job:
- steady state: every shard held once, every partition observed by one probe only, about once a
  second; the job counts 3 probes;
- SIGKILL one: its shards are observed again within the session timeout (10 s), a heartbeat and an
  interval, and no alert opens (ShardUnobserved's setting, 20 s here, is beaten; no SourceSilent or
  MetadataStale for the dead member);
- a new probe joins: shards move to it, no partition goes unobserved longer than an interval or two;
- SIGSTOP one past the session timeout, then SIGCONT: the round it resumes into sends its old
  epochs, which the job counts as fenced on /metrics; nothing opens;
- all but one leave (SIGTERM): the last holds every shard and keeps its 1 s interval;
- the group's coordinator paused: the probe's session runs out and it drops every shard, then
  rejoins once the controller fenced the broker and another coordinates the group; every
  partition is observed again while the broker is still paused (docs/ha.md has the figures).
"""

from __future__ import annotations

import json
import signal
import time
from contextlib import ExitStack
from typing import Optional

import pytest
from confluent_kafka.admin import AdminClient

from monitor.shards import shard_of
from streaming.job import JobConfig, start, stop_query
from streaming.sinks.exporter import Exporter
from tests.conftest import unique, wait_for
from tests.support.ha_probes import ProbeProcess
from tests.support.kafka_cluster import in_sync
from tests.support.kraft_stack import Committer, Tail, metric_samples
from tests.support.real_cluster import MultiTopicWriter
from tests.support.request_log import RequestWindow

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

SHARDS, PARTS, SESSION_S = 16, 2, 10.0
#: alerts that would mean a probe's coming or going misled the job (the shared cluster's own broker
#: alerts are left out: other tests may pause its brokers meanwhile)
WATCHED = ("ShardUnobserved", "SourceSilent", "MetadataStale", "PartitionUnobserved", "IsrShrink", "UnderReplicated",
           "OfflinePartition", "LeaderChanged", "HighWatermarkStalled", "ConsumerLagStatus", "ConsumerLagHigh",
           "GroupEmptyWithLag", "RebalanceStorm", "RebalanceStuck", "PartitionCountChanged")


def group_coordinator(bootstrap: str, gid: str) -> int:
    """The broker coordinating group ``gid``: the leader of its ``__consumer_offsets`` partition,
    abs(Java's String.hashCode of the id) modulo the topic's partitions, as Kafka places it."""
    h, units = 0, gid.encode("utf-16-be")
    for i in range(0, len(units), 2):  # Java hashes UTF-16 code units
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics("__consumer_offsets", timeout=30)
    parts = md.topics["__consumer_offsets"].partitions
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return parts[(abs(signed) if signed != -(1 << 31) else 0) % len(parts)].leader  # Kafka's Utils.abs


def test_three_probes_share_a_cluster_and_hand_over_without_a_gap(spark, kafka_cluster, tmp_path):
    kc = kafka_cluster
    prefix = unique("ha")
    label, group = f"{prefix}-cluster", prefix
    # one topic in every shard: whatever shards a probe holds, it observes partitions every round.
    # A probe holding only empty shards sends nothing of a shard, and pausing it leaves nothing to
    # fence: with 12 topics some shards were empty, the likely cause of x20's nothing fenced
    topics: list[str] = []
    covered: set[int] = set()
    for i in range(10_000):
        if shard_of(f"{prefix}.{i}", SHARDS) not in covered:
            covered.add(shard_of(f"{prefix}.{i}", SHARDS))
            topics.append(f"{prefix}.{i}")
        if len(covered) == SHARDS:
            break
    for t in topics:
        kc.create_topic(t, partitions=PARTS)
    events, alerts = f"{prefix}.events", f"{prefix}.alerts"
    kc.create_topic(events, partitions=3)
    kc.create_topic(alerts, partitions=1)
    parts = {(t, p) for t in topics for p in range(PARTS)}
    with ExitStack() as s:
        exporter = Exporter()
        port = exporter.serve(0)
        s.callback(exporter.shutdown)
        url = f"http://127.0.0.1:{port}/metrics"
        cfg = JobConfig(bootstrap_servers=kc.bootstrap_servers, checkpoint_dir=str(tmp_path / "ckpt"),
                        events_topic=events, alerts_topic=alerts, trigger_s=1, buckets=2, metrics_port=port,
                        rules={"source": {"shard_unobserved_after_ms": 20_000, "silence_grace_ms": 5_000},
                               "client": {"silence_grace_ms": 5_000}})
        query = start(spark, cfg, exporter, query_name="ha-group")
        s.callback(stop_query, query)
        tail = Tail(kc.bootstrap_servers, events, ("partition_offsets", "partition_metadata", "group_offsets",
                                                   "group_state", "ha_member", "heartbeat", "metadata_refresh"),
                    (alerts,),
                    name=unique("ha-tail"))
        tail.start()
        s.callback(tail.stop)
        probes: dict[str, ProbeProcess] = {}

        def add(name: str, *extra: str) -> ProbeProcess:
            p = probes[name] = ProbeProcess(name, kc.bootstrap_servers, events, group, SHARDS, f"^{prefix}\\.",
                                            f"^{prefix}-", label, tmp_path,
                                            ("--quorum-interval", "2", "--log-dirs-interval", "0",
                                             "--transactions-interval", "0", "--elr-interval", "0",
                                             "-X", f"client.id={name}", *extra))  # (the brokers' request log names it)
            s.callback(p.stop)
            return p

        def value(name: str, **labels: str) -> Optional[float]:
            for n, lab, v in metric_samples(url):
                if n == f"kafka_monitor_{name}" and all(lab.get(k) == x for k, x in labels.items()):
                    return v
            return None

        def held() -> dict[str, float]:
            return {lab["probe"]: v for n, lab, v in metric_samples(url)
                    if n == "kafka_monitor_ha_probe_shards" and lab.get("source") == f"ha:{group}"}

        def opened() -> list[dict]:
            return [r for r in tail.records if r.get("action") == "open" and r.get("alert") in WATCHED
                    and r.get("labels", {}).get("cluster") == label]

        def observers(since_ms: int, until_ms: Optional[int] = None) -> dict[tuple[str, int], list[str]]:
            out: dict[tuple[str, int], list[str]] = {}
            for e in list(tail.events):
                if e.type == "partition_offsets" and e.observed_at >= since_ms and (
                        until_ms is None or e.observed_at < until_ms) and (e.data.topic, e.data.partition) in parts:
                    out.setdefault((e.data.topic, e.data.partition), []).append(e.source)
            return out

        def shards_of(name: str) -> set[int]:
            last = [e for e in list(tail.events) if e.type == "ha_member" and e.source == name]
            return set(last[-1].data.held) if last else set()

        writer = MultiTopicWriter(kc.bootstrap_servers, topics[:2]).start()
        s.callback(writer.stop)
        app = Committer(kc.bootstrap_servers, topic=topics[0], group=f"{prefix}-app")
        app.start()
        s.callback(app.stop)
        # the probe to be paused keeps its events for 2 s before sending them (a producer that batches,
        # or a slow events cluster): a pause then always holds some, sent on SIGCONT under the epochs
        # of before. librdkafka notices the lost session as soon as the process runs again, before
        # the probe's next round, and a round paused while waiting for answers sends nothing (its
        # deadline passed): what a resumed probe sends under old epochs is what it had queued.
        paused = "p1"
        add("p0")
        add(paused, "-X", "linger.ms=2000")
        add("p2")

        # -- steady state ------------------------------------------------------------------------
        ha = {"cluster": label, "source": f"ha:{group}"}
        wait_for(lambda: value("ha_probes", **ha) == 3 and sum(held().values()) == SHARDS and len(held()) == 3,
                 timeout=120, what="the job counting 3 probes holding the 16 shards between them")
        requests = RequestWindow(kc).open() if kc.managed else None
        t0 = int(time.time() * 1000)
        time.sleep(8)  # the window's events all read (the paused-to-be probe sends its 2 s late)
        if requests is not None:
            requests.close()
        window = observers(t0 + 500, t0 + 5500)
        assert set(window) == parts, parts - set(window)
        # each partition by one probe, once in each of its cycles (a cycle ends with its heartbeat;
        # on 2 busy cores a round's metadata refresh can make a cycle start late: the count, not the clock)
        cycles = {n: sorted({e.observed_at for e in list(tail.events) if e.type == "heartbeat" and e.source == n
                             and t0 + 500 <= e.observed_at < t0 + 5500}) for n in probes}  # each sent twice
        for tp, who in window.items():
            assert len(set(who)) == 1, (tp, who)
            assert 3 <= len(who) and abs(len(who) - len(cycles[who[0]])) <= 1, (tp, who, cycles[who[0]])
        mine = {n: {tp for tp, who in window.items() if who[0] == n} for n in probes}
        for n, tps in mine.items():
            assert {shard_of(t, SHARDS) for t, _ in tps} <= shards_of(n), n
        if requests is not None:  # what each asked of the brokers in those 8 s: its own, nothing twice
            asked = requests.asked(list(probes))
            holder = next(n for n in probes if 0 in shards_of(n))
            print("requests per probe:", {n: dict(a.requests) for n, a in asked.items()})
            for n, a in asked.items():  # (the events and alerts topics match the probes' pattern too)
                own = {t for t in (*topics, events, alerts) if shard_of(t, SHARDS) in shards_of(n)}
                assert a.list_offsets and {t for t, _ in a.list_offsets} <= own, (n, a.list_offsets, own)
                assert a.metadata_named <= own, (n, a.metadata_named, own)
                if n == holder:  # the whole metadata at every refresh (its broker states count every partition)
                    assert a.metadata_whole >= 3 and not a.metadata_named, (n, a.metadata_whole)
                else:  # its own topics by name; the whole listing once a minute at most
                    assert a.metadata_named and a.metadata_whole <= 1, (n, a.metadata_whole, a.metadata_named)
                    assert not a.requests["DESCRIBE_QUORUM"] and a.requests["LIST_GROUPS"] <= 1, (n, a.requests)
                    assert a.broker_configs <= 1, (n, a.broker_configs)  # the brokers' min ISR default: the same
            for x, y in ((x, y) for x in asked for y in asked if x < y):
                assert not asked[x].list_offsets & asked[y].list_offsets, (x, y)
                assert not asked[x].metadata_named & asked[y].metadata_named, (x, y)
                assert not asked[x].groups_described & asked[y].groups_described, (x, y)
            assert set().union(*(a.list_offsets for a in asked.values())) >= parts

        # -- SIGKILL one --------------------------------------------------------------------------
        victim = max(("p0", "p2"), key=lambda n: len(mine[n]))
        lost = mine[victim]
        killed_at = int(time.time() * 1000)
        probes[victim].signal(signal.SIGKILL)

        def taken_over() -> Optional[dict]:
            seen = observers(killed_at)
            firsts = {}
            for e in list(tail.events):
                tp = (getattr(e.data, "topic", None), getattr(e.data, "partition", None))
                if e.type == "partition_offsets" and tp in lost and e.source != victim and e.observed_at >= killed_at:
                    firsts.setdefault(tp, e.observed_at)
            return firsts if set(firsts) == lost and all(tp in seen for tp in lost) else None
        firsts = wait_for(taken_over, timeout=60, what=f"{victim}'s partitions observed by the others")
        handover_s = (max(firsts.values()) - killed_at) / 1000
        print(f"SIGKILL {victim}: its {len(lost)} partitions observed again after {handover_s:.1f} s (max)")
        assert handover_s <= SESSION_S + 8, handover_s  # + a heartbeat, the rebalance and a round (11-13 s here)
        wait_for(lambda: value("ha_probes", **ha) == 2 and victim not in held(), timeout=30,
                 what="the job counting 2 probes")
        time.sleep(max(0.0, killed_at / 1000 + 25 - time.time()))  # past SourceSilent's and MetadataStale's limits
        assert not opened(), opened()
        assert value("ha_shards_unobserved", **ha) == 0

        # -- a new probe joins --------------------------------------------------------------------
        joined_at = int(time.time() * 1000)
        add("p3")
        wait_for(lambda: held().get("p3", 0) >= 3 and sum(held().values()) == SHARDS, timeout=60,
                 what="the newcomer holding a share")
        time.sleep(3)
        after = observers(joined_at)
        assert set(after) == parts
        gaps = []
        for tp in parts:
            ts = sorted(e.observed_at for e in list(tail.events) if e.type == "partition_offsets"
                        and (e.data.topic, e.data.partition) == tp and e.observed_at >= joined_at - 1000)
            gaps.append(max(b - a for a, b in zip(ts, ts[1:])))
        print(f"a probe joins: the longest gap between two observations of a partition {max(gaps) / 1000:.1f} s")
        # a shard moves between two rounds, not through a silence (one would last the session, 10 s;
        # 4.0 s measured beside a loaded worker)
        assert max(gaps) <= 6000, max(gaps)
        assert not opened(), opened()

        # -- SIGSTOP one past the session timeout -------------------------------------------------
        def stale_after(mark: int) -> list:
            """The paused probe's events the tail read after ``mark`` under an epoch of a shard
            that a newer one had superseded before it."""
            events = list(tail.events)
            top: dict[int, int] = {}
            for x in events[:mark]:
                if x.epoch is not None:
                    top[x.shard] = max(top.get(x.shard, -1), x.epoch)
            return [e for e in events[mark:] if e.source == paused and e.epoch is not None
                    and e.epoch < top.get(e.shard, -1)]

        # A pause that catches the probe with nothing queued sends nothing under old epochs, and
        # there is then nothing to fence: the tail tells, and the pause is made again (at most 3)
        late: list = []
        for attempt in range(1, 4):
            before = value("events_dropped_total", reason="fenced") or 0  # a former owner's last events can
            probes[paused].signal(signal.SIGSTOP)                          # share a batch with the new owner's
            time.sleep(SESSION_S + 4)
            wait_for(lambda: paused not in held(), timeout=30, what=f"{paused}'s shards taken by the others")
            cont_mark = len(tail.events)
            probes[paused].signal(signal.SIGCONT)
            deadline = time.monotonic() + 15  # what it had queued goes out as soon as it runs
            while not late and time.monotonic() < deadline:
                time.sleep(0.5)
                late = stale_after(cont_mark)
            wait_for(lambda: held().get(paused, 0) >= 3 and sum(held().values()) == SHARDS, timeout=60,
                     what=f"{paused} back in the group with a share")
            if late:
                break
            print(f"SIGSTOP {paused} (pause {attempt}): it sent nothing under a superseded epoch; pausing again")
        assert late, f"{paused} sent nothing under a superseded epoch after 3 pauses (linger.ms=2000 should hold some)"
        wait_for(lambda: (value("events_dropped_total", reason="fenced") or 0) > before, timeout=30,
                 what=f"the {len(late)} events of {paused}'s old epochs (the tail read them) fenced by the job")
        fenced = value("events_dropped_total", reason="fenced") or 0
        newest: dict[int, int] = {}
        for e in list(tail.events):
            if e.epoch is not None:
                newest[e.shard] = max(newest.get(e.shard, -1), e.epoch)
        late = stale_after(cont_mark)
        superseded = [e for e in list(tail.events) if e.epoch is not None and e.epoch < newest[e.shard]]
        print(f"SIGSTOP {paused} past the session timeout: {fenced - before:.0f} events fenced after SIGCONT "
              f"(the tail read {len(late)} of its events with a superseded epoch after it)")
        # the job drops only what had a superseded epoch (its own, or one in the same micro-batch)
        assert before < fenced <= len(superseded), (before, fenced, len(superseded))
        assert not opened(), opened()

        # -- all but one leave --------------------------------------------------------------------
        last = "p3"
        for n, p in probes.items():
            if n not in (last, victim):
                p.signal(signal.SIGTERM)
        wait_for(lambda: held() == {last: SHARDS}, timeout=60, what=f"{last} holding every shard")
        # the window starts once it has observed every partition: its first round with the others'
        # shards is not its interval (CI: partitions unobserved 4 s from when the job saw it hold all)
        t_held = int(time.time() * 1000)
        wait_for(lambda: set(observers(t_held)) == parts, timeout=60, interval=0.5,
                 what=f"{last} observing every partition")
        t1 = int(time.time() * 1000)
        # the window's events all read: the tail has every partition's observations past its end
        # (a fixed 5-s sleep once left the last second unread on a loaded machine)
        wait_for(lambda: set(observers(t1 + 5000)) == parts, timeout=60, interval=0.5,
                 what="the tail past the window of the last probe alone")
        alone = observers(t1 + 1000, t1 + 5000)
        beats = [e for e in list(tail.events) if e.type == "heartbeat" and e.source == last and e.observed_at >= t1]
        assert set(alone) == parts and all(set(w) == {last} and len(w) >= 3 for w in alone.values()), (
            {tp: w for tp, w in alone.items() if set(w) != {last} or len(w) < 3} or parts - set(alone),
            [(e.observed_at - t1, e.data.cycle_duration_ms) for e in beats])
        assert beats and max(e.data.cycle_duration_ms for e in beats) < 1000, [e.data.cycle_duration_ms for e in beats]
        assert not opened(), opened()

        # -- the group's coordinator paused -------------------------------------------------------
        # The group lives on the events cluster, here the watched one. Its coordinator paused, the
        # member cannot heartbeat: librdkafka ends the session on its side after the session timeout
        # and the probe drops every shard; it rejoins once the controller has fenced the broker
        # (broker.session.timeout.ms, 8 s here) and another broker took the group over.
        coordinator = group_coordinator(kc.bootstrap_servers, f"kafka-monitor-ha-{group}")
        paused_at = int(time.time() * 1000)
        kc.pause_broker(coordinator)
        try:
            def report_at(since: int, n: int) -> Optional[int]:
                return next((e.observed_at for e in list(tail.events) if e.type == "ha_member" and e.source == last
                             and e.observed_at >= since and len(e.data.held) == n), None)
            lost_at = wait_for(lambda: report_at(paused_at, 0), timeout=60, what=f"{last} losing its shards")
            back_at = wait_for(lambda: report_at(lost_at, SHARDS), timeout=90, what=f"{last} holding them again")
            # the events of the partitions of the events topic that the paused broker led wait for the
            # producer's request timeout (30 s) before going to their new leader
            seen_at = wait_for(lambda: set(observers(back_at)) == parts and int(time.time() * 1000), timeout=90,
                               what="every partition observed again, the broker still paused")
            ts = sorted({e.observed_at for e in list(tail.events) if e.type == "partition_offsets"
                         and e.source == last and e.observed_at >= paused_at - 2000})
            gap = max(b - a for a, b in zip(ts, ts[1:]))
            print(f"coordinator (broker {coordinator}) paused: {last} lost its shards after "
                  f"{(lost_at - paused_at) / 1000:.1f} s, held them again after {(back_at - paused_at) / 1000:.1f} s; "
                  f"the longest gap between two observations of a partition {gap / 1000:.1f} s; every partition's "
                  f"observation read back {(seen_at - paused_at) / 1000:.1f} s after the pause")
            assert lost_at - paused_at >= SESSION_S * 1000 - 2000  # its session ran out, not sooner
        finally:
            kc.resume_broker(coordinator)
        wait_for(lambda: all(in_sync(kc, t) for t in topics), timeout=120, what="the cluster in sync again")
        for r in tail.records:
            if r.get("action") == "open" and r.get("labels", {}).get("cluster") == label:
                print("alert opened:", json.dumps(r)[:300])
