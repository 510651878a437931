"""The real Apache Kafka cluster launcher (kafka_monitor.local.kafka_cluster): real processes, real faults.

Every fault is undone in a finally/fixture so later tests see 3 healthy brokers."""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource, ResourceType

from tests.conftest import unique, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


@pytest.fixture
def cluster(kafka_cluster):
    """The session cluster; afterwards every broker is running, resumed and registered again."""
    yield kafka_cluster
    if kafka_cluster.managed:
        kafka_cluster.restore(timeout=120)


def needs_processes(cluster) -> None:
    if not cluster.managed:
        pytest.skip("process faults need the cluster the tests start (KAFKA_MONITOR_TEST_KAFKA is set)")


def snapshot(cluster, topic: str, partition: int = 0):
    """(live broker ids, leader, replicas, isr) from ONE Metadata response, or None on timeout."""
    try:
        md = cluster.metadata(topic)
    except Exception:
        return None
    p = md.topics[topic].partitions.get(partition)
    if p is None:
        return None
    return set(md.brokers), p.leader, list(p.replicas), list(p.isrs)


@contextmanager
def writes_flowing(bootstrap: str, topic: str, every: float = 0.02):
    """Produce to partition 0 (acks=1) from a background thread until the block exits."""
    stop = threading.Event()
    sent = [0]

    def run():
        p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0, "log_level": 0})
        while not stop.is_set():
            try:
                p.produce(topic, value=b"x" * 100, partition=0)
                sent[0] += 1
            except BufferError:
                pass
            p.poll(every)
        p.flush(5)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield sent
    finally:
        stop.set()
        t.join(10)


def test_cluster_has_three_brokers_and_a_dedicated_active_controller(kafka_cluster):
    if kafka_cluster.managed:
        print(f"\n[kafka] cluster start took {kafka_cluster.start_seconds:.1f}s")
        assert kafka_cluster.live_brokers() == {1, 2, 3}
        assert kafka_cluster.active_controller() == kafka_cluster.controller_id == 100
        assert kafka_cluster.controller_bootstrap.startswith("127.0.0.1:")
        assert all(a.startswith("127.0.0.1:") for a in kafka_cluster.bootstrap_servers.split(","))
    else:
        assert len(kafka_cluster.live_brokers()) >= 3
        assert isinstance(kafka_cluster.active_controller(), int)  # DescribeQuorum through a broker


def test_paused_follower_leaves_isr_by_lag_and_returns_after_resume(cluster):
    needs_processes(cluster)
    topic = unique("isr")
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": 2})
    live, leader, replicas, isr = wait_for(lambda: snapshot(cluster, topic), 30, what="metadata")
    assert sorted(isr) == [1, 2, 3]
    follower = next(r for r in replicas if r != leader)
    with writes_flowing(cluster.bootstrap_servers, topic) as sent:
        wait_for(lambda: sent[0] > 20, 30, what="writes flowing")
        t0, t0_ms = time.monotonic(), time.time() * 1000
        cluster.pause_broker(follower)
        try:
            live, leader2, _, isr2 = wait_for(
                lambda: (s := snapshot(cluster, topic)) and follower not in s[3] and s, 30,
                what=f"paused follower {follower} leaving the ISR")
            observed = time.monotonic() - t0
            assert leader2 == leader
            assert sorted(isr2) == sorted(set(replicas) - {follower})
        finally:
            cluster.resume_broker(follower)
        wait_for(lambda: (s := snapshot(cluster, topic)) and follower in s[3], 60,
                 what=f"follower {follower} back in the ISR after SIGCONT")

    # ground truth from the controller's metadata log: the shrink record, and no fencing before it
    recs = cluster.dump_metadata_log()
    topic_id = next(r["data"]["topicId"] for r in recs if r["type"] == "TOPIC_RECORD" and r["data"]["name"] == topic)
    shrink = next(r for r in recs if r["type"] == "PARTITION_CHANGE_RECORD" and r["data"]["topicId"] == topic_id
                  and r["data"].get("isr") is not None and follower not in r["data"]["isr"])
    fenced = [r for r in recs if r["type"] == "BROKER_REGISTRATION_CHANGE_RECORD"
              and r["data"]["brokerId"] == follower and r["data"].get("fenced") == 1
              and t0_ms <= r["create_time"] <= shrink["create_time"]]
    print(f"\n[kafka] ISR shrink after SIGSTOP of follower {follower}: {shrink['create_time'] - t0_ms:.0f} ms "
          f"(metadata log), observed by polling after {observed:.1f}s "
          f"(replica.lag.time.max.ms=3000, broker.session.timeout.ms=8000)")
    assert not fenced, f"follower {follower} was fenced before it left the ISR by lag"
    assert "leader" not in shrink["data"] or shrink["data"]["leader"] == -2 or shrink["data"]["leader"] == leader


def test_stop_restart_and_preferred_election(cluster):
    needs_processes(cluster)
    topic = unique("lead")
    victim = 2
    t_start = time.time() * 1000
    cluster.create_topic(topic, config={"min.insync.replicas": 2}, replica_assignment=[[2, 3, 1]])
    assert wait_for(lambda: snapshot(cluster, topic), 30, what="metadata")[1] == victim

    t0 = time.monotonic()
    cluster.stop_broker(victim)
    print(f"\n[kafka] controlled shutdown of broker {victim}: {time.monotonic() - t0:.1f}s")
    assert not cluster.is_running(victim)
    live, leader, replicas, isr = wait_for(
        lambda: (s := snapshot(cluster, topic)) and s[1] not in (-1, victim) and victim not in s[0]
        and victim not in s[3] and s, 30, what=f"leadership away from stopped broker {victim}")
    assert replicas == [2, 3, 1] and leader == 3

    t0 = time.monotonic()
    cluster.restart_broker(victim)
    print(f"[kafka] restart of broker {victim} until registered: {time.monotonic() - t0:.1f}s")
    assert victim in cluster.live_brokers()
    _, leader, _, isr = wait_for(lambda: (s := snapshot(cluster, topic)) and victim in s[3] and s, 60,
                                 what=f"broker {victim} back in the ISR")
    assert leader == 3, "auto.leader.rebalance.enable=false: leadership must not move back on its own"

    assert cluster.elect_leaders("preferred", [(topic, 0)]) == {(topic, 0): None}
    wait_for(lambda: (s := snapshot(cluster, topic)) and s[1] == victim, 30,
             what="preferred replica leading again")

    # ground truth: the controller's metadata log has the topic and the leader changes, with CreateTime
    recs = cluster.dump_metadata_log()
    topic_id = next(r["data"]["topicId"] for r in recs
                    if r["type"] == "TOPIC_RECORD" and r["data"]["name"] == topic)
    changes = [r for r in recs if r["type"] == "PARTITION_CHANGE_RECORD" and r["data"]["topicId"] == topic_id]
    leaders = [r["data"]["leader"] for r in changes if "leader" in r["data"] and r["data"]["leader"] >= 0]
    assert 3 in leaders and leaders[-1] == victim
    assert all(r["create_time"] >= t_start - 5000 for r in changes)
    assert recs == sorted(recs, key=lambda r: r["offset"])


def test_killed_broker_is_fenced_after_session_timeout_and_comes_back(cluster):
    needs_processes(cluster)
    topic = unique("kill")
    victim = 3
    cluster.create_topic(topic, replica_assignment=[[3, 1, 2]])
    t0 = time.monotonic()
    cluster.kill_broker(victim)
    wait_for(lambda: (s := snapshot(cluster, topic)) and s[1] not in (-1, victim) and victim not in s[0] and s,
             30, what=f"leader away from killed broker {victim}")
    print(f"\n[kafka] SIGKILL -> leader moved (fenced): {time.monotonic() - t0:.1f}s")
    cluster.restart_broker(victim)
    wait_for(lambda: (s := snapshot(cluster, topic)) and victim in s[3], 60, what=f"broker {victim} back in the ISR")


def test_restore_names_and_undoes_the_faults_a_test_left(cluster):
    """What runs before every test on the run's cluster (tests/support/kafka_cluster.py): a paused
    broker fenced past its session, a killed one; both named, both back."""
    needs_processes(cluster)
    log = cluster.controllers[cluster.controller_id].dir / "server.log"
    before = log.stat().st_size  # earlier tests' fencings are in it too

    def new_lines() -> str:
        with open(log, "rb") as f:
            f.seek(before)
            return f.read().decode(errors="replace")
    cluster.pause_broker(2)
    try:
        # the controller says why (DescribeCluster is no test here: the client may be asking the paused broker)
        wait_for(lambda: re.search(r"Fencing broker 2 .*because its session has timed out", new_lines()),
                 30, interval=0.5, what="the controller fencing paused broker 2")
        assert any("Fencing broker 2" in ln for ln in cluster.fencings())
        cluster.kill_broker(3)
    finally:
        found = cluster.restore(timeout=120)
    assert "broker-2 was paused" in found and "broker-3 was not running (exit -9)" in found, found
    # restore() saw all three registered; one more DescribeCluster under a loaded CI machine once
    # outlasted the default 2 s ("Timed out waiting for controller")
    assert cluster.live_brokers(request_timeout=10) == {1, 2, 3}
    assert cluster.restore() == []


def test_add_partitions(cluster):
    topic = unique("grow")
    cluster.create_topic(topic, 1, 3)
    cluster.add_partitions(topic, 3)
    parts = cluster.partitions(topic)
    assert sorted(parts) == [0, 1, 2]
    assert all(leader >= 0 and len(reps) == 3 for leader, reps, _ in parts.values())


def test_reassign_and_throttle(cluster):
    topic = unique("move")
    src, dst = cluster.broker_ids[:2]
    cluster.create_topic(topic, replica_assignment=[[src]])
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
    for i in range(100):
        p.produce(topic, value=b"r%d" % i, partition=0)
    assert p.flush(10) == 0

    cluster.throttle(10_000_000, topic=topic)
    try:
        res = ConfigResource(ResourceType.BROKER, str(src))
        conf = cluster.admin().describe_configs([res])[res].result(30)
        assert conf["leader.replication.throttled.rate"].value == "10000000"
        tres = ConfigResource(ResourceType.TOPIC, topic)
        tconf = cluster.admin().describe_configs([tres])[tres].result(30)
        assert tconf["follower.replication.throttled.replicas"].value == "*"
        cluster.reassign(topic, 0, [dst])
    finally:
        cluster.clear_throttle(topic=topic)
    leader, replicas, isr = cluster.partitions(topic)[0]
    assert (leader, replicas, isr) == (dst, [dst], [dst])
    conf = cluster.admin().describe_configs([res])[res].result(30)
    entry = conf.get("leader.replication.throttled.rate")
    assert entry is None or entry.value != "10000000"
