"""The canary on the real Apache Kafka cluster (3 brokers): its topic's layout, its writes read
back, nothing lost across a broker's controlled restart, a paused follower seen in its produce
latency.  Each test runs its own canary on its own topic; faults are undone by the ``cluster``
fixture of test_kafka_cluster."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

from monitor.canary import Canary, CanaryConfig, WritesHeld
from monitor.contract import CANARY_LATENCY_BOUNDS_MS
from tests.conftest import unique, wait_for
from tests.integration.test_kafka_cluster import cluster, needs_processes  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


@contextmanager
def running_canary(kafka_cluster, **kw):
    reports: list = []
    cfg = CanaryConfig(**{"topic": unique("canary"), "interval_s": 0.1, "report_interval_s": 0.5,
                          "layout_check_s": 2.0, "lost_after_s": 20.0, **kw})
    canary = Canary(cfg, {"bootstrap.servers": kafka_cluster.bootstrap_servers}, emit=reports.append)
    stop = threading.Event()
    t = threading.Thread(target=canary.run, args=(stop,), daemon=True)
    t.start()
    try:
        yield canary, reports
    finally:
        stop.set()
        t.join(15)
    assert canary.failed is None, canary.failed


def isr(kc, topic: str, partition: int):
    """The partition's ISR from one Metadata response; None when it did not come (a paused broker)."""
    try:
        return kc.partitions(topic)[partition][2]
    except Exception:
        return None


def latest(reports: list) -> dict:
    """The latest report of each partition (the canary's WritesHeld verdicts left out)."""
    out: dict = {}
    for r in reports:
        if not isinstance(r, WritesHeld):
            out[r.partition] = r
    return out


def settled(canary, older_than: float = 2.0) -> bool:
    """Every write older than ``older_than`` s acknowledged or failed, and every acknowledged one
    read back (the canary keeps writing: the latest few are always on their way)."""
    now = time.monotonic()
    for st in list(canary.stats.parts.values()):
        for d in (dict(st.unacked), dict(st.unread)):
            if d and now - min(d.values()) > older_than:
                return False
    return True


def describe(canary) -> dict:
    now = time.monotonic()
    return {p: (st.sent, st.acked, st.received, len(st.unacked), len(st.unread),
                round(now - min(st.unacked.values()), 1) if st.unacked else None,
                round(now - min(st.unread.values()), 1) if st.unread else None, sorted(st.unread)[:5], st.max_seen,
                st.errors)
            for p, st in list(canary.stats.parts.items())}


def test_one_partition_led_by_each_broker_and_every_write_read_back_once(cluster):  # noqa: F811
    # the layout checked once a minute: the new topic's leaders must come from the check right after creation
    with running_canary(cluster, layout_check_s=60.0) as (canary, reports):
        wait_for(lambda: len(canary.partitions) == 3 and sum(st.received for st in canary.stats.parts.values()) > 60,
                 60, what="canary writes read back on 3 partitions")
        wait_for(lambda: len(last := latest(reports)) == 3 and None not in {r.leader for r in last.values()},
                 15, what="reports naming each partition's leader")
    parts = cluster.partitions(canary.cfg.topic)
    assert sorted(p[1][0] for p in parts.values()) == sorted(cluster.broker_ids)
    assert all(len(p[1]) == 3 for p in parts.values())
    last = latest(reports)
    assert sorted(last) == [0, 1, 2]
    for p, r in last.items():
        assert r.leader == parts[p][1][0]
        assert r.sent >= r.acked > 0
        assert r.received <= r.acked + r.pending
        assert (r.lost, r.duplicated, r.out_of_order, r.errors) == (0, 0, 0, [])
        assert sum(r.produce_latency_counts) == r.acked
        assert sum(r.e2e_latency_counts) == r.received
        assert len(r.produce_latency_counts) == len(CANARY_LATENCY_BOUNDS_MS) + 1
        assert 0 < r.produce_latency_sum_ms / r.acked < 1000  # healthy: milliseconds, not seconds
    print(f"\n[canary] healthy: produce p-mean {sum(r.produce_latency_sum_ms for r in last.values()) / sum(r.acked for r in last.values()):.1f} ms, "
          f"e2e mean {sum(r.e2e_latency_sum_ms for r in last.values()) / sum(r.received for r in last.values()):.1f} ms "
          f"over {sum(r.acked for r in last.values())} writes; buckets {[r.produce_latency_counts for r in last.values()]}")


def test_nothing_lost_across_a_controlled_restart_and_leadership_comes_back(cluster):  # noqa: F811
    needs_processes(cluster)
    with running_canary(cluster) as (canary, reports):
        wait_for(lambda: len(canary.partitions) == 3 and all(st.received > 10 for st in canary.stats.parts.values()),
                 60, what="canary running on 3 partitions")
        victim = cluster.broker_ids[1]
        cluster.restart_broker(victim)
        sent_after = {p: st.sent for p, st in canary.stats.parts.items()}
        # leadership back on the restarted broker (the canary's preferred election), writes flowing there
        wait_for(lambda: (ps := cluster.partitions(canary.cfg.topic))
                 and all(p[0] == p[1][0] for p in ps.values()), 90,
                 what="every canary partition led by its preferred replica again")
        wait_for(lambda: all(st.sent > sent_after[p] + 20 for p, st in canary.stats.parts.items()), 30,
                 what="writes after the restart")
        try:
            wait_for(lambda: settled(canary), 60, what="every write acknowledged or failed, every ack read back")
        except AssertionError:
            raise AssertionError(describe(canary)) from None
        canary.report()
    last = latest(reports)
    for p, r in last.items():  # settled above: every write older than 2 s was read back
        assert r.lost == 0, f"partition {p}: {r}"
        assert r.received >= r.acked - 25, f"partition {p}: acked {r.acked}, read back {r.received}"
    print(f"\n[canary] restart of broker {victim}: sent {sum(r.sent for r in last.values())}, "
          f"acked {sum(r.acked for r in last.values())}, lost 0, duplicated {sum(r.duplicated for r in last.values())}, "
          f"errors {[(p, [(e.code, e.count) for e in r.errors]) for p, r in last.items() if r.errors]}")


def test_a_paused_follower_holds_acks_all_writes_until_it_leaves_the_isr(cluster):  # noqa: F811
    needs_processes(cluster)
    with running_canary(cluster) as (canary, reports):
        wait_for(lambda: len(canary.partitions) == 3 and all(st.received > 10 for st in canary.stats.parts.values()),
                 60, what="canary running on 3 partitions")
        parts = cluster.partitions(canary.cfg.topic)
        follower = parts[0][1][1]
        before = {p: list(st.produce.counts) for p, st in canary.stats.parts.items()}
        slow_at = CANARY_LATENCY_BOUNDS_MS.index(1000) + 1  # buckets above 1 s
        cluster.pause_broker(follower)
        try:
            wait_for(lambda: (got := isr(cluster, canary.cfg.topic, 0)) is not None and follower not in got, 30,
                     what=f"paused follower {follower} leaving partition 0's ISR")
            led = next(p for p, (_, replicas, _) in parts.items() if replicas[0] == follower)

            def slow() -> dict:
                return {p: sum(st.produce.counts[slow_at:]) - sum(before[p][slow_at:])
                        for p, st in canary.stats.parts.items()}
            # where the paused broker follows, writes wait for it until it is cut out of the ISR
            wait_for(lambda: all(n > 0 for p, n in slow().items() if p != led), 30,
                     what="writes acknowledged after more than 1 s where the paused broker follows")
            held = len(canary.stats.parts[led].unacked)  # its leader is the paused broker: nothing acked
            seen = slow()
        finally:
            cluster.resume_broker(follower)
    assert held > 5, held
    assert all(r.lost == 0 for r in latest(reports).values())
    print(f"\n[canary] paused follower {follower}: writes acknowledged after more than 1 s per partition {seen}, {held} held by the paused leader")
